"""Recorded Coinbase Advanced Trade messages as the events the daemon publishes.

A recording has one WebSocket text message per line, exactly as Coinbase sent
it, or wrapped with the time it arrived as ``{"recv_ts": <epoch s>, "raw":
"<message>"}`` (what cryptofeed-style recorders write). Each ``ticker`` message
becomes the same ``market.price.tick`` events, with the same ids, that
:class:`~feeds.coinbase_ws.feed.CoinbaseWsFeed` publishes for it live, so a
replay of a session's raw messages is the session as the daemon saw it.

``candles`` messages (five-minute buckets: a snapshot of the last ones, then
the forming one re-sent as it changes) become ``market.candle.closed`` 5m
candles, each once, with the ids the REST candle poller gives the same bucket
(``coinbase:<product>:5m:<close ms>``). A bucket is closed once a later one of
its product has started; the bucket still forming when the recording ends is
left out (it never closed). Coinbase sends one snapshot per product, back to
back (hours of history each): the buckets of consecutive snapshots are held and
published merged in time order, before the next line that carries anything
else, so event time does not jump back from one product's history to the next.

Other messages (heartbeats, subscriptions, other channels, errors) carry no
event and are left out. Sans I/O: a line in, events out; a line that is neither
is a :exc:`FeedProtocolError`.
"""

from __future__ import annotations

from typing import Final

import msgspec

from daemon.errors import NOT_JSON, FeedProtocolError
from daemon.events import Candle, FeedEvent
from feeds.candles.protocol import closed_event
from feeds.coinbase_ws.feed import tick_event
from feeds.coinbase_ws.pool import Tick
from feeds.coinbase_ws.protocol import CandlesFrame, TickerFrame, parse_frame

# A recording's connection number: its ticks are never the first after a reconnect.
RECORDED_CONNECTION: Final = 1
_MAX_RECV_TS: Final = 1e11  # epoch seconds past year 5000: a time in ms or ns, not s
# A closed bucket's id is the REST candle poller's for it: the same candle, one id.
CANDLE_SOURCE: Final = "coinbase"
# Snapshot buckets held to merge by time (Coinbase's snapshot is ~100 per product).
MAX_HISTORY: Final = 100_000
CANDLE_TIMEFRAME: Final = "5m"


class _Line(msgspec.Struct):
    """What tells a wrapped line from a bare message, and a marketwake recording."""

    raw: str | None = None
    recv_ts: float | None = None
    event_id: str | None = msgspec.field(default=None, name="eventId")
    channel: str | None = None
    type: str | None = None


_line_decoder = msgspec.json.Decoder(_Line)


class RecordedLine(msgspec.Struct, frozen=True, kw_only=True):
    """One line's events (ticks, or candles it closed), each with its event time
    (ms); ``other``: the message was neither a ticker nor a candles message."""

    events: list[tuple[int, FeedEvent]]
    other: bool = False


def _head(line: str | bytes) -> _Line:
    try:
        return _line_decoder.decode(line)
    except (*NOT_JSON, msgspec.ValidationError) as exc:
        raise FeedProtocolError(f"not a Coinbase message: {exc}") from None


def is_coinbase_message(line: str | bytes) -> bool:
    """Whether ``line`` looks like a recorded Coinbase message (bare or wrapped)
    rather than a marketwake FeedEvent; for telling the formats apart."""
    try:
        head = _head(line)
    except FeedProtocolError:
        return False
    named = head.raw is not None or head.channel is not None or head.type is not None
    return head.event_id is None and named


class Recording:
    """One recording's lines, in order: the candles channel's buckets close across
    lines (a bucket is final once a later one starts), so one reader per file."""

    def __init__(self) -> None:
        self._forming: dict[str, Candle] = {}  # per product: its newest bucket
        self._closed: dict[str, int] = {}  # per product: the open time last published
        # Closed buckets of the snapshots read since the last line with other events.
        self._history: list[tuple[int, FeedEvent]] = []

    def parse(self, line: str | bytes) -> RecordedLine:
        """The events of one recorded line; FeedProtocolError if it is not a Coinbase
        Advanced Trade message."""
        head = message = _head(line)
        if head.event_id is not None:
            raise FeedProtocolError(
                "a marketwake FeedEvent (it has an eventId), not a Coinbase message: "
                "replay it as format jsonl"
            )
        received: int | None = None
        if head.raw is not None:
            message = _head(head.raw)
            if head.recv_ts is not None:
                if not 0 <= head.recv_ts < _MAX_RECV_TS:
                    raise FeedProtocolError(f"recv_ts {head.recv_ts!r} is not epoch seconds")
                received = round(head.recv_ts * 1000)
        if message.channel is None and message.type not in (None, "error"):
            raise FeedProtocolError(
                f"a {message.type[:40]!r} message without a channel is from Coinbase's older "
                "Exchange feed (ws-feed); only Advanced Trade messages replay"
            )
        frame = parse_frame(line if head.raw is None else head.raw)
        if isinstance(frame, CandlesFrame):
            at = received if received is not None else frame.ts_ms
            closed = self._candles(frame, at)
            if frame.snapshot:
                self._history += closed
                if len(self._history) <= MAX_HISTORY:
                    return RecordedLine(events=[])
                closed = []  # a file of nothing but snapshots: memory stays bounded
            return RecordedLine(events=self._after_history(closed))
        if not isinstance(frame, TickerFrame):  # heartbeats, subscriptions, errors, ...
            return RecordedLine(events=[], other=True)
        return RecordedLine(events=self._after_history(_ticks(frame, received)))

    def finish(self) -> list[tuple[int, FeedEvent]]:
        """At the end of the file: the snapshots' buckets still held."""
        return self._after_history([])

    def _after_history(self, events: list[tuple[int, FeedEvent]]) -> list[tuple[int, FeedEvent]]:
        """``events``, after the held snapshot buckets, all in time order."""
        if not self._history:
            return events
        merged, self._history = sorted([*self._history, *events], key=lambda e: e[0]), []
        return merged

    def _candles(self, frame: CandlesFrame, received: int | None) -> list[tuple[int, FeedEvent]]:
        """The buckets this message closes: those before the newest bucket of their
        product (counting the one held from earlier lines), not published before."""
        buckets: dict[str, dict[int, Candle]] = {}
        for c in frame.candles:  # a later version of a bucket in one message wins
            buckets.setdefault(c.product_id, {})[c.candle.open_time_ms] = c.candle
        out: list[tuple[int, FeedEvent]] = []
        for product, by_start in buckets.items():
            held = self._forming.get(product)
            if held is not None and held.open_time_ms not in by_start:
                by_start[held.open_time_ms] = held  # this message's own version is newer
            starts = sorted(by_start)
            self._forming[product] = by_start[starts[-1]]
            done = self._closed.get(product, -1)
            for start in starts[:-1]:
                if start > done:
                    out.append(_closed(product, by_start[start], received))
                    self._closed[product] = done = start
        return sorted(out, key=lambda e: e[0])


def parse_recorded(line: str | bytes) -> RecordedLine:
    """The events of one recorded line on its own (no candle closes across lines:
    use a :class:`Recording` for a file)."""
    recording = Recording()
    line_events = recording.parse(line)
    return RecordedLine(events=[*line_events.events, *recording.finish()], other=line_events.other)


def _ticks(frame: TickerFrame, received: int | None) -> list[tuple[int, FeedEvent]]:
    if not frame.tickers:
        return []
    at = frame.ts_ms if frame.ts_ms is not None else received
    if at is None:
        raise FeedProtocolError("a ticker message without a timestamp (and no recv_ts)")
    ticks = []
    for ticker in frame.tickers:
        tick = Tick(
            ticker=ticker,
            timestamp=frame.timestamp,
            ts_ms=frame.ts_ms,
            received_ms=received if received is not None else at,
            sequence_num=frame.sequence_num,
            connection=RECORDED_CONNECTION,
            stale_after_reconnect=False,
        )
        ticks.append((at, tick_event(tick)))
    return ticks


def _closed(product: str, candle: Candle, received: int | None) -> tuple[int, FeedEvent]:
    """A closed bucket as the REST poller would publish it (same id, same payload)."""
    close_ms = candle.close_time_ms
    event = closed_event(
        candle,
        source=CANDLE_SOURCE,
        symbol=product,
        timeframe=CANDLE_TIMEFRAME,
        received_ms=max(received, close_ms) if received is not None else close_ms,
    )
    return close_ms, event
