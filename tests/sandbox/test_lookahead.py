"""Lookahead requests in a real worker: later events evaluated in the same request as
the first, the lastOutputs the worker carries between them, which state keys each
hook read, and what a failing or hostile hook does to a lookahead (nothing counted)."""

from __future__ import annotations

from typing import Any

import msgspec

from hooks_runtime import SandboxConfig, WorkerPool, open_worker_pool, spec_from_source
from hooks_runtime.decisions import to_builtins
from hooks_runtime.protocol import READ_ALL, Batch, Step, encode_state

# Counts its own evaluations through lastOutputs, and says which close it saw.
COUNTER = spec_from_source(
    "wake_counter",
    "wake",
    """
def evaluate(event, state):
    mine = state["lastOutputs"].get("wake_counter")
    n = int(mine["data"]["n"]) + 1 if mine else 1
    close = state["candles"]["X"]["5m"][-1]["close"]
    return {"decision": "IGNORE", "reason": f"close {close}", "data": {"n": n}}
""",
)
CANDLES_ONLY = spec_from_source(
    "wake_candles",
    "wake",
    'def evaluate(e, s):\n    return {"decision": "IGNORE", "reason": str(len(s.get("candles")))}\n',
)
NOTHING = spec_from_source(
    "wake_nothing",
    "wake",
    'def evaluate(e, s):\n    return {"decision": "IGNORE", "reason": "-"}\n',
)
EVERYTHING = spec_from_source(
    "wake_everything",
    "wake",
    'def evaluate(e, s):\n    return {"decision": "IGNORE", "reason": ",".join(sorted(s))}\n',
)
MEMBERSHIP = spec_from_source(
    "wake_member",
    "wake",
    """
def evaluate(e, s):
    s.get("no such key")
    return {"decision": "IGNORE", "reason": str("positions" in s)}
""",
)


def _event(i: int) -> dict[str, Any]:
    return {
        "eventId": f"replay:X:5m:{i}",
        "ts": f"2026-01-01T00:{i:02d}:00.000Z",
        "source": "replay",
        "topic": "market.candle.closed",
        "symbol": "X",
        "payload": {},
    }


def _market(i: int) -> dict[str, Any]:
    candles = [{"close": float(k), "closeTime": f"t{k}"} for k in range(max(0, i - 2), i + 1)]
    return {"candles": {"X": {"5m": candles}}, "indicators": {}, "ticks": {}}


def _portfolio() -> dict[str, Any]:
    return {"positions": {}, "orders": []}


def _steps(first: int, n: int) -> list[Step]:
    return [Step(_event(i), encode_state(_market(i) | _portfolio())) for i in range(first, n)]


def _state(i: int, outputs: dict[str, Any]) -> dict[str, Any]:
    return _market(i) | _portfolio() | {"lastOutputs": outputs}


async def test_each_step_is_what_its_own_evaluation_would_be(pool: WorkerPool) -> None:
    """Steps carry lastOutputs from the results before them, exactly as the dispatcher
    would have put them into each event's state: the same decisions as one request
    per event, and the reads say the counter read lastOutputs and candles."""
    hooks = [COUNTER, CANDLES_ONLY]
    first, later = await pool.evaluate_ahead(
        "la1", hooks, _event(0), _state(0, {}), 0.0, _steps(1, 6)
    )
    assert len(later) == 5
    outputs: dict[str, Any] = {}
    alone = []
    for i in range(6):
        results = await pool.evaluate("la1-alone", hooks, _event(i), _state(i, dict(outputs)))
        for r in results:
            assert r.decision is not None
            outputs[r.hook_id] = to_builtins(r.decision)
        alone.append([r.decision for r in results])
    assert [[r.decision for r in step] for step in [first, *later]] == alone
    assert [step[0].decision.data for step in later if step[0].decision] == [
        {"n": n} for n in range(2, 7)
    ]
    assert first[0].reads == ()  # the first event's reads are not tracked: it is not a guess
    assert all(step[0].reads == ("candles", "lastOutputs") for step in later)
    assert all(step[1].reads == ("candles",) for step in later)


async def test_reads_name_only_real_keys_and_a_listing_reads_everything(pool: WorkerPool) -> None:
    hooks = [NOTHING, EVERYTHING, MEMBERSHIP]
    _, later = await pool.evaluate_ahead("la2", hooks, _event(0), _state(0, {}), 0.0, _steps(1, 2))
    (step,) = later
    assert [r.reads for r in step] == [(), (READ_ALL,), ("positions",)]
    # The hooks saw the state as a read-only mapping with lastOutputs in it.
    decision = step[1].decision
    assert decision is not None
    assert decision.reason == "candles,indicators,lastOutputs,orders,positions,ticks"
    assert step[2].decision is not None and step[2].decision.reason == "True"


async def test_speculate_tracks_the_first_event_and_records_nothing(pool: WorkerPool) -> None:
    """A speculative request guesses the first event too; a hook failing in it is not
    counted against it (the event is evaluated again in its turn if the guess fails)."""
    fail = spec_from_source("wake_fail", "wake", "def evaluate(e, s):\n    return 1 / 0\n")
    steps = await pool.speculate(
        "la3", [COUNTER, fail], _event(0), _state(0, {}), 0.0, _steps(1, 3)
    )
    assert len(steps) == 3
    assert steps[0][0].reads == ("candles", "lastOutputs")
    assert all(step[1].error_kind == "runtime" for step in steps)
    assert pool.breaker.failures(("la3", "wake_fail")) == 0
    pool.record("la3", steps[0], 0.0)  # what the dispatcher does with a result it uses
    assert pool.breaker.failures(("la3", "wake_fail")) == 1


async def test_no_lookahead_while_a_hook_backs_off(pool: WorkerPool) -> None:
    fail = spec_from_source("wake_fail", "wake", "def evaluate(e, s):\n    return 1 / 0\n")
    results = await pool.evaluate("la4", [fail], _event(0), _state(0, {}), 0.0)
    assert results[0].error_kind == "runtime"
    first, later = await pool.evaluate_ahead(
        "la4", [COUNTER, fail], _event(1), _state(1, {}), 0.1, _steps(2, 4)
    )
    assert first[1].error_kind == "backoff" and later == []
    assert await pool.speculate("la4", [COUNTER, fail], _event(1), _state(1, {}), 0.1, []) == []


async def test_a_hook_hanging_on_a_later_step_costs_only_the_lookahead() -> None:
    """The worker is killed at the deadline as always; the first event's results stand,
    the steps before the hang are whole, and the timeout is not counted. (A pool of
    its own with a longer budget: on a loaded machine the good steps must not overrun
    the 400 ms of the shared pool, which this test's hang waits out anyway.)"""
    async with open_worker_pool(SandboxConfig(timeout_ms=1500, spare_workers=0)) as pool:
        await _hang_on_a_later_step(pool)


async def _hang_on_a_later_step(pool: WorkerPool) -> None:
    hang = spec_from_source(
        "wake_hang",
        "wake",
        """
def evaluate(e, s):
    if s["candles"]["X"]["5m"][-1]["close"] == 3.0:
        while True:
            pass
    return {"decision": "IGNORE", "reason": "fine"}
""",
    )
    await pool.compile("la5", [hang])
    old = pool.worker_pids()["la5"]
    first, later = await pool.evaluate_ahead(
        "la5", [hang], _event(0), _state(0, {}), 0.0, _steps(1, 6)
    )
    assert first[0].ok
    assert [[r.ok for r in step] for step in later] == [[True], [True], [False]]
    assert later[2][0].error_kind == "timeout"
    assert pool.breaker.failures(("la5", "wake_hang")) == 0
    assert pool.worker_pids().get("la5") != old


async def test_a_hook_cannot_reach_behind_the_tracking_view(pool: WorkerPool) -> None:
    """The view's own fields are private (underscore names are refused) and it takes
    no writes: the state stays read-only on lookahead steps too."""
    sneaky = spec_from_source(
        "wake_sneaky",
        "wake",
        """
def evaluate(e, s):
    tries = []
    for attempt in ("_data", "_reads", "set", "nested"):
        try:
            if attempt == "set":
                s["candles"] = 1
            elif attempt == "nested":
                s["candles"]["X"] = 1
            else:
                getattr(s, attempt)
            tries.append("open")
        except Exception:
            tries.append("refused")
    return {"decision": "IGNORE", "reason": " ".join(tries)}
""",
    )
    _, later = await pool.evaluate_ahead(
        "la6", [sneaky], _event(0), _state(0, {}), 0.0, _steps(1, 2)
    )
    result = later[0][0]
    assert result.ok and result.decision is not None
    assert result.decision.reason == "refused refused refused refused"


async def test_steps_may_list_their_candles_by_index_into_the_request(pool: WorkerPool) -> None:
    """A window moves by one candle a step, so a request carries each candle once
    (``Batch.candles``) and the steps' series list indices: hooks see the same."""
    hooks = [COUNTER, CANDLES_ONLY]
    table: list[msgspec.Raw] = []
    where: dict[bytes, int] = {}
    steps = []
    for i in range(1, 6):
        market = _market(i)
        refs = []
        for candle in market["candles"]["X"]["5m"]:
            raw = msgspec.msgpack.encode(candle)
            if raw not in where:
                where[raw] = len(table)
                table.append(msgspec.Raw(raw))
            refs.append(where[raw])
        state = market | _portfolio() | {"candles": {"X": {"5m": refs}}}
        steps.append(Step(_event(i), encode_state(state)))
    assert len(table) == 6  # candles 0..5 in 5 windows of up to 3, each once
    _, by_index = await pool.evaluate_ahead(
        "la7", hooks, _event(0), _state(0, {}), 0.0, steps, table
    )
    _, whole = await pool.evaluate_ahead("la7", hooks, _event(0), _state(0, {}), 0.0, _steps(1, 6))
    assert [[r.decision for r in s] for s in by_index] == [[r.decision for r in s] for s in whole]
    assert [s[0].decision.reason for s in by_index if s[0].decision] == [
        f"close {float(i)}" for i in range(1, 6)
    ]


async def test_a_state_the_worker_holds_is_not_sent_again(
    pool: WorkerPool, sent_batches: list[Batch]
) -> None:
    """A batch whose state is byte for byte the one the worker was last sent carries
    no state; the worker evaluates on the one it holds, lastOutputs included, even
    after a lookahead request whose steps had other states."""
    held = encode_state(_state(3, {"wake_counter": {"decision": "IGNORE", "data": {"n": 10}}}))
    other = encode_state(_state(4, {}))
    seen = []
    for state in (held, held, other, held, held):
        results = await pool.evaluate("same", [COUNTER], _event(0), state)
        assert results[0].decision is not None, results
        seen.append((results[0].decision.reason, results[0].decision.data))
    assert (
        seen
        == [("close 3.0", {"n": 11})] * 2
        + [("close 4.0", {"n": 1})]
        + [("close 3.0", {"n": 11})] * 2
    )
    assert [b.same_state for b in sent_batches] == [False, True, False, False, True]
    assert all(b.state == encode_state(None) for b in sent_batches if b.same_state)

    sent_batches.clear()
    answers = []
    for _ in range(2):  # the second request reuses the first event's state, not a step's
        first, later = await pool.evaluate_ahead(
            "same", [COUNTER], _event(0), held, 0.0, _steps(5, 8)
        )
        answers.append([r.decision for r in [*first, *(s[0] for s in later)]])
    assert [b.same_state for b in sent_batches] == [True, True]
    assert answers[0] == answers[1]
    assert [d.data for d in answers[0] if d is not None] == [{"n": n} for n in range(11, 15)]
