"""One agent's problem stays that agent's: the daemon keeps serving the others."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import anyio
import msgspec
import pytest
import structlog.testing

from daemon.agents.dispatcher import Dispatcher
from daemon.agents.manager import AgentManager, rescan_outage
from daemon.agents.pipeline import open_agents
from daemon.config import Config
from daemon.errors import StoreError
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


async def test_a_failing_hook_store_suppresses_actions_and_says_so_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hook store refusing writes (a full disk; here SQLite's query_only) must not
    fail each event with a traceback: the decisions are evaluated and audited,
    suppressed by "store" (nothing acts without its dedupe key), one line says it
    starts, status shows it, and one line says when it works again."""
    agents = agents_dir(tmp_path, {"alpha": {"wake_every.py": WAKE_EVERY}})
    events = [candle(i) for i in range(5)]
    real = Dispatcher.handle
    shown: list[str] = []

    async def handle(self: Dispatcher, rt: object, event: object) -> object:
        if event is events[2] or event is events[4]:
            self.store._db.execute(f"PRAGMA query_only={int(event is events[2])}")
        result = await real(self, rt, event)  # type: ignore[arg-type]
        if event is events[3]:
            shown.append(self.store_outage.error)
        return result

    monkeypatch.setattr(Dispatcher, "handle", handle)
    svc = Service(config(tmp_path, agents), lambda _: [PacedFeed(events)], components=[open_agents])
    with structlog.testing.capture_logs() as logs, anyio.fail_after(30):
        status = await svc.run()
    rows = [r for r in audit(tmp_path) if r["type"] == "hook"]
    assert [r["decision"] for r in rows] == ["WAKE"] * 5
    # (the others pass to the wake scheduler, whose cooldown holds event 1's)
    assert [r["suppressedBy"] == "store" for r in rows] == [False, False, True, True, False]
    said = [e["event"] for e in logs if "hook store" in e["event"]]
    assert said == [
        "hook store failing: decisions that would act are suppressed (store)",
        "hook store works again",
    ]
    assert "readonly database" in shown[0] and "hook store (claim)" in shown[0]
    assert status.hooks is not None and status.hooks.failures == 0
    assert status.hooks.store_error == ""


async def test_a_rescan_failing_on_the_store_is_logged_once_until_it_works() -> None:
    """The workspace rescan runs every reload_seconds: a full disk under the hook
    store made one traceback a second; now one line, and one when it works again."""
    outcomes: list[Exception | None] = [StoreError("disk full")] * 3 + [None, StoreError("again")]

    async def rescan() -> None:
        failure = outcomes.pop(0)
        if failure is not None:
            raise failure

    manager = SimpleNamespace(rescan=rescan, _rescan=rescan_outage(), agents_dir=Path("agents"))
    with structlog.testing.capture_logs() as logs:
        for _ in range(5):
            await AgentManager._rescan_logged(manager)  # type: ignore[arg-type]
    assert [(e["event"], e.get("error")) for e in logs] == [
        ("agents rescan failed; will retry", "disk full"),
        ("agents rescan works again", None),
        ("agents rescan failed; will retry", "again"),
    ]
