"""Candle series as deltas: a worker keeps each series' window between batches, so
a batch carries the candles that came in, not the whole window (sans-I/O).

A closed candle moves a window of ``state_candles`` candles on by one: sent
whole, every batch would re-send (and the worker re-scan) some 50 candles to
change one. Here the parent keeps, per worker, the windows it has sent as
deltas (:attr:`WorkerProcess.series`); the worker keeps the same windows, and
a :class:`~hooks_runtime.protocol.SeriesDelta` says how each series of the
state moved. A series the state does not list stays held (an event's state
has its own symbol's series only: events of several symbols take turns), up
to :data:`MAX_HELD_SERIES` windows and :data:`MAX_HELD_CANDLES` candles (~16 MB
frozen in the worker), the least recently listed going first; both sides
apply that same rule to the same batches (:func:`forget_oldest`). Both start
empty with a fresh worker, so the first batch carries every candle.
"""

from __future__ import annotations

from typing import Any

import msgspec

from daemon.errors import HookCrashed
from hooks_runtime.protocol import SERIES_KEY, SeriesDelta, encode_state

MAX_HELD_SERIES = 64  # candle windows a worker keeps between batches
MAX_HELD_CANDLES = 20_000  # and candles in them

Windows = dict[tuple[str, str], list[msgspec.Raw]]
# The windows a worker holds, each with its candles' bytes (kept as they move).
Held = dict[tuple[str, str], tuple[list[msgspec.Raw], int]]


class SplitState(msgspec.Struct, frozen=True):
    """A hook state without its candles (``rest``: an empty map holds their place, so
    the keys keep their order) and the candle windows, by (symbol, timeframe)."""

    rest: msgspec.Raw
    windows: Windows


def split(state: dict[str, Any]) -> SplitState | None:
    """``state`` split when its candles are in the daemon's form (``{symbol:
    {timeframe: [candle msgpack, ...]}}``, see ``StateCache.export(encoded=True)``);
    None for any other shape (the state is then sent whole)."""
    series = state.get(SERIES_KEY)
    if type(series) is not dict:
        return None
    windows: Windows = {}
    for symbol, frames in series.items():
        if type(symbol) is not str or type(frames) is not dict or not frames:
            return None  # a symbol without series would not survive the round trip
        for tf, window in frames.items():
            if type(tf) is not str or type(window) is not list:
                return None
            if window and type(window[-1]) is not msgspec.Raw:
                return None  # plain candles (each one is checked in deltas)
            windows[symbol, tf] = window
    return SplitState(encode_state(state | {SERIES_KEY: {}}), windows)


def deltas(held: Held, now: Windows) -> tuple[list[SeriesDelta], Held, int]:
    """How each window of ``now`` moved from the one the worker holds (``held``), what
    it holds after, and the msgpack size of ``now`` as a ``{symbol: {timeframe:
    [candle, ...]}}`` map. Lists compare in C. Every candle is checked to be
    msgpack as it comes in (one equal to a held candle is: a Raw equals only a
    Raw); TypeError otherwise."""
    out, after = [], dict(held)
    frames: dict[str, int] = {}  # timeframes per symbol
    packed = 0
    for key, window in now.items():
        old, size = held.get(key, _NONE)
        n, m = len(window), len(old)
        if window == old:
            drop, new = 0, []
        elif n == m and n and window[:-1] == old[1:]:
            drop, new = 1, window[-1:]
            size += len(window[-1]) - len(old[0])
        elif n == m + 1 and window[:-1] == old:
            drop, new = 0, window[-1:]
            size += len(window[-1])
        else:
            drop, new = m, window
            size = sum(map(len, window))
        if new and set(map(type, new)) != {msgspec.Raw}:
            raise TypeError(f"series {key[0]} {key[1]} mixes encoded and plain candles")
        out.append(SeriesDelta(key[0], key[1], m, drop, new))
        after.pop(key, None)  # the most recently listed last
        after[key] = (window, size)
        frames[key[0]] = frames.get(key[0], 0) + 1
        packed += _str_size(key[1]) + _header(n, 15) + size
    forget_oldest(after)
    packed += _header(len(frames), 15)
    packed += sum(_str_size(symbol) + _header(k, 15) for symbol, k in frames.items())
    return out, after, packed


def forget_oldest(held: dict[tuple[str, str], tuple[list[Any], Any]]) -> None:
    """Keep at most :data:`MAX_HELD_SERIES` windows of :data:`MAX_HELD_CANDLES`
    candles in all: the least recently listed go (a dict keeps the order its keys
    were last inserted in)."""
    if len(held) == 1 and len(next(iter(held.values()))[0]) <= MAX_HELD_CANDLES:
        return  # one series (an agent on one symbol): nothing to count
    total = sum(len(window) for window, _ in held.values())
    while held and (len(held) > MAX_HELD_SERIES or total > MAX_HELD_CANDLES):
        total -= len(held.pop(next(iter(held)))[0])


_NONE: tuple[list[msgspec.Raw], int] = ([], 0)


def check(delta: SeriesDelta, held: int) -> None:
    """The worker's side: ``delta`` must be for the window of ``held`` candles it
    holds; if not, parent and worker are out of step and the worker must end."""
    if held != delta.held or not 0 <= delta.drop <= delta.held:
        raise HookCrashed(
            f"series {delta.symbol} {delta.timeframe}: a delta for {delta.held} candles "
            f"(drop {delta.drop}), the worker holds {held}"
        )


def deltas_size(series: list[SeriesDelta] | None) -> int:
    """The msgpack size of ``series`` (``Batch.series``)."""
    if series is None:
        return 1
    size = _header(len(series), 15)
    for d in series:
        size += 1 + _str_size(d.symbol) + _str_size(d.timeframe)
        size += _int_size(d.held) + _int_size(d.drop)
        size += _header(len(d.new), 15) + sum(map(len, d.new))
    return size


def _int_size(n: int) -> int:
    """Bytes of a non-negative msgpack int."""
    return 1 if n < 128 else 2 if n < 1 << 8 else 3 if n < 1 << 16 else 5 if n < 1 << 32 else 9


def _header(n: int, fix: int) -> int:
    """Bytes of a msgpack map or array header for ``n`` items."""
    return 1 if n <= fix else 3 if n < 1 << 16 else 5


def _str_size(s: str) -> int:
    """Bytes of a msgpack str (symbols and timeframes: a few, asked every batch)."""
    size = _STR_SIZES.get(s)
    if size is None:
        n = len(s.encode())
        size = n + (1 if n < 32 else 2 if n < 1 << 8 else 3 if n < 1 << 16 else 5)
        if len(_STR_SIZES) >= 4096:
            _STR_SIZES.clear()
        _STR_SIZES[s] = size
    return size


_STR_SIZES: dict[str, int] = {}
