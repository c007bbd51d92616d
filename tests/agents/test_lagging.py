"""Live, a slow agent lags on its own: the feed and the other agents never wait for it."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import anyio
import msgspec

from daemon.agents.pipeline import open_agents
from daemon.config import Config
from daemon.service import Service
from daemon.status import SubscriptionStatus, read_status
from tests.agents.test_pipeline import WAKE_EVERY, PacedFeed, audit, candle

SLOW = """
def evaluate(event, state):
    n = sum(range(3000000))  # about 30 ms of CPU per event
    return {"decision": "IGNORE", "reason": "busy " + str(n % 7)}
"""
N = 40


def config(root: Path) -> Config:
    return msgspec.convert(
        {
            # A stop drains for 1 s: the slow agent is cut, its backlog stays on disk.
            "daemon": {
                "state_dir": str(root / "state"),
                "clock": "wall",
                "stop_timeout_seconds": 1,
            },
            "bus": {"queue_size": 4},
            "hooks": {
                "agents_dir": str(root / "agents"),
                "reload_seconds": 60,
                # 0.1 s of hook time per 1 s: the slow agent gets ~3 events a second
                "cpu_budget_share": 0.1,
                "cpu_budget_window_seconds": 1,
            },
        },
        Config,
    )


def agents(root: Path) -> None:
    for name, hooks in {
        "fast": {"wake_every.py": WAKE_EVERY},
        "slow": {"wake_slow.py": SLOW},
    }.items():
        (root / "agents" / name / "hooks").mkdir(parents=True)
        (root / "agents" / name / "agent.toml").write_text("")
        for file, src in hooks.items():
            (root / "agents" / name / "hooks" / file).write_text(src)


def rows_by_agent(root: Path) -> Counter[str]:
    return Counter(str(r["agentId"]) for r in audit(root) if r["type"] == "hook")


async def test_a_slow_agent_spills_to_disk_and_catches_up_after_a_restart(
    tmp_path: Path,
) -> None:
    """Its hooks are over its CPU budget: it waits, its events spill to its backlog,
    and the feed and the fast agent go on at full speed (no publish ever blocks).
    Stopped while behind, it finds its backlog at the next start and evaluates every
    event exactly once."""
    agents(tmp_path)
    cfg = config(tmp_path)
    feed = PacedFeed([candle(i) for i in range(N)], hold=True)
    svc = Service(cfg, lambda _: [feed], components=[open_agents])
    lag_seen: list[str] = []
    bus: dict[str, SubscriptionStatus] = {}

    async def watch() -> None:
        await feed.when(N).wait()
        started = time.monotonic()
        while rows_by_agent(tmp_path)["fast"] < N:  # noqa: ASYNC110 - polls the audit
            await anyio.sleep(0.05)
        fast_done = time.monotonic() - started
        status = svc.status_providers["hooks"]()
        lag_seen.append(status.agents["slow"].lagging)
        bus.update({s.name: s for s in svc.bus.statistics().subscriptions})
        assert fast_done < 8, "the fast agent was held back (the slow one needs ~13 s)"
        svc.request_stop()

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            await svc.run()
    first = rows_by_agent(tmp_path)
    assert first["fast"] == N and first["slow"] < N
    assert lag_seen and lag_seen[0], "status says why the slow agent is behind"
    assert bus["agent:slow"].blocked_publishes == 0 and bus["agent:slow"].spilled > 0
    backlog = tmp_path / "state" / "backlog" / "slow.jsonl"
    assert backlog.stat().st_size > 0
    from daemon.cli.run import _render_status

    shown = _render_status(read_status(tmp_path / "state"), None)
    assert "on disk)" in shown and "LAGGING:" in shown, shown

    # The restart: no new events; the backlog is delivered, nothing twice (without the
    # CPU budget, which the first run proved: the catching up is what counts here).
    unpaced = msgspec.structs.replace(
        cfg, hooks=msgspec.structs.replace(cfg.hooks, cpu_budget_share=0)
    )
    again = Service(unpaced, lambda _: [PacedFeed([], hold=True)], components=[open_agents])
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:

            async def stop_when_done() -> None:
                while rows_by_agent(tmp_path)["slow"] < N:  # noqa: ASYNC110
                    await anyio.sleep(0.1)
                again.request_stop()

            tg.start_soon(stop_when_done)
            await again.run()
    counts = Counter((r["agentId"], r["eventId"]) for r in audit(tmp_path) if r["type"] == "hook")
    assert len(counts) == 2 * N and set(counts.values()) == {1}
    assert backlog.stat().st_size == 0
    status = read_status(tmp_path / "state").hooks
    assert status is not None and status.agents["slow"].backlog == 0


async def test_an_agent_whose_backlog_cannot_open_still_runs(tmp_path: Path) -> None:
    """A FIFO where the slow agent's backlog goes: that agent runs without one (its
    feeds wait for it, as before backlogs), the daemon and the other agent go on."""
    import os

    agents(tmp_path)
    (tmp_path / "state" / "backlog").mkdir(parents=True)
    os.mkfifo(tmp_path / "state" / "backlog" / "slow.jsonl")
    base = config(tmp_path)
    cfg = msgspec.structs.replace(
        base,
        daemon=msgspec.structs.replace(base.daemon, stop_timeout_seconds=30),
        hooks=msgspec.structs.replace(base.hooks, cpu_budget_share=0),
    )
    feed = PacedFeed([candle(i) for i in range(8)])
    with anyio.fail_after(60):
        await Service(cfg, lambda _: [feed], components=[open_agents]).run()
    assert rows_by_agent(tmp_path) == Counter({"fast": 8, "slow": 8})
