"""The state cache: recent candles, incremental indicators and last ticks.

Fed with FeedEvents from the bus, it keeps per (symbol, timeframe) a bounded
ring buffer of closed candles and the :class:`~daemon.indicators.CandleIndicators`
updated once per close, plus the last tick per product and optionally the
forming candle. :meth:`StateCache.export` turns it into plain JSON-compatible
data, which becomes the hooks' read-only ``state`` (shape in docs/state.md).

A candle whose ``closeTimeMs`` is not newer than the series' last one is
ignored and counted: the poller emits each close exactly once, but a replay,
a recording played twice or a restart may re-emit, and feeding the same close
twice into an EMA would silently corrupt it. Bad payloads are counted, never
raised: one malformed event must not take the daemon down.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from itertools import islice
from pathlib import Path
from typing import Any

import msgspec

from daemon.atomicfile import write_atomic
from daemon.config import StateSection
from daemon.copytrade.book import BookSnapshot, LeaderBook
from daemon.errors import NOT_JSON, StoreError
from daemon.events import (
    COPYTRADE_SIGNALS,
    MARKET_CANDLE_CLOSED,
    MARKET_CANDLE_UPDATED,
    MARKET_PRICE_TICK,
    TIMEFRAMES,
    Candle,
    FeedEvent,
    IdentityMemo,
    candle_of,
    parse_iso_ms,
    signal_of,
)
from daemon.indicators import CandleIndicators

_msgpack = msgspec.msgpack.Encoder()

DEFAULT_EXPORT_CANDLES = 50
SNAPSHOT_VERSION = 1


class _SnapshotSeries(msgspec.Struct, frozen=True):
    symbol: str
    timeframe: str
    candles: list[dict[str, Any]]


class _Snapshot(msgspec.Struct, frozen=True):
    version: int
    series: list[_SnapshotSeries]
    copytrade: BookSnapshot = msgspec.field(default_factory=BookSnapshot)


def _store_form(candle: Candle) -> tuple[dict[str, Any], msgspec.Raw]:
    payload = candle.payload()
    return payload, msgspec.Raw(_msgpack.encode(payload))


_stored = IdentityMemo(_store_form, 256)


class Series:
    """Closed candles, indicators and the forming candle of one (symbol, timeframe).

    Candles are kept already in their exported dict form (built once per close),
    so an export only copies dicts instead of converting structs every time, and
    as msgpack (encoded once per close) for the sandbox requests, which send the
    same window again, moved by one candle, on every event.
    """

    __slots__ = ("candles", "encoded", "forming", "indicators", "last_close_ms", "step_ms")

    def __init__(self, timeframe: str, max_candles: int) -> None:
        self.candles: deque[dict[str, Any]] = deque(maxlen=max_candles)
        self.encoded: deque[msgspec.Raw] = deque(maxlen=max_candles)
        self.indicators = CandleIndicators()
        self.forming: Candle | None = None
        self.last_close_ms: int | None = None
        seconds = TIMEFRAMES.get(timeframe)
        self.step_ms = None if seconds is None else seconds * 1000

    def last(self, n: int | None) -> list[dict[str, Any]]:
        """Copies of the newest ``n`` candles (all if None), oldest first, in O(n)."""
        if n is None or n >= len(self.candles):
            return [c.copy() for c in self.candles]
        if n <= 0:
            return []
        newest = [c.copy() for c in islice(reversed(self.candles), n)]
        newest.reverse()
        return newest

    def append(self, candle: Candle) -> None:
        """Keep a closed candle, as its payload and its msgpack (both built once per
        candle, whichever caches keep it: they only ever hand out copies)."""
        entry, encoded = _stored(candle)
        self.candles.append(entry)
        self.encoded.append(encoded)

    def last_encoded(self, n: int | None) -> list[msgspec.Raw]:
        """The msgpack of the newest ``n`` candles (all if None), oldest first."""
        if n is None or n >= len(self.encoded):
            return list(self.encoded)
        if n <= 0:
            return []
        newest = list(islice(reversed(self.encoded), n))
        newest.reverse()
        return newest


class StateCache:
    """Per-series candle buffers and indicators, and last ticks, from bus events."""

    def __init__(
        self, max_candles: int = 500, *, max_series: int = 1024, max_products: int = 4096
    ) -> None:
        if max_candles < 1:
            raise ValueError(f"max_candles must be at least 1, got {max_candles}")
        self.max_candles = max_candles
        self.max_series = max_series
        self.max_products = max_products
        self._series: dict[str, dict[str, Series]] = {}
        self._ticks: dict[str, dict[str, Any]] = {}
        self._n_series = 0
        self.copytrade = LeaderBook()  # the leaders' positions, from copytrade.signal.*
        self._counters = dict.fromkeys(
            (
                "closed",
                "duplicates_ignored",
                "out_of_order_ignored",
                "gaps",
                "malformed",
                "forming_updates",
                "ticks",
                "dropped_over_limit",
            ),
            0,
        )

    @classmethod
    def from_config(cls, section: StateSection) -> StateCache:
        """A cache sized by the ``[state]`` config section."""
        return cls(section.max_candles)

    # --- feeding ------------------------------------------------------------

    def apply(self, event: FeedEvent) -> bool:
        """Take one bus event; True if the cache changed. Other topics are ignored."""
        if event.topic == MARKET_CANDLE_CLOSED:
            return self._on_closed(event)
        if event.topic == MARKET_PRICE_TICK:
            return self._on_tick(event)
        if event.topic == MARKET_CANDLE_UPDATED:
            return self._on_forming(event)
        if event.topic.startswith(COPYTRADE_SIGNALS):
            return self._on_signal(event)
        return False

    def _on_signal(self, event: FeedEvent) -> bool:
        signal = signal_of(event.payload)
        if signal is None:
            self._counters["malformed"] += 1
            return False
        return self.copytrade.apply(signal) not in ("duplicate", "dropped")

    def _series_for(self, symbol: str | None, timeframe: str | None) -> Series | None:
        if not symbol or not timeframe:
            self._counters["malformed"] += 1
            return None
        by_tf = self._series.get(symbol)
        series = by_tf.get(timeframe) if by_tf is not None else None
        if series is not None:
            return series
        if self._n_series >= self.max_series:
            self._counters["dropped_over_limit"] += 1
            return None
        series = Series(timeframe, self.max_candles)
        self._series.setdefault(symbol, {})[timeframe] = series
        self._n_series += 1
        return series

    def _candle_of(self, payload: Any) -> Candle | None:
        candle = candle_of(payload)
        if candle is None:
            self._counters["malformed"] += 1
        return candle

    def _on_closed(self, event: FeedEvent) -> bool:
        return self.add_closed(event.symbol, event.timeframe, event.payload)

    def add_closed(self, symbol: str | None, timeframe: str | None, payload: Any) -> bool:
        """Take one closed-candle payload for a series; False if ignored (and counted)."""
        candle = self._candle_of(payload)
        series = self._series_for(symbol, timeframe) if candle is not None else None
        if candle is None or series is None:
            return False
        last = series.last_close_ms
        if last is not None and candle.close_time_ms <= last:
            key = "duplicates_ignored" if candle.close_time_ms == last else "out_of_order_ignored"
            self._counters[key] += 1
            return False
        if last is not None and series.step_ms and candle.close_time_ms - last > series.step_ms:
            self._counters["gaps"] += 1
        series.append(candle)
        series.last_close_ms = candle.close_time_ms
        series.indicators.update(candle.high, candle.low, candle.close)
        if series.forming is not None and series.forming.close_time_ms <= candle.close_time_ms:
            series.forming = None
        self._counters["closed"] += 1
        return True

    def seed(self, symbol: str, timeframe: str, payloads: Iterable[Any]) -> int:
        """Prime a series with history (oldest first) so indicators are warm at startup.

        The candle poller only emits closes from its first poll on, so without
        this EMA200 on 5m would need 17 hours of uptime. The same checks as live
        closes apply: a later live close overlapping the history is a duplicate.
        Returns how many candles were taken.
        """
        return sum(self.add_closed(symbol, timeframe, p) for p in payloads)

    def dump(self) -> bytes:
        """Every series' candle buffer as JSON, to carry the cache across a restart."""
        snap = _Snapshot(
            version=SNAPSHOT_VERSION,
            series=[
                _SnapshotSeries(symbol=sym, timeframe=tf, candles=list(series.candles))
                for sym, by_tf in self._series.items()
                for tf, series in by_tf.items()
            ],
            copytrade=self.copytrade.dump(),
        )
        return msgspec.json.encode(snap)

    def load(self, data: bytes) -> int:
        """Re-feed the candles of a :meth:`dump` (rebuilding the indicators); count taken.

        Call before the feeds start. Bad candles inside are counted as malformed;
        an unreadable snapshot raises :exc:`StoreError` and changes nothing.
        """
        try:
            snap = msgspec.json.decode(data, type=_Snapshot)
        except NOT_JSON as exc:
            raise StoreError(f"state snapshot is not readable: {exc}") from None
        if snap.version != SNAPSHOT_VERSION:
            raise StoreError(
                f"state snapshot has version {snap.version}, expected {SNAPSHOT_VERSION}"
            )
        self.copytrade.load(snap.copytrade)
        return sum(self.seed(s.symbol, s.timeframe, s.candles) for s in snap.series)

    def _on_forming(self, event: FeedEvent) -> bool:
        candle = self._candle_of(event.payload)
        series = self._series_for(event.symbol, event.timeframe) if candle is not None else None
        if candle is None or series is None:
            return False
        if series.last_close_ms is not None and candle.close_time_ms <= series.last_close_ms:
            return False  # a late update of a candle that has already closed
        series.forming = candle
        self._counters["forming_updates"] += 1
        return True

    def _on_tick(self, event: FeedEvent) -> bool:
        payload = event.payload if isinstance(event.payload, dict) else {}
        product = event.symbol or payload.get("productId") or payload.get("product_id")
        if not isinstance(product, str) or not product:
            self._counters["malformed"] += 1
            return False
        if product not in self._ticks and len(self._ticks) >= self.max_products:
            self._counters["dropped_over_limit"] += 1
            return False
        tick = dict(payload)
        tick["ts"] = event.ts
        self._ticks[product] = tick
        self._counters["ticks"] += 1
        return True

    # --- reading --------------------------------------------------------------

    def export(
        self,
        symbols: Iterable[str] | None = None,
        *,
        timeframes: Iterable[str] | None = None,
        candles: int | None = DEFAULT_EXPORT_CANDLES,
        encoded: bool = False,
    ) -> dict[str, Any]:
        """Plain JSON-compatible data (fresh objects, safe to hand out).

        ``symbols``/``timeframes`` restrict the series (None = all); ``candles``
        is how many of the newest closed candles per series (None = the whole
        buffer, 0 = none), since the full buffer on every event is costly to
        ship to a sandboxed hook. ``encoded``: each candle as its msgpack
        (``msgspec.Raw``, for a msgpack encoder only), not a dict.
        """
        if isinstance(symbols, str):
            symbols = [symbols]
        wanted = list(self._series) if symbols is None else list(dict.fromkeys(symbols))
        tf_filter = None if timeframes is None else frozenset(timeframes)
        out: dict[str, Any] = {"candles": {}, "forming": {}, "indicators": {}}
        for symbol in wanted:
            for tf, series in self._series.get(symbol, {}).items():
                if tf_filter is None or tf in tf_filter:
                    self._export_series(out, symbol, tf, series, candles, encoded)
        ticks_keys = self._ticks if symbols is None else wanted
        out["ticks"] = {p: dict(self._ticks[p]) for p in ticks_keys if p in self._ticks}
        return out

    @staticmethod
    def _export_series(
        out: dict[str, Any],
        symbol: str,
        tf: str,
        series: Series,
        candles: int | None,
        encoded: bool = False,
    ) -> None:
        window = series.last_encoded(candles) if encoded else series.last(candles)
        out["candles"].setdefault(symbol, {})[tf] = window
        out["indicators"].setdefault(symbol, {})[tf] = series.indicators.export()
        if series.forming is not None:
            out["forming"].setdefault(symbol, {})[tf] = series.forming.payload()

    def series(self, symbol: str, timeframe: str) -> Series | None:
        """The live series object (for in-process readers; do not mutate)."""
        return self._series.get(symbol, {}).get(timeframe)

    def symbols(self) -> list[str]:
        """Every symbol with a series or a tick, sorted."""
        return sorted({*self._series, *self._ticks})

    def newest_ms(self) -> int | None:
        """The time of the newest thing held (a candle's close, a tick): the market
        time of a replay, for readers that are not an agent (O(series), not per event)."""
        times = [int(s.candles[-1]["closeTimeMs"]) for by_tf in self._series.values()
                 for s in by_tf.values() if s.candles]  # fmt: skip
        for tick in self._ticks.values():
            try:
                times.append(parse_iso_ms(str(tick.get("ts"))))
            except ValueError:
                continue
        return max(times, default=None)

    def tick(self, symbol: str) -> dict[str, Any] | None:
        """A copy of ``symbol``'s last tick payload (with its event ``ts``), if any."""
        tick = self._ticks.get(symbol)
        return dict(tick) if tick is not None else None

    def last_price(self, symbol: str) -> float | None:
        """``symbol``'s price as last seen: its last tick's, else the newest close of
        any of its series (a replay of candles has no ticks)."""
        price = self._ticks.get(symbol, {}).get("price")
        if isinstance(price, int | float) and not isinstance(price, bool) and price > 0:
            return float(price)
        newest = self._newest_close(symbol)
        return float(newest["close"]) if newest is not None else None

    def last_close_ms(self, symbol: str) -> int | None:
        """When the newest closed candle of any of ``symbol``'s series closed."""
        newest = self._newest_close(symbol)
        return int(newest["closeTimeMs"]) if newest is not None else None

    def _newest_close(self, symbol: str) -> dict[str, Any] | None:
        closes = [s.candles[-1] for s in self._series.get(symbol, {}).values() if s.candles]
        return max(closes, key=lambda c: int(c["closeTimeMs"])) if closes else None

    def statistics(self) -> dict[str, int]:
        """Counters for status and logs: sizes, accepted and ignored events."""
        held = sum(len(s.candles) for by_tf in self._series.values() for s in by_tf.values())
        return {
            "series": self._n_series,
            "candles_held": held,
            "products": len(self._ticks),
            **self._counters,
        }


def write_snapshot(path: Path, data: bytes) -> None:
    """Write a :meth:`StateCache.dump` atomically (temp file, fsync, rename).

    Blocking file I/O: call it from a worker thread; take the dump itself on
    the event loop, where the cache is mutated.
    """
    try:
        write_atomic(path, data)
    except OSError as exc:
        raise StoreError(f"{path}: cannot write state snapshot: {exc}") from None


def read_snapshot(path: Path) -> bytes | None:
    """The snapshot bytes, or None if there is none yet (first run)."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StoreError(f"{path}: cannot read state snapshot: {exc}") from None
