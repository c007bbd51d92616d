"""One agent's problem stays that agent's: the daemon keeps serving the others."""

from __future__ import annotations

from pathlib import Path

import anyio
import msgspec
import pytest

from daemon.agents.dispatcher import Dispatcher
from daemon.agents.pipeline import open_agents
from daemon.config import Config
from daemon.service import Service
from tests.agents.test_pipeline import WAKE_EVERY, PacedFeed, audit, candle

BIG_DATA = """
def evaluate(event, state):
    return {"decision": "IGNORE", "reason": "big", "data": {"blob": "x" * 60000}}
"""


def agents_dir(root: Path, agents: dict[str, dict[str, str]]) -> Path:
    base = root / "agents"
    for agent_id, hooks in agents.items():
        (base / agent_id / "hooks").mkdir(parents=True)
        (base / agent_id / "agent.toml").write_text("")
        for name, src in hooks.items():
            (base / agent_id / "hooks" / name).write_text(src)
    return base


def config(root: Path, agents: Path, **sandbox: int) -> Config:
    return msgspec.convert(
        {
            "daemon": {"state_dir": str(root / "state")},
            "hooks": {"agents_dir": str(agents), "sandbox": sandbox},
        },
        Config,
    )


async def test_oversized_request_is_an_error_for_that_agent_only(tmp_path: Path) -> None:
    """Hooks returning big ``data`` grow lastOutputs past the frame cap: that agent's
    hooks get an ``oversized`` error saying what was too big; the other agent is served."""
    hogs = {f"wake_big{i}.py": BIG_DATA for i in range(5)}
    agents = agents_dir(tmp_path, {"hog": hogs, "calm": {"wake_every.py": WAKE_EVERY}})
    cfg = config(tmp_path, agents, max_frame_bytes=256 * 1024, max_agent_source_bytes=100_000)
    svc = Service(
        cfg, lambda _: [PacedFeed([candle(i) for i in range(4)])], components=[open_agents]
    )
    with anyio.fail_after(30):
        await svc.run()
    rows = [r for r in audit(tmp_path) if r["type"] == "hook"]
    calm = [r for r in rows if r["agentId"] == "calm"]
    assert [r["reason"] for r in calm] == [f"seen {i + 1}" for i in range(4)]
    hog_errors = [r["error"] for r in rows if r["agentId"] == "hog" and r["error"]]
    assert len(hog_errors) == 15  # 5 hooks x the 3 events after the first
    assert all(e.startswith("oversized: request of") for e in hog_errors)
    assert "lastOutputs holds" in hog_errors[0] and "max_frame_bytes" in hog_errors[0]


async def test_an_unexpected_error_in_handling_is_logged_and_the_agent_serves_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The serve loop's own error path runs (it once crashed the daemon by passing
    ``event=`` to structlog) and the next events are evaluated."""
    agents = agents_dir(tmp_path, {"alpha": {"wake_every.py": WAKE_EVERY}})
    events = [candle(i) for i in range(5)]
    real = Dispatcher.handle

    async def flaky(self: Dispatcher, rt: object, event: object) -> object:
        if event is events[2]:
            raise RuntimeError("boom")
        return await real(self, rt, event)  # type: ignore[arg-type]

    monkeypatch.setattr(Dispatcher, "handle", flaky)
    svc = Service(config(tmp_path, agents), lambda _: [PacedFeed(events)], components=[open_agents])
    with anyio.fail_after(30):
        status = await svc.run()
    seen = [r["eventId"] for r in audit(tmp_path) if r["type"] == "hook"]
    assert seen == [e.event_id for i, e in enumerate(events) if i != 2]
    assert status.hooks is not None and status.hooks.failures == 1
