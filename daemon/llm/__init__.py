"""The LLM runner: a WAKE runs the model with the agent's tools (docs/llm.md).

* :mod:`daemon.llm.conversation` -- the Anthropic and OpenAI conversations
* :mod:`daemon.llm.prompt` -- AGENT.md and the rendered wake context
* :mod:`daemon.llm.runner` -- the tool loop under a deadline, usage and cost
"""
