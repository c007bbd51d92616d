"""Lookahead on event time, end to end: a backtest's every hook decision is the same
with it as without it, including hooks whose state changes with each order and fill
(they read positions, orders and their own lastOutputs), and the results evaluated
ahead are used where they hold and evaluated again where they do not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from daemon.agents.dispatcher import AgentRuntime, Dispatcher
from daemon.app import run_daemon
from daemon.audit.reader import iter_records
from daemon.backtest.run import BacktestOptions, prepare
from daemon.config import Config
from daemon.events import FeedEvent
from daemon.status import HooksStatus
from feeds.synthetic import generate_candles

WAKE_GREEN = """
def evaluate(event, state):
    c = state["candles"][event["symbol"]]["5m"][-1]
    if c["close"] > c["open"]:
        return {"decision": "WAKE", "reason": "green", "dedupeKey": "g:" + event["eventId"]}
    return {"decision": "IGNORE", "reason": "red"}
"""
# Buys every 7th candle when flat (a stop below), sells every 7th when long.
TRADER = """
def evaluate(event, state):
    c = event["payload"]
    if int(c["closeTimeMs"] / 300000) % 7:
        return {"decision": "IGNORE", "reason": "not now"}
    side = "buy" if not state["positions"] else "sell"
    intent = {"action": "PLACE_MARKET_ORDER", "symbol": event["symbol"], "side": side,
              "volume": 0.001}
    if side == "buy":
        intent["stopLoss"] = c["close"] * 0.9
    return {"decision": "TRADE_INTENT", "reason": side, "dedupeKey": "t:" + event["eventId"],
            "intent": intent}
"""
# Reads the account and its own last output on every event.
READER = """
def evaluate(event, state):
    mine = state["lastOutputs"].get("wake_reader")
    n = mine["data"]["n"] + 1 if mine else 1
    held = ",".join(sorted(state["positions"]))
    return {"decision": "IGNORE", "reason": f"{n} [{held}] {len(state['orders'])}",
            "data": {"n": n}}
"""
TOML = "[wake]\nmax_runs_per_hour = 2\ncooldown_after_run_seconds = 0\ndebounce_seconds = 0\n"
VOLATILE = {"ts", "runtimeMs", "daemonRun"}  # wall-clock stamps, timings, the run's id


def _agent(root: Path, hooks: dict[str, str]) -> Path:
    (root / "hooks").mkdir(parents=True)
    (root / "agent.toml").write_text(TOML)
    for name, source in hooks.items():
        (root / "hooks" / name).write_text(source)
    return root


def _run(
    agent_dir: Path, data: Path, out: Path, lookahead: int, tf: str = "5m", **sandbox: Any
) -> tuple[HooksStatus, list[dict[str, Any]]]:
    kept = out.parent / "kept"
    opts = BacktestOptions(agent_dir=agent_dir, data=data, out=out, state_dir=kept, timeframe=tf)
    config = prepare(opts)
    hooks = msgspec.structs.replace(
        config.hooks,
        lookahead_events=lookahead,
        sandbox=msgspec.structs.replace(config.hooks.sandbox, **sandbox),
    )
    status = run_daemon(msgspec.structs.replace(config, hooks=hooks))
    assert status.hooks is not None
    rows = [
        {k: v for k, v in r.items() if k not in VOLATILE}
        for r in iter_records(out / "state" / "audit")
        if r.get("type") in ("hook", "risk", "order")
    ]
    return status.hooks, rows


def test_hooks_reading_the_account_decide_the_same_with_lookahead(tmp_path: Path) -> None:
    data = tmp_path / "c.csv"
    generate_candles(data, seed=5, n=700, timeframe="5m")
    hooks = {"wake_green.py": WAKE_GREEN, "autotrade_trader.py": TRADER, "wake_reader.py": READER}
    agent_dir = _agent(tmp_path / "agents" / "alpha", hooks)
    off, rows_off = _run(agent_dir, data, tmp_path / "off", 0)
    on, rows_on = _run(agent_dir, data, tmp_path / "on", 16)
    assert off.lookahead_used == off.lookahead_missed == 0
    assert len(rows_on) == len(rows_off) > 3 * 700
    assert rows_on == rows_off
    trades = [r for r in rows_on if r.get("decision") == "TRADE_INTENT"]
    assert len(trades) > 50  # the account changes often: what the reader reads moves
    assert on.lookahead_used > 0 and on.lookahead_missed > 0


def test_hooks_reading_only_the_market_use_what_was_evaluated_ahead(tmp_path: Path) -> None:
    data = tmp_path / "c.csv"
    generate_candles(data, seed=6, n=700, timeframe="5m")
    agent_dir = _agent(tmp_path / "agents" / "beta", {"wake_green.py": WAKE_GREEN})
    _, rows_off = _run(agent_dir, data, tmp_path / "off", 0)
    on, rows_on = _run(agent_dir, data, tmp_path / "on", 16)
    assert rows_on == rows_off
    assert on.lookahead_missed == 0
    assert on.lookahead_used > 350  # most of the 700: the replay runs ahead of the agent


# Fails on every 9th one-minute candle: with a 90 s backoff the next candle is skipped.
FLAKY = """
def evaluate(event, state):
    if int(event["payload"]["closeTimeMs"] / 60000) % 9 == 0:
        raise ValueError("every ninth")
    return {"decision": "IGNORE", "reason": "fine"}
"""
# Fails from its 100th candle on: paused after a few failures, for the rest of the run.
BROKEN = """
def evaluate(event, state):
    if len(state["candles"][event["symbol"]]["1m"]) >= 50 and event["payload"]["close"] > 0:
        return {"decision": "IGNORE", "reason": "x" + None}
    return {"decision": "IGNORE", "reason": "warming up"}
"""
GREEN_1M = WAKE_GREEN.replace('"5m"', '"1m"')


@pytest.mark.parametrize("hook", ["flaky", "broken"])
def test_failing_hooks_decide_the_same_with_lookahead(tmp_path: Path, hook: str) -> None:
    """A hook backing off skips the same events with lookahead as without (an event
    evaluated ahead while the hook was still running is evaluated again in its
    turn), and a paused hook does not stop the agent's other hooks from being
    evaluated ahead."""
    data = tmp_path / "c.csv"
    generate_candles(data, seed=9, n=600, timeframe="1m")
    source = FLAKY if hook == "flaky" else BROKEN
    hooks = {"wake_green.py": GREEN_1M, f"wake_{hook}.py": source}
    agent_dir = _agent(tmp_path / "agents" / "gamma", hooks)
    knobs = {"backoff_base_seconds": 90.0, "pause_after_failures": 1000 if hook == "flaky" else 5}
    _, rows_off = _run(agent_dir, data, tmp_path / "off", 0, "1m", **knobs)
    on, rows_on = _run(agent_dir, data, tmp_path / "on", 16, "1m", **knobs)
    assert len(rows_on) == len(rows_off) == 2 * 600
    assert rows_on == rows_off
    errors = [(r["error"] or ":").split(":")[0] for r in rows_off if r["hookId"] == f"wake_{hook}"]
    if hook == "flaky":
        assert errors.count("backoff") > 50 and errors.count("runtime") > 50
    else:
        assert errors.count("paused") > 500
        assert on.lookahead_used > 400  # the healthy hook is still evaluated ahead


# The newest candle a hook sees must be its event's own, never a later one.
EXACT = """
def evaluate(event, state):
    last = state["candles"][event["symbol"]]["5m"][-1]
    ok = last["closeTimeMs"] == event["payload"]["closeTimeMs"]
    return {"decision": "IGNORE", "reason": "exact" if ok else "LEAK"}
"""
SLOW = """
def evaluate(event, state):
    n = 0
    for i in range(3000):
        n += i
    return {"decision": "WAKE", "reason": "slow", "dedupeKey": "s:" + event["eventId"]}
"""


@pytest.mark.parametrize("run_agents", [True, False])
def test_no_state_ever_runs_ahead_beside_a_slow_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_agents: bool
) -> None:
    """Two accounts, a slow agent beside a quick one, small queues (events wait on
    disk): every hook sees its own event's candle last, and the agent's state cache
    (what a wake's context and the tools read) never holds a candle past the event
    being handled, however far lookahead has run. When runs only log, nothing reads
    that cache and it is the lookahead one: the hooks still see exactly their event."""
    data = tmp_path / "c.csv"
    generate_candles(data, seed=8, n=1500, timeframe="5m")
    agents = tmp_path / "agents"
    _agent(agents / "quick", {"wake_exact.py": EXACT, "wake_green.py": WAKE_GREEN})
    _agent(agents / "slow", {"wake_slow.py": SLOW})
    ahead: list[str] = []
    real = Dispatcher.handle

    async def checked(self: Dispatcher, rt: AgentRuntime, event: FeedEvent) -> object:
        results = await real(self, rt, event)
        if (rt.state is rt.ahead_state) == run_agents:
            ahead.append(f"{rt.agent_id}: one cache or two, with run_agents={run_agents}")
        if not run_agents:
            return results
        series = rt.state.series(event.symbol or "", event.timeframe or "")
        held = series.last_close_ms if series is not None else None
        if held != event.payload.get("closeTimeMs"):
            ahead.append(f"{rt.agent_id} {event.event_id}: state at {held}")
        return results

    monkeypatch.setattr(Dispatcher, "handle", checked)
    cfg = msgspec.convert(
        {
            "daemon": {"state_dir": str(tmp_path / "state"), "clock": "event"},
            "bus": {"queue_size": 32},
            "hooks": {"agents_dir": str(agents), "reload_seconds": 3600, "run_agents": run_agents},
            "feeds": {"replay": {"enabled": True, "path": str(data), "symbol": "X",
                                 "timeframe": "5m", "speed": 0}},
        },
        Config,
    )  # fmt: skip
    status = run_daemon(cfg)
    assert status.hooks is not None and status.hooks.lookahead_used > 0
    reasons = [
        r["reason"]
        for r in iter_records(tmp_path / "state" / "audit")
        if r.get("type") == "hook" and r.get("hookId") == "wake_exact"
    ]
    assert len(reasons) == 1500 and set(reasons) == {"exact"}
    assert ahead == []


def _raw(n: int) -> msgspec.Raw:
    return msgspec.Raw(msgspec.msgpack.encode({"close": float(n), "pad": "x" * n}))


@pytest.mark.parametrize(
    ("before", "after", "added"),
    [
        ([1, 2, 3], [1, 2, 3], 0),  # unchanged (an event with no new close)
        ([1, 2, 3], [2, 3, 4], 1),  # moved by a candle (the buffer is full)
        ([1, 2, 3], [1, 2, 3, 4], 1),  # grown by a candle
        ([1, 2, 3], [3, 4, 5], 3),  # moved by two: candle by candle
        ([], [7], 1),
        ([5], [6], 1),
        ([1, 2, 3], [], 0),
    ],
)
def test_a_steps_candles_are_indexed_from_the_previous_window_as_one_by_one(
    before: list[int], after: list[int], added: int
) -> None:
    """The shortcut that reuses the previous step's indices gives a step the same
    candles, in order, and the same byte count as indexing every candle; a window
    of fresh objects with the same bytes reuses the entries already in the table."""
    from daemon.agents.dispatcher import _moved

    raws = {n: _raw(n) for n in {*before, *after}}
    table: list[msgspec.Raw] = []

    def index(candle: msgspec.Raw) -> int:
        table.append(candle)
        return len(table) - 1

    first = [raws[n] for n in before]
    prev = (first, *_moved(None, first, index))
    window = [msgspec.Raw(bytes(raws[n])) for n in after]  # equal bytes, other objects
    ids, size = _moved(prev, window, index)
    assert [table[i] for i in ids] == window
    assert size == sum(len(c) for c in window)
    assert len(table) == len(before) + added


def test_a_result_evaluated_ahead_with_a_hook_paused_holds_only_while_it_is() -> None:
    """A step's paused hook stood for a pause that may have been lifted since (hooks
    resume): then the step is evaluated again, with the hook running; a failure in
    a step ends what is kept, a pause does not."""
    from daemon.agents.lookahead import Lookahead, keep, stood_paused
    from hooks_runtime.decisions import Ignore
    from hooks_runtime.hookfile import HookSpec
    from hooks_runtime.pool import HookResult

    hooks = [HookSpec(hook_id=h, kind="wake", revision="r1", source="") for h in ("a", "b")]
    ok = HookResult(
        hook_id="a", kind="wake", revision="r1", runtime_ms=0.1, decision=Ignore(reason="x")
    )
    paused = HookResult(
        hook_id="b", kind="wake", revision="r1", runtime_ms=0, error_kind="paused", error="p"
    )
    failed = msgspec.structs.replace(paused, error_kind="runtime")
    assert stood_paused([ok, paused]) == frozenset({"b"}) and stood_paused([ok, failed]) is None
    assert stood_paused([ok]) == frozenset()
    entries = [Lookahead({}) for _ in range(3)]
    keep(entries, [[ok, paused], [ok, failed], [ok, paused]], hooks, ({}, ()), {})
    assert [e.results is not None for e in entries] == [True, False, False]
    first = entries[0]
    assert first.holds(hooks, ({}, ()), {}, frozenset({"b"}))
    assert not first.holds(hooks, ({}, ()), {}, frozenset())  # resumed since
    assert not first.holds(hooks, ({}, ()), {}, frozenset({"a", "b"}))
