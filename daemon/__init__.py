"""marketwake: the daemon that watches markets for LLM trading agents."""

__version__ = "0.1.0"
