"""Fixtures for the sandbox suite: one real worker pool per module, plus the sentinels.

Sentinels (research/sandbox.md §3): a file that must never appear, a loopback
listener that must never see a connection, and a secret in the daemon's
environment that must never show up in any result, error or output.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from hooks_runtime import HookResult, SandboxConfig, WorkerPool, open_worker_pool
from hooks_runtime.process import WorkerProcess
from hooks_runtime.protocol import Batch, decode_to_worker

SECRET_NAME = "HOOK_SANDBOX_CANARY_SECRET"
SECRET_VALUE = "s3cr3t-canary-7f1c2a"

# Budgets short enough to keep the timeout cases fast, long enough that a legitimate hook
# on a loaded 2-core CI box never overruns. Hooks are compiled before timing-sensitive runs.
TEST_CONFIG = SandboxConfig(timeout_ms=400, compile_timeout_ms=2000, spare_workers=1)


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    """Module scope, so one pool serves every case of a module."""
    return "asyncio"


@pytest.fixture
def sent_batches(monkeypatch: pytest.MonkeyPatch) -> list[Batch]:
    """Every Batch the pool sends to a worker from now on, decoded from the wire."""
    seen: list[Batch] = []
    send = WorkerProcess.send

    async def spy(self: WorkerProcess, data: bytes, seconds: float = 10.0) -> None:
        msg = decode_to_worker(data[4:])
        if isinstance(msg, Batch):
            seen.append(msg)
        await send(self, data, seconds)

    monkeypatch.setattr(WorkerProcess, "send", spy)
    return seen


@dataclass
class Sentinels:
    """What a hostile hook must never touch."""

    file: Path
    port: int
    connections: list[tuple[str, int]] = field(default_factory=list)

    def check(self, results: list[HookResult]) -> None:
        """No file, no connection, no secret in anything a hook produced."""
        assert not self.file.exists(), "a hook created the sentinel file"
        assert self.connections == [], f"a hook connected to the listener: {self.connections}"
        for r in results:
            text = f"{r.decision} {r.error} {r.output}"
            assert SECRET_VALUE not in text, f"secret leaked by {r.hook_id}"


@pytest.fixture(scope="module")
def sentinels(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sentinels]:
    """A sentinel path, a loopback listener recording connections, and the env secret."""
    path = tmp_path_factory.mktemp("sentinel") / "hook_sandbox_pwned"
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    s = Sentinels(path, srv.getsockname()[1])

    def accept() -> None:
        while True:
            try:
                conn, addr = srv.accept()
            except OSError:
                return
            s.connections.append(addr)
            conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    old = os.environ.get(SECRET_NAME)
    os.environ[SECRET_NAME] = SECRET_VALUE
    try:
        yield s
    finally:
        srv.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        srv.close()
        thread.join(timeout=5)
        if old is None:
            os.environ.pop(SECRET_NAME, None)
        else:
            os.environ[SECRET_NAME] = old


@pytest.fixture(scope="module")
async def pool(sentinels: Sentinels) -> AsyncIterator[WorkerPool]:
    """A pool started after the secret is in the environment (so it could leak)."""
    async with open_worker_pool(TEST_CONFIG) as p:
        yield p
