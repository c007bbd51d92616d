"""On event time each account steps with its own agents: a slow agent holds back
its own account's fills, never another agent (past its queue its events wait on
disk, not in the feed), and every account trades the same as it would alone."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import msgspec

from daemon.agents.pipeline import open_agents
from daemon.config import Config
from daemon.events import MARKET_PRICE_TICK, FeedEvent, iso_ms
from daemon.service import Service
from tests.agents.test_pipeline import PacedFeed, audit, candle

# Buys on every 4th candle with a stop and a target, closes two candles later.
TRADER = """
def evaluate(event, state):
    if "close" not in event["payload"]:
        return {"decision": "IGNORE", "reason": "a tick"}
    step = int(event["payload"]["close"]) - 101
    held = "BTC-USD" in state["positions"]
    if step % 4 == 0 and not held:
        c = event["payload"]["close"]
        return {"decision": "TRADE_INTENT", "reason": "in " + str(step),
                "intent": {"action": "PLACE_MARKET_ORDER", "symbol": "BTC-USD", "side": "buy",
                           "volume": 0.5, "stopLoss": c - 5, "takeProfit": c + 50}}
    if step % 4 == 2 and held:
        return {"decision": "TRADE_INTENT", "reason": "out " + str(step),
                "intent": {"action": "CLOSE_POSITION", "symbol": "BTC-USD"}}
    return {"decision": "IGNORE", "reason": "wait"}
"""
SLOW = TRADER.replace("step = int(", "busy = sum(range(3000000))  # ~30 ms of CPU\n    step = int(")
N = 40


def tick(i: int) -> FeedEvent:
    """Another product's price between candles ``i`` and ``i + 1``."""
    at = candle(i).payload["closeTimeMs"] + 30_000
    return FeedEvent(
        event_id=f"t:ETH-USD:{at}",
        ts=iso_ms(at),
        source="t",
        topic=MARKET_PRICE_TICK,
        symbol="ETH-USD",
        payload={"price": 2000.0 + i},
    )


async def run(
    root: Path,
    hooks: dict[str, str],
    *,
    queue_size: int = 4096,
    ticks: bool = False,
    stop_after: str = "",
) -> tuple[list[tuple[Any, ...]], dict[str, float]]:
    """Event time, flat out: the fills of every account (in every run in ``root``
    so far), and when (wall clock, from the first published candle) each agent had
    evaluated all N candles. ``stop_after``: a stop as a signal would, once that
    agent has."""
    topics = 'topics = ["market.candle.closed", "market.price.tick"]\n' if ticks else ""
    for name, src in hooks.items():
        (root / "agents" / name / "hooks").mkdir(parents=True, exist_ok=True)
        (root / "agents" / name / "agent.toml").write_text(topics)
        (root / "agents" / name / "hooks" / "autotrade_steps.py").write_text(src)
    cfg = msgspec.convert(
        {
            # a stop's drain is short: a finished replay waits for its agents first
            "daemon": {
                "state_dir": str(root / "state"),
                "clock": "event",
                "stop_timeout_seconds": 0.5,
            },
            # a wall-clock timeout is not what these runs are about: on a loaded box the
            # slow hook's ~30 ms took over 250 ms, and the account missed that trade
            "hooks": {
                "agents_dir": str(root / "agents"),
                "reload_seconds": 60,
                "sandbox": {"timeout_ms": 10_000},
            },
            "bus": {"queue_size": queue_size},
        },
        Config,
    )
    events = [e for i in range(N) for e in ((candle(i), tick(i)) if ticks else (candle(i),))]
    per_agent = len(events)
    feed = PacedFeed(events)
    svc = Service(cfg, lambda _: [feed], components=[open_agents])
    done: dict[str, float] = {}

    started: list[float] = []

    def scan() -> None:
        seen = Counter(str(r["agentId"]) for r in audit(root) if r["type"] == "hook")
        for name in hooks:
            if seen[name] >= per_agent and name not in done:
                done[name] = time.monotonic() - started[0]
                if name == stop_after:
                    svc.request_stop()

    async def watch() -> None:
        await feed.when(1).wait()
        started.append(time.monotonic())
        while len(done) < len(hooks):
            scan()
            await anyio.sleep(0.01)

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            await svc.run()
            tg.cancel_scope.cancel()
    # the last agent's last rows may reach the audit only as the service stops, after
    # the watch's last look: one more look, so that agent reads as done when it stopped
    if started:
        scan()
    fills = [
        (r["agentId"], r["role"], r["side"], r["volume"], r["price"])
        for r in audit(root)
        if r["type"] == "order" and r["status"] == "FILLED"
    ]
    return fills, done


async def test_a_slow_agent_holds_back_only_its_own_account(tmp_path: Path) -> None:
    alone, _ = await run(tmp_path / "alone", {"fast": TRADER})
    both, done = await run(tmp_path / "both", {"fast": TRADER, "slow": SLOW})
    slow_alone, _ = await run(tmp_path / "slow", {"slow": SLOW})
    # the fast agent finished its 40 candles long before the slow one (~1.2 s of hooks)
    assert done["fast"] < done["slow"] / 3, done
    # and each account traded exactly as it does alone: same fills, same prices
    assert [f for f in both if f[0] == "fast"] == alone and alone
    assert [f for f in both if f[0] == "slow"] == slow_alone


async def test_past_its_queue_a_slow_agent_waits_on_disk_not_the_feed(tmp_path: Path) -> None:
    """Queues of 4 events, and a tick of another product after each candle: the slow
    agent's events (and its account's) wait on disk in publish order, the fast agent
    finishes at its own pace, and both trade exactly as they do alone (the slow one
    finishes its backlog after the replay ended, not cut by the 0.5 s stop drain)."""
    alone, _ = await run(tmp_path / "alone", {"fast": TRADER}, queue_size=4, ticks=True)
    both, done = await run(
        tmp_path / "both", {"fast": TRADER, "slow": SLOW}, queue_size=4, ticks=True
    )
    slow_alone, _ = await run(tmp_path / "slow", {"slow": SLOW}, queue_size=4, ticks=True)
    assert done["fast"] < done["slow"] / 3, done
    assert [f for f in both if f[0] == "fast"] == alone and alone
    assert [f for f in both if f[0] == "slow"] == slow_alone


async def test_a_stop_with_events_on_disk_then_a_restart_evaluates_each_once(
    tmp_path: Path,
) -> None:
    """A stop (as on SIGTERM) once the fast agent is done, while the slow one has
    candles on disk (its drain cut at 0.5 s); the next start empties the backlogs
    and the replay publishes the file again. Over the two runs each agent evaluates
    every event exactly once, and the slow one trades exactly as alone (where the
    account's route stops is tested in tests/trading/test_route.py)."""
    root = tmp_path / "both"
    hooks = {"fast": TRADER, "slow": SLOW}
    await run(root, hooks, queue_size=4, ticks=True, stop_after="fast")
    first = Counter(str(r["agentId"]) for r in audit(root) if r["type"] == "hook")
    assert first["fast"] == 2 * N and 0 < first["slow"] < 2 * N, first
    both, _ = await run(root, hooks, queue_size=4, ticks=True)
    rows = Counter((r["agentId"], r["eventId"]) for r in audit(root) if r["type"] == "hook")
    assert len(rows) == 2 * 2 * N and set(rows.values()) == {1}
    slow_alone, _ = await run(tmp_path / "slow", {"slow": SLOW}, queue_size=4, ticks=True)
    mine = [f for f in both if f[0] == "slow"]
    story = _story(root, "slow") + "\n-- alone --\n" + _story(tmp_path / "slow", "slow")
    assert mine == slow_alone and slow_alone, story


def _story(root: Path, agent: str) -> str:
    """What an account did, for a failure message: its failed hook evaluations, risk
    and order rows by run, and the orders its store holds."""
    from daemon.trading.paper_store import PaperStore

    rows = [
        f"{r['type']} run {str(r.get('daemonRun'))[-4:]} {r.get('status', r.get('approved'))} "
        f"{r.get('role', '')} {r.get('side', '')} {r.get('price', '')} at {r.get('eventTs')} "
        f"{r.get('clientOrderId')}"
        for r in audit(root)
        if r.get("agentId") == agent and r["type"] in ("risk", "order")
    ]
    rows += [
        f"hook failed at {r['eventTs']}: {r['error']}"
        for r in audit(root)
        if r.get("agentId") == agent and r["type"] == "hook" and r.get("error")
    ]
    store = PaperStore(root / "state" / "paper.sqlite3")
    try:
        rows += [
            f"stored {o.client_order_id} {o.status} {o.role} {o.side} created {o.created_ms} "
            f"filled {o.filled_ms} @ {o.fill_price}"
            for o in store.all_orders()
            if o.agent_id == agent
        ]
    finally:
        store.close()
    return "\n".join(rows)


async def test_on_event_time_a_queue_half_full_reads_as_lagging() -> None:
    """Before anything spills, status says the agent is behind by its queue."""
    from types import SimpleNamespace

    from daemon.agents.dispatcher import Dispatcher
    from daemon.bus import Bus

    bus = Bus(queue_size=4)
    sub = bus.subscribe("market.>", name="agent:slow")
    rt = SimpleNamespace(sub=sub, over_budget="")
    assert Dispatcher.lag_reason(rt) == ""  # type: ignore[arg-type]
    for i in range(2):
        await bus.publish(candle(i))
    assert Dispatcher.lag_reason(rt) == "2 events queued (of 4)"  # type: ignore[arg-type]
    rt.over_budget = "over its CPU budget"
    assert Dispatcher.lag_reason(rt) == "over its CPU budget"  # type: ignore[arg-type]
