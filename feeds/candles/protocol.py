"""Coinbase Advanced Trade public candles, without I/O.

Everything the poller decides is here as plain functions over bytes and ints so
it can be tested without a socket: request parameters for a window, parsing of
``GET /time`` and ``GET /market/products/{id}/candles`` bodies, which candles
are closed at a given server time, how to page a backfill, and the FeedEvent a
candle becomes (the replay feed builds the very same event from CSV rows).

Wire facts (shared/research/protocols.md §2): numbers arrive as strings (accept
numbers too), candles come newest first, ``start`` is UNIX seconds, a request
may span at most ~350 buckets (we page at 300), the newest bucket is still
forming, and buckets without trades may be missing.
"""

from __future__ import annotations

import hashlib
import math
from datetime import UTC
from email.utils import parsedate_to_datetime
from typing import Final

import msgspec

from daemon.errors import NOT_JSON, FeedProtocolError
from daemon.events import (
    MARKET_CANDLE_CLOSED,
    MARKET_CANDLE_UPDATED,
    MAX_MS,
    TIMEFRAMES,
    Candle,
    FeedEvent,
    candle_event_id,
    iso_ms,
    parse_iso_ms,
)

# Coinbase's granularity enum for each timeframe we support. FOUR_HOUR is
# missing from older doc lists but is accepted by the API.
GRANULARITY: Final[dict[str, str]] = {
    "1m": "ONE_MINUTE",
    "5m": "FIVE_MINUTE",
    "15m": "FIFTEEN_MINUTE",
    "30m": "THIRTY_MINUTE",
    "1h": "ONE_HOUR",
    "2h": "TWO_HOUR",
    "4h": "FOUR_HOUR",
    "6h": "SIX_HOUR",
    "1d": "ONE_DAY",
}

# Reports disagree on whether 350 buckets per request is accepted; 300 is safe.
MAX_BUCKETS_PER_REQUEST: Final = 300

# A candle is final only this long after its close: public responses are cached
# for about a second, so a body fetched right at the boundary may be stale.
SETTLE_MS: Final = 2_000

# Buckets before the high-water mark that each poll fetches again.
OVERLAP: Final = 1

_Num = str | int | float


class Window(msgspec.Struct, frozen=True):
    """Bucket open times ``[start_ms, end_ms)`` fetched by one request."""

    start_ms: int
    end_ms: int


class Plan(msgspec.Struct, frozen=True):
    """The requests of one poll of one partition, oldest first."""

    windows: list[Window]
    skipped: int  # closes older than max_backfill that will never be emitted


class WireCandle(msgspec.Struct):
    """One candle as Coinbase sends it, REST and WebSocket alike (numbers as strings;
    ``start`` the bucket's open in epoch seconds)."""

    start: _Num
    low: _Num
    high: _Num
    open: _Num
    close: _Num
    volume: _Num


class _WireCandles(msgspec.Struct):
    candles: list[WireCandle]


class _WireTime(msgspec.Struct):
    iso: str | None = None
    epochSeconds: _Num | None = None  # wire name
    epochMillis: _Num | None = None  # wire name


class _WireError(msgspec.Struct):
    error: str = ""
    error_details: str = ""
    message: str = ""


_candles_decoder = msgspec.json.Decoder(_WireCandles)
_time_decoder = msgspec.json.Decoder(_WireTime)
_error_decoder = msgspec.json.Decoder(_WireError)


def timeframe_ms(timeframe: str) -> int:
    """Milliseconds in a timeframe; FeedProtocolError names the bad value."""
    try:
        return TIMEFRAMES[timeframe] * 1000
    except KeyError:
        raise FeedProtocolError(f"unknown timeframe {timeframe!r}") from None


def derive_poll_seconds(timeframe: str) -> float:
    """A tenth of the timeframe, clamped to 10..300 s (5m -> 30 s, 1h -> 300 s)."""
    return min(300.0, max(10.0, TIMEFRAMES[timeframe] / 10))


def candle_params(window: Window, timeframe: str) -> dict[str, str]:
    """Query parameters of one candles request (UNIX seconds as strings).

    No ``limit`` is sent: if it meant "newest N" an inclusive ``end`` could push
    the oldest bucket of the page out. Buckets outside the window are dropped
    by :func:`in_window` instead.
    """
    return {
        "start": str(window.start_ms // 1000),
        "end": str(window.end_ms // 1000),
        "granularity": GRANULARITY[timeframe],
    }


def _number(value: _Num, field: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise FeedProtocolError(f"candle {field} is not a number: {value!r}") from None
    if not math.isfinite(number) or number < 0:
        raise FeedProtocolError(f"candle {field} out of range: {value!r}")
    return number


def wire_candle(wire: WireCandle, tf_ms: int) -> Candle:
    """A checked Candle (numbers finite, prices > 0 and volume >= 0, high and low
    spanning open and close, start on a bucket boundary); FeedProtocolError says what
    is wrong."""
    start_s = _number(wire.start, "start")
    if start_s != int(start_s):
        raise FeedProtocolError(f"candle start is not whole seconds: {wire.start!r}")
    start_ms = int(start_s) * 1000
    values = {f: _number(getattr(wire, f), f) for f in ("open", "high", "low", "close", "volume")}
    if values["low"] > min(values["open"], values["close"]) or values["high"] < max(
        values["open"], values["close"], values["low"]
    ):
        raise FeedProtocolError(f"candle at {wire.start!r} has inconsistent high/low")
    if values["low"] <= 0:  # (the lowest price, checked above): as a CSV's candles
        raise FeedProtocolError(f"candle at {wire.start!r} has a price of zero")
    if start_ms % tf_ms:
        raise FeedProtocolError(f"candle start {wire.start!r} is not on a bucket boundary")
    return Candle(open_time_ms=start_ms, close_time_ms=start_ms + tf_ms, **values)


def parse_candles(body: bytes, timeframe: str) -> list[Candle]:
    """Candles of a response body, oldest first, one per start time.

    Any malformed candle rejects the whole body: emitting part of a page could
    move the high-water mark past a candle we failed to read.
    """
    tf_ms = timeframe_ms(timeframe)
    try:
        wire = _candles_decoder.decode(body)
    except (*NOT_JSON, msgspec.ValidationError) as exc:
        raise FeedProtocolError(f"bad candles response: {exc} ({_snippet(body)})") from None
    by_start = {c.open_time_ms: c for c in (wire_candle(w, tf_ms) for w in wire.candles)}
    return [by_start[k] for k in sorted(by_start)]


def parse_server_time(body: bytes) -> int:
    """Server time in epoch ms from ``GET /time`` (string or numeric fields)."""
    try:
        wire = _time_decoder.decode(body)
    except (*NOT_JSON, msgspec.ValidationError) as exc:
        raise FeedProtocolError(f"bad /time response: {exc} ({_snippet(body)})") from None
    try:
        if wire.epochMillis is not None:
            ms = int(float(wire.epochMillis))
        elif wire.epochSeconds is not None:
            ms = int(float(wire.epochSeconds) * 1000)
        elif wire.iso:
            ms = parse_iso_ms(wire.iso)
        else:
            raise FeedProtocolError(f"/time response has no time field ({_snippet(body)})")
    except (ValueError, OverflowError) as exc:  # "nan", "inf", "1e999"
        raise FeedProtocolError(f"bad /time value: {exc}") from None
    if not 0 < ms <= MAX_MS:
        raise FeedProtocolError(f"bad /time value: {ms} ms is no time of day ({_snippet(body)})")
    return ms


def describe_error(status: int, body: bytes) -> str:
    """A readable message for an error response (Coinbase's error shape if present)."""
    try:
        err = _error_decoder.decode(body)
    except (*NOT_JSON, msgspec.ValidationError):
        return f"HTTP {status}: {_snippet(body)}"
    detail = err.error_details or err.message
    return f"HTTP {status} {err.error or ''}: {detail}".rstrip(": ")


def parse_retry_after(value: str | None, now_ms: int) -> float | None:
    """Seconds to wait from a Retry-After header (delta seconds or HTTP date)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - now_ms / 1000)


def _snippet(body: bytes, limit: int = 120) -> str:
    text = body[:limit].decode("utf-8", "replace")
    return repr(text) + ("..." if len(body) > limit else "")


# --- deciding what to fetch and what is closed ------------------------------


def forming_start(now_ms: int, tf_ms: int) -> int:
    """Open time of the bucket that contains ``now_ms`` (still forming)."""
    return now_ms // tf_ms * tf_ms


def is_closed(candle: Candle, server_now_ms: int, settle_ms: int = SETTLE_MS) -> bool:
    """Closed once its close time (plus a settle margin) has passed on the server clock."""
    return candle.close_time_ms + settle_ms <= server_now_ms


def plan(
    next_open_ms: int | None,
    server_now_ms: int,
    tf_ms: int,
    *,
    max_backfill: int,
    page: int = MAX_BUCKETS_PER_REQUEST,
) -> Plan:
    """Windows to fetch so every close after the high-water mark is seen, in order.

    ``next_open_ms`` is the open time of the first candle not yet emitted (the
    last emitted close), or None on a first run, which starts at the newest
    closed candle rather than replaying history as fresh closes. Windows
    start ``OVERLAP`` buckets before the mark, so consecutive polls overlap.
    The last window always reaches the forming bucket. More than ``max_backfill``
    missed closes: the oldest are skipped (and counted).
    """
    forming = forming_start(server_now_ms, tf_ms)
    first = forming - tf_ms if next_open_ms is None else next_open_ms
    oldest = forming - max(1, max_backfill) * tf_ms
    skipped = max(0, (oldest - first) // tf_ms)
    # Re-read the last published bucket too: the same request costs nothing
    # more, and the high-water check (not the window edge) is what dedupes.
    start = max(first - (0 if next_open_ms is None else OVERLAP) * tf_ms, oldest)
    start = min(start, forming)
    end = forming + tf_ms
    step = max(1, min(page, MAX_BUCKETS_PER_REQUEST)) * tf_ms
    windows = [Window(s, min(s + step, end)) for s in range(start, end, step)]
    return Plan(windows=windows, skipped=skipped)


def in_window(candles: list[Candle], window: Window) -> list[Candle]:
    """Only the buckets the window asked for (servers may include the end bucket)."""
    return [c for c in candles if window.start_ms <= c.open_time_ms < window.end_ms]


# --- events -----------------------------------------------------------------


def partition_key(source: str, symbol: str, timeframe: str) -> str:
    """The ordering key of one candle series: ``source:symbol:timeframe``."""
    return f"{source}:{symbol}:{timeframe}"


def closed_event(
    candle: Candle, *, source: str, symbol: str, timeframe: str, received_ms: int
) -> FeedEvent:
    """``market.candle.closed``; its id depends only on (source, symbol, tf, close)."""
    payload = candle.payload()
    close_iso = str(payload["closeTime"])
    return FeedEvent(
        event_id=candle_event_id(source, symbol, timeframe, candle.close_time_ms),
        ts=close_iso,
        source=source,
        topic=MARKET_CANDLE_CLOSED,
        payload=payload,
        symbol=symbol,
        timeframe=timeframe,
        partition_key=partition_key(source, symbol, timeframe),
        received_ts=close_iso if received_ms == candle.close_time_ms else iso_ms(received_ms),
    )


def updated_event(
    candle: Candle, *, source: str, symbol: str, timeframe: str, received_ms: int
) -> FeedEvent:
    """``market.candle.updated`` for the forming bucket; same values -> same id."""
    values = f"{candle.open},{candle.high},{candle.low},{candle.close},{candle.volume}"
    digest = hashlib.blake2b(values.encode(), digest_size=6).hexdigest()
    base = candle_event_id(source, symbol, timeframe, candle.close_time_ms)
    return FeedEvent(
        event_id=f"{base}:updated:{digest}",
        ts=iso_ms(received_ms),
        source=source,
        topic=MARKET_CANDLE_UPDATED,
        payload=candle.payload(),
        symbol=symbol,
        timeframe=timeframe,
        partition_key=partition_key(source, symbol, timeframe),
        received_ts=iso_ms(received_ms),
    )
