"""A sandbox worker loads only what it runs: not the parent's pool, logging or async
stacks (they once doubled its start time and its memory, per agent)."""

from __future__ import annotations

import json
import subprocess
import sys

from hooks_runtime.process import WORKER_ENV, worker_sys_path

PROBE = r"""
import json, sys
sys.path[:0] = json.loads(sys.argv[1])
import hooks_runtime.worker
print(json.dumps(sorted(sys.modules)))
"""


def test_the_worker_imports_no_parent_stack() -> None:
    proc = subprocess.run(
        [sys.executable, "-I", "-S", "-c", PROBE, json.dumps(worker_sys_path())],
        capture_output=True,
        env=WORKER_ENV,
        timeout=30,
        check=True,
    )
    loaded = {m.split(".")[0] for m in json.loads(proc.stdout)}
    for heavy in ("structlog", "anyio", "asyncio", "aiohttp", "numpy", "rich"):
        assert heavy not in loaded, f"the worker imports {heavy}"
    mine = {m for m in json.loads(proc.stdout) if m.startswith("hooks_runtime.")}
    assert "hooks_runtime.pool" not in mine and "hooks_runtime.breaker" not in mine
    assert "RestrictedPython" in loaded and "msgspec" in loaded  # what it does run
