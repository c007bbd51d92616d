"""What a start loads: a daemon that runs no LLM agent and serves no MCP does not
load the tools' RAG stack (numpy among it); the first run that needs the tools
does (the CLI's quick commands: tests/test_cli.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def loaded(code: str) -> set[str]:
    """The top-level modules loaded once ``code`` ran in a fresh interpreter."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return {m.split(".")[0] for m in json.loads(out.splitlines()[-1])}


def test_the_daemon_loads_the_tools_stack_only_when_a_run_needs_it() -> None:
    assert "numpy" not in loaded("import daemon.app, daemon.cli.run, daemon.agents.pipeline")
    used = loaded(
        "from daemon.llm.runner import RegistryToolBox\n"
        "from daemon.tools import registry\n"
        "from daemon.tools.context import ToolContext\n"
        "box = RegistryToolBox(registry, ToolContext())\n"
        "print(sorted(t.name for t in box.registry))"
    )
    assert "numpy" in used


def test_a_backtest_loads_no_network_client() -> None:
    """A replay's daemon (and the backtest command around it) imports neither the
    HTTP nor the WebSocket client: ~0.35 s of every backtest's start went to them
    and to the TLS contexts their users built. A live feed's section loads its own."""
    code = "import daemon.app, daemon.backtest.run, daemon.cli.backtest, daemon.agents.pipeline"
    assert not {"aiohttp", "websockets", "httpx"} & loaded(code)
    live = loaded(
        "from daemon.app import build_feeds\n"
        "from daemon.config import parse\n"
        "build_feeds(parse('[feeds.candles]\\nenabled = true\\n', 'test'))"
    )
    assert "aiohttp" in live


def test_an_llm_agent_loads_the_tools_as_it_loads_not_at_its_first_wake() -> None:
    """The import (about 0.3 s) happens when the agent's runner is built, so the first
    wake, when the market is moving, does not wait for it."""
    code = (
        "import msgspec\n"
        "from daemon.llm.runner import RegistryToolBox\n"
        "from daemon.tools import registry\n"
        "from daemon.llm.runner import LlmRunner\n"
        "from daemon.tools.context import ToolContext\n"
        "from daemon.wake.policy import RunnerConfig\n"
        "box = RegistryToolBox(registry, ToolContext())\n"
        "import sys; assert 'numpy' not in sys.modules\n"
        "cfg = msgspec.convert({'kind': 'llm', 'provider': 'openai', 'model': 'm',\n"
        "                       'base_url': 'http://127.0.0.1:9/v1'}, RunnerConfig)\n"
        "LlmRunner(cfg, tools=box)\n"
    )
    assert "numpy" in loaded(code)
