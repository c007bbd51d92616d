"""The ``marketwake`` command line."""
