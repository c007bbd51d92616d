"""Recorded Coinbase Advanced Trade messages as the ticks the live feed publishes.

A recording has one WebSocket text message per line, exactly as Coinbase sent
it, or wrapped with the time it arrived as ``{"recv_ts": <epoch s>, "raw":
"<message>"}`` (what cryptofeed-style recorders write). Each ``ticker`` message
becomes the same ``market.price.tick`` events, with the same ids, that
:class:`~feeds.coinbase_ws.feed.CoinbaseWsFeed` publishes for it live, so a
replay of a session's raw messages is the session as the daemon saw it.

Other messages (heartbeats, subscriptions, other channels, errors) carry no
tick and are left out. Sans I/O: a line in, events out; a line that is neither
is a :exc:`FeedProtocolError`.
"""

from __future__ import annotations

from typing import Final

import msgspec

from daemon.errors import FeedProtocolError
from daemon.events import FeedEvent
from feeds.coinbase_ws.feed import tick_event
from feeds.coinbase_ws.pool import Tick
from feeds.coinbase_ws.protocol import TickerFrame, parse_frame

# A recording's connection number: its ticks are never the first after a reconnect.
RECORDED_CONNECTION: Final = 1
_MAX_RECV_TS: Final = 1e11  # epoch seconds past year 5000: a time in ms or ns, not s


class _Line(msgspec.Struct):
    """What tells a wrapped line from a bare message, and a marketwake recording."""

    raw: str | None = None
    recv_ts: float | None = None
    event_id: str | None = msgspec.field(default=None, name="eventId")
    channel: str | None = None
    type: str | None = None


_line_decoder = msgspec.json.Decoder(_Line)


class RecordedLine(msgspec.Struct, frozen=True, kw_only=True):
    """One line's ticks, each with its event time (ms); ``other``: the message was
    not a ticker message (nothing to publish)."""

    ticks: list[tuple[int, FeedEvent]]
    other: bool = False


def _head(line: str | bytes) -> _Line:
    try:
        return _line_decoder.decode(line)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
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


def parse_recorded(line: str | bytes) -> RecordedLine:
    """The ticks of one recorded line; FeedProtocolError if it is not a Coinbase
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
    if not isinstance(frame, TickerFrame):  # heartbeats, subscriptions, errors, ...
        return RecordedLine(ticks=[], other=True)
    if not frame.tickers:
        return RecordedLine(ticks=[])
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
    return RecordedLine(ticks=ticks)
