"""Candle series sent as deltas: the parent's bookkeeping and the worker's, with bytes
(sans-I/O), then through a real worker as windows move, jump and a worker is replaced."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from daemon.errors import HookCrashed, HookRequestTooLarge
from hooks_runtime import SandboxConfig, WorkerPool, open_worker_pool, spec_from_source
from hooks_runtime.policy import freeze
from hooks_runtime.protocol import Batch, SeriesDelta, encode_state
from hooks_runtime.series import (
    MAX_HELD_CANDLES,
    MAX_HELD_SERIES,
    Held,
    deltas,
    deltas_size,
    split,
)
from hooks_runtime.worker import Evaluator
from tests.sandbox.test_hostile import EVENT
from tests.sandbox.test_pool import LOOP

_enc = msgspec.msgpack.Encoder()


def candles(first: int, n: int, symbol: str = "BTC-USD") -> list[msgspec.Raw]:
    """Candles ``first`` .. ``first + n - 1`` as the state cache exports them (msgpack)."""
    return [
        msgspec.Raw(_enc.encode({"symbol": symbol, "close": 100.0 + i, "closeTimeMs": i * 60_000}))
        for i in range(first, first + n)
    ]


def state(series: dict[str, dict[str, list[msgspec.Raw]]], tag: str = "x") -> dict[str, Any]:
    """A hook state in the daemon's key order, candles second."""
    return {"ticks": {}, "candles": series, "indicators": {"n": tag}, "positions": {}}


def plain(value: Any) -> Any:
    """What the worker would make of ``value`` sent whole: decoded and frozen."""
    return freeze(msgspec.msgpack.decode(encode_state(value)))


def test_split_keeps_the_key_order_and_only_takes_the_daemons_form() -> None:
    window = candles(0, 3)
    parts = split(state({"BTC-USD": {"1m": window}}))
    assert parts is not None
    assert list(msgspec.msgpack.decode(parts.rest)) == [
        "ticks",
        "candles",
        "indicators",
        "positions",
    ]
    assert msgspec.msgpack.decode(parts.rest)["candles"] == {}
    assert parts.windows == {("BTC-USD", "1m"): window}
    decoded = [msgspec.msgpack.decode(c) for c in window]
    assert split(state({"BTC-USD": {"1m": decoded}})) is None  # plain candles: sent whole
    assert split(state({"BTC-USD": {}})) is None  # a symbol without series
    assert split({"candles": [1, 2]}) is None
    assert split({"tag": "no candles"}) is None


def test_deltas_send_only_what_moved_and_keep_the_byte_count() -> None:
    held: Held = {}
    a = candles(0, 5)
    series, held, _ = deltas(held, {("BTC-USD", "1m"): a})
    assert [(d.held, d.drop, len(d.new)) for d in series] == [(0, 0, 5)]
    steps = [
        (candles(1, 5), (5, 1, 1)),  # moved on by one
        (candles(1, 6), (5, 0, 1)),  # grown by one
        (candles(1, 6), (6, 0, 0)),  # unchanged
        (candles(40, 3), (6, 6, 3)),  # jumped: sent whole
        ([], (3, 3, 0)),  # emptied
    ]
    for window, expected in steps:
        series, held, _ = deltas(held, {("BTC-USD", "1m"): window})
        assert [(d.held, d.drop, len(d.new)) for d in series] == [expected]
        assert series[0].new == window[len(window) - expected[2] :]
        assert held[("BTC-USD", "1m")] == (window, sum(map(len, window)))
    series, held, _ = deltas(held, {("ETH-USD", "5m"): candles(0, 2, "ETH-USD")})
    assert [(d.symbol, d.held) for d in series] == [("ETH-USD", 0)]
    assert list(held) == [("BTC-USD", "1m"), ("ETH-USD", "5m")]  # kept, latest last
    series, held, _ = deltas(held, {("BTC-USD", "1m"): [*candles(1, 6)[1:], *candles(9, 1)]})
    assert [(d.held, d.drop, len(d.new)) for d in series] == [(0, 0, 6)]  # held, empty
    assert list(held) == [("ETH-USD", "5m"), ("BTC-USD", "1m")]


def test_the_oldest_windows_go_first_on_both_sides() -> None:
    """Symbols taking turns each cost one candle a batch while their windows are
    held; beyond the caps the least recently listed window is forgotten, by the
    parent and the worker alike."""
    ev, held = Evaluator(SandboxConfig()), Held()

    def turn(symbol: str, first: int) -> list[int]:
        nonlocal held
        whole = state({symbol: {"1m": candles(first, 5, symbol)}})
        parts = split(whole)
        assert parts is not None
        sent, held, _ = deltas(held, parts.windows)
        assert ev.state(parts.rest, series=sent) == plain(whole)
        assert list(ev.deltas) == list(held)
        return [len(d.new) for d in sent]

    symbols = [f"S{i}" for i in range(MAX_HELD_SERIES)]
    for step in range(3):
        for symbol in symbols:
            assert turn(symbol, step) == [5 if step == 0 else 1]
    assert turn("NEW", 0) == [5]
    assert ("S0", "1m") not in held and ("S1", "1m") in held
    assert turn("S0", 3) == [5]  # forgotten: sent whole
    assert turn("S2", 3) == [1]
    big = {(f"B{i}", "1m"): candles(0, MAX_HELD_CANDLES // 3, f"B{i}") for i in range(4)}
    _, held, _ = deltas(held, big)
    assert list(held) == [("B1", "1m"), ("B2", "1m"), ("B3", "1m")]  # within the cap


def test_a_plain_candle_among_encoded_ones_is_refused() -> None:
    window: list[Any] = candles(0, 3)
    _, held, _ = deltas({}, {("BTC-USD", "1m"): window})
    moved = [*window[1:], {"close": 1.0}]
    with pytest.raises(TypeError, match="mixes encoded and plain"):
        deltas(held, {("BTC-USD", "1m"): moved})


@pytest.mark.parametrize("n", [0, 1, 15, 16, 300, 70_000])
def test_sizes_are_the_msgpack_sizes(n: int) -> None:
    """The size checks count a state as if sent whole: the arithmetic must match."""
    many = [msgspec.Raw(b"\x01")] * n
    windows = {("BTC-USD", "1m"): many, ("BTC-USD", "x" * 40): candles(0, 2)}
    windows |= {(f"S{i}", "1h"): candles(i, 1) for i in range(17)}
    _, _, size = deltas({("X", "1m"): (candles(0, 3), 99)}, windows)  # X: not listed
    nested: dict[str, dict[str, list[msgspec.Raw]]] = {}
    for (symbol, tf), window in windows.items():
        nested.setdefault(symbol, {})[tf] = window
    assert size == len(_enc.encode(nested))
    series = [SeriesDelta("BTC-USD", "1m", n, n, many), SeriesDelta("E", "5m", 300, 1, [])]
    assert deltas_size(series) == len(_enc.encode(series))
    assert deltas_size(None) == len(_enc.encode(None))


def test_the_worker_builds_what_the_whole_state_would_give() -> None:
    """A run of delta batches, each against the last, gives the very state a
    whole send gives, key order included; a delta out of step ends the worker."""
    ev, held = Evaluator(SandboxConfig()), Held()
    runs = [
        {"BTC-USD": {"1m": candles(0, 4)}},
        {"BTC-USD": {"1m": candles(1, 4)}},
        {"BTC-USD": {"1m": candles(1, 5), "5m": candles(0, 2)}},
        {"BTC-USD": {"5m": candles(0, 2)}, "ETH-USD": {"1m": candles(3, 2, "ETH-USD")}},
        {"BTC-USD": {"5m": candles(9, 2)}},
    ]
    for i, series in enumerate(runs):
        whole = state(series, tag=str(i))
        parts = split(whole)
        assert parts is not None
        sent, held, _ = deltas(held, parts.windows)
        got = ev.state(parts.rest, series=sent)
        assert got == plain(whole)
        assert list(got) == list(whole)
        assert [list(f) for f in got["candles"].values()] == [list(f) for f in series.values()]
    stale = SeriesDelta("BTC-USD", "5m", 7, 1, [])
    assert parts is not None
    with pytest.raises(HookCrashed, match="the worker holds 2"):
        ev.state(parts.rest, series=[stale])


def test_a_state_with_other_keys_than_strings_still_gets_its_series() -> None:
    """The worker decodes such a state whole (no reuse by key); the series built
    from the deltas still take the candles' place."""
    ev = Evaluator(SandboxConfig())
    whole: dict[Any, Any] = {"candles": {"BTC-USD": {"1m": candles(0, 3)}}, 7: "seven"}
    parts = split(whole)
    assert parts is not None
    sent, _, _ = deltas({}, parts.windows)
    got = ev.state(parts.rest, series=sent)
    assert got == plain(whole)


def test_whole_and_delta_batches_interleave() -> None:
    """A state sent whole in between (a shared pre-encoded state) leaves the windows
    the deltas are against as they were."""
    ev = Evaluator(SandboxConfig())
    first = split(state({"BTC-USD": {"1m": candles(0, 3)}}))
    assert first is not None
    sent, held, _ = deltas({}, first.windows)
    ev.state(first.rest, series=sent)
    other = state({"BTC-USD": {"1m": candles(50, 3)}}, tag="whole")
    assert ev.state(encode_state(other)) == plain(other)
    moved = state({"BTC-USD": {"1m": candles(1, 3)}})
    parts = split(moved)
    assert parts is not None
    sent, held, _ = deltas(held, parts.windows)
    assert [(d.held, d.drop) for d in sent] == [(3, 1)]
    assert ev.state(parts.rest, series=sent) == plain(moved)


WINDOW_READER = spec_from_source(
    "wake_window",
    "wake",
    """
def evaluate(event, state):
    closes = [c["close"] for c in state["candles"]["BTC-USD"]["1m"]]
    return {"decision": "IGNORE", "reason": ",".join(str(int(c)) for c in closes),
            "data": {"keys": list(state)}}
""",
)


async def test_hooks_see_each_window_exactly_as_it_moves(
    pool: WorkerPool, sent_batches: list[Batch]
) -> None:
    """Through a real worker: each batch carries only the new candle, hooks read the
    whole window, and a replacement worker (after a timeout) is sent every candle."""

    def reason(first: int, n: int) -> str:
        return ",".join(str(100 + i) for i in range(first, first + n))

    for i in range(4):
        results = await pool.evaluate(
            "windows", [WINDOW_READER], EVENT, state({"BTC-USD": {"1m": candles(i, 5)}})
        )
        decision = results[0].decision
        assert decision is not None and decision.reason == reason(i, 5)
        assert decision.data == {"keys": ["ticks", "candles", "indicators", "positions"]}
    sizes = [[len(d.new) for d in b.series or []] for b in sent_batches]
    assert sizes == [[5], [1], [1], [1]]
    results = await pool.evaluate(
        "windows", [LOOP, WINDOW_READER], EVENT, state({"BTC-USD": {"1m": candles(4, 5)}})
    )
    assert [r.error_kind for r in results] == ["timeout", None]
    decision = results[1].decision
    assert decision is not None and decision.reason == reason(4, 5)
    assert [[len(d.new) for d in b.series or []] for b in sent_batches[4:]] == [[1], [5]]


async def test_the_size_limit_counts_the_whole_state_on_any_worker() -> None:
    """A warm worker is sent one candle at a time as its window grows; the request is
    refused at the very size a fresh worker's is (a backtest gives the same report
    whichever worker serves it), though the warm worker's frame is small."""
    cfg = SandboxConfig(max_frame_bytes=20_000, max_agent_source_bytes=5_000)
    big = [msgspec.Raw(_enc.encode({"close": float(i), "pad": "p" * 200})) for i in range(120)]

    def window(n: int) -> dict[str, Any]:
        return state({"BTC-USD": {"1m": big[:n]}})

    async with open_worker_pool(cfg) as p:
        refused = 0
        for n in range(40, 121):
            try:
                await p.evaluate("warm", [WINDOW_READER], EVENT, window(n))
            except HookRequestTooLarge:
                refused = n
                break
        assert 40 < refused < 120
        with pytest.raises(HookRequestTooLarge):
            await p.evaluate("fresh", [WINDOW_READER], EVENT, window(refused))
        assert (await p.evaluate("fresh", [WINDOW_READER], EVENT, window(refused - 1)))[0].ok


LAST_CLOSES = spec_from_source(
    "wake_last_closes",
    "wake",
    """
def evaluate(event, state):
    seen = [s + ":" + str(len(f["1m"])) + ":" + str(int(f["1m"][-1]["close"]))
            for s, f in state["candles"].items()]
    return {"decision": "IGNORE", "reason": " ".join(seen)}
""",
)


async def test_symbols_taking_turns_cost_a_candle_each(
    pool: WorkerPool, sent_batches: list[Batch]
) -> None:
    """An event's state has its own symbol's series only: with two symbols taking
    turns, each keeps its window in the worker and each batch carries one candle."""
    for i in range(3):
        for symbol in ("BTC-USD", "ETH-USD"):
            whole = state({symbol: {"1m": candles(i, 4, symbol)}})
            results = await pool.evaluate("turns", [LAST_CLOSES], EVENT, whole)
            decision = results[0].decision
            assert decision is not None and decision.reason == f"{symbol}:4:{100 + i + 3}"
    sizes = [[len(d.new) for d in b.series or []] for b in sent_batches]
    assert sizes == [[4], [4], [1], [1], [1], [1]]
