"""Coinbase Advanced Trade WebSocket, sans I/O.

Everything here takes ``str``/``bytes`` or plain values and returns typed
values, so the wire format is tested without a socket:

* :func:`parse_frame` turns one text frame into a :data:`Frame` (or raises
  :exc:`FeedProtocolError`; callers count it and carry on).
* :func:`subscribe_message` / :func:`unsubscribe_message` build outgoing
  frames (one channel per message, as Coinbase requires).
* :class:`SubscriptionBook` ref-counts products across subscribers so the
  connection owner can send exactly the subscribe/unsubscribe diffs.
* :class:`CounterTracker` spots jumps in ``sequence_num`` and
  ``heartbeat_counter``.

Numbers arrive as JSON strings; they go through ``Decimal`` (no float parsing
surprises such as ``"1e999"`` or ``"NaN"``) and ``""`` means "missing".
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from decimal import Decimal, InvalidOperation
from typing import Any, Final, Generic, TypeVar

import msgspec

from daemon.errors import NOT_JSON, FeedProtocolError
from daemon.events import Candle, parse_iso_ms
from feeds.candles.protocol import WireCandle, wire_candle

TICKER_CHANNEL: Final = "ticker"
HEARTBEATS_CHANNEL: Final = "heartbeats"
SUBSCRIPTIONS_CHANNEL: Final = "subscriptions"
CANDLES_CHANNEL: Final = "candles"
CANDLE_SECONDS: Final = 300  # the candles channel's buckets are five minutes, always

# (wire name, payload name) of every numeric ticker field, in payload order.
TICKER_FIELDS: Final[tuple[tuple[str, str], ...]] = (
    ("price", "price"),
    ("volume_24_h", "volume24h"),
    ("price_percent_chg_24_h", "percentChange24h"),
    ("high_24_h", "high24h"),
    ("low_24_h", "low24h"),
    ("low_52_w", "low52w"),
    ("high_52_w", "high52w"),
    ("best_bid", "bestBid"),
    ("best_ask", "bestAsk"),
    ("best_bid_quantity", "bestBidQuantity"),
    ("best_ask_quantity", "bestAskQuantity"),
)
_MAX_PRODUCT_LEN: Final = 64
_MAX_START_MS: Final = 10**14  # a start past year 5000 was given in ms or ns, not seconds

Number = str | int | float | None


# --- raw wire shapes (validated by msgspec) ------------------------------------


class _Envelope(msgspec.Struct):
    channel: str | None = None
    type: str | None = None
    message: str | None = None
    timestamp: str | None = None
    sequence_num: int | None = None
    events: msgspec.Raw = msgspec.Raw(b"[]")


class _RawTicker(msgspec.Struct):
    product_id: str = ""
    price: Number = None
    volume_24_h: Number = None
    price_percent_chg_24_h: Number = None
    high_24_h: Number = None
    low_24_h: Number = None
    low_52_w: Number = None
    high_52_w: Number = None
    best_bid: Number = None
    best_ask: Number = None
    best_bid_quantity: Number = None
    best_ask_quantity: Number = None


class _TickerEvent(msgspec.Struct):
    type: str = ""
    tickers: list[_RawTicker] = msgspec.field(default_factory=list)


class _RawCandle(WireCandle):
    product_id: str = ""


class _CandlesEvent(msgspec.Struct):
    type: str = ""
    # Each bucket decoded on its own: one without a field is skipped, not the message.
    candles: list[msgspec.Raw] = msgspec.field(default_factory=list)


class _HeartbeatEvent(msgspec.Struct):
    heartbeat_counter: str | int | None = None
    current_time: str | None = None


class _SubscriptionsEvent(msgspec.Struct):
    subscriptions: dict[str, list[str]] = msgspec.field(default_factory=dict)


_envelope_decoder = msgspec.json.Decoder(_Envelope)
_ticker_events = msgspec.json.Decoder(list[_TickerEvent])
_heartbeat_events = msgspec.json.Decoder(list[_HeartbeatEvent])
_candles_events = msgspec.json.Decoder(list[_CandlesEvent])
_raw_candle = msgspec.json.Decoder(_RawCandle)
_subscription_events = msgspec.json.Decoder(list[_SubscriptionsEvent])


# --- parsed frames ---------------------------------------------------------------


class Ticker(msgspec.Struct, frozen=True, kw_only=True):
    """One ticker of a ``ticker`` message; numeric fields are floats or None."""

    product_id: str
    event_type: str
    index: int
    price: float | None = None
    volume24h: float | None = None
    percent_change24h: float | None = None
    high24h: float | None = None
    low24h: float | None = None
    low52w: float | None = None
    high52w: float | None = None
    best_bid: float | None = None
    best_ask: float | None = None
    best_bid_quantity: float | None = None
    best_ask_quantity: float | None = None

    def payload_fields(self) -> dict[str, float | None]:
        """The numeric fields with their camelCase payload names."""
        values = (
            self.price,
            self.volume24h,
            self.percent_change24h,
            self.high24h,
            self.low24h,
            self.low52w,
            self.high52w,
            self.best_bid,
            self.best_ask,
            self.best_bid_quantity,
            self.best_ask_quantity,
        )
        return {name: v for (_, name), v in zip(TICKER_FIELDS, values, strict=True)}


class TickerFrame(msgspec.Struct, frozen=True, kw_only=True):
    """A ``ticker`` message: all tickers of all its events, flattened in order.

    ``skipped`` counts tickers without a product id or a price (Coinbase has
    sent all-empty tickers); they are not delivered.
    """

    timestamp: str | None
    ts_ms: int | None
    sequence_num: int | None
    tickers: tuple[Ticker, ...]
    skipped: int = 0


class WsCandle(msgspec.Struct, frozen=True, kw_only=True):
    """One five-minute bucket of a product as a ``candles`` message gives it (the
    forming one is re-sent with new values until a later bucket starts)."""

    product_id: str
    candle: Candle


class CandlesFrame(msgspec.Struct, frozen=True, kw_only=True):
    """A ``candles`` message (a snapshot of the last buckets, or an update of the
    forming one). ``skipped`` counts candles without a product, a start or a price."""

    ts_ms: int | None
    sequence_num: int | None
    candles: tuple[WsCandle, ...]
    skipped: int = 0
    snapshot: bool = False  # the last buckets as of subscribing (history), not an update


class HeartbeatFrame(msgspec.Struct, frozen=True, kw_only=True):
    """A ``heartbeats`` message; ``counters`` are the events' heartbeat_counter values."""

    sequence_num: int | None
    counters: tuple[int, ...]


class SubscriptionsFrame(msgspec.Struct, frozen=True, kw_only=True):
    """The server's acknowledgement of what the connection is now subscribed to."""

    sequence_num: int | None
    subscriptions: dict[str, list[str]]


class ErrorFrame(msgspec.Struct, frozen=True, kw_only=True):
    """A flat ``{"type": "error", "message": ...}`` frame (it has no channel)."""

    message: str


class OtherFrame(msgspec.Struct, frozen=True, kw_only=True):
    """A well-formed message of a channel we do not handle (ignored on purpose)."""

    channel: str
    sequence_num: int | None


Frame = TickerFrame | CandlesFrame | HeartbeatFrame | SubscriptionsFrame | ErrorFrame | OtherFrame


# --- parsing ------------------------------------------------------------------------


def parse_number(value: Number) -> float | None:
    """A wire number (normally a string) as a finite float; ``""``/garbage -> None."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        value = repr(value)
    text = value.strip()
    if not text or len(text) > 64:
        return None
    try:
        dec = Decimal(text)
    except InvalidOperation:
        return None
    if not dec.is_finite():
        return None
    result = float(dec)
    return result if result not in (float("inf"), float("-inf")) else None


def product_id(text: str) -> str | None:
    """A product id as it may become a symbol (event ids, audit rows, the terminal):
    trimmed, 1 to 64 printable characters; None for anything else."""
    product = text.strip()
    if not product or len(product) > _MAX_PRODUCT_LEN or not product.isprintable():
        return None
    return product


def _parse_ticker(raw: _RawTicker, index: int, event_type: str) -> Ticker | None:
    product = product_id(raw.product_id)
    price = parse_number(raw.price)
    # A price of zero or less is no trade (hooks, the state cache and fills would
    # all take it at its word): skipped and counted, as a missing one is.
    if product is None or price is None or price <= 0:
        return None
    return Ticker(
        product_id=product,
        event_type=event_type,
        index=index,
        price=price,
        volume24h=parse_number(raw.volume_24_h),
        percent_change24h=parse_number(raw.price_percent_chg_24_h),
        high24h=parse_number(raw.high_24_h),
        low24h=parse_number(raw.low_24_h),
        low52w=parse_number(raw.low_52_w),
        high52w=parse_number(raw.high_52_w),
        best_bid=parse_number(raw.best_bid),
        best_ask=parse_number(raw.best_ask),
        best_bid_quantity=parse_number(raw.best_bid_quantity),
        best_ask_quantity=parse_number(raw.best_ask_quantity),
    )


def _frame_ms(env: _Envelope) -> int | None:
    """The message's ``timestamp`` in epoch ms (None without one)."""
    if not env.timestamp:
        return None
    try:
        return parse_iso_ms(env.timestamp)
    except ValueError:
        raise FeedProtocolError(f"bad timestamp {env.timestamp[:40]!r}") from None


def _ticker_frame(env: _Envelope, events: list[_TickerEvent]) -> TickerFrame:
    ts_ms = _frame_ms(env)
    tickers: list[Ticker] = []
    skipped = 0
    index = 0
    for event in events:
        for raw in event.tickers:
            parsed = _parse_ticker(raw, index, event.type)
            index += 1
            if parsed is None:
                skipped += 1
            else:
                tickers.append(parsed)
    return TickerFrame(
        timestamp=env.timestamp,
        ts_ms=ts_ms,
        sequence_num=env.sequence_num,
        tickers=tuple(tickers),
        skipped=skipped,
    )


def _parse_candle(data: msgspec.Raw) -> WsCandle | None:
    """The bucket, checked as the REST poller checks its candles; None if it fails."""
    try:
        raw = _raw_candle.decode(data)
    except msgspec.ValidationError:
        return None
    product = product_id(raw.product_id)
    if product is None:
        return None
    try:
        candle = wire_candle(raw, CANDLE_SECONDS * 1000)
    except FeedProtocolError:
        return None
    if candle.open_time_ms >= _MAX_START_MS:
        return None
    return WsCandle(product_id=product, candle=candle)


def _candles_frame(env: _Envelope, events: list[_CandlesEvent]) -> CandlesFrame:
    candles: list[WsCandle] = []
    skipped = 0
    snapshot = False
    for event in events:
        snapshot = snapshot or event.type == "snapshot"
        for raw in event.candles:
            parsed = _parse_candle(raw)
            if parsed is None:
                skipped += 1
            else:
                candles.append(parsed)
    return CandlesFrame(
        ts_ms=_frame_ms(env),
        sequence_num=env.sequence_num,
        candles=tuple(candles),
        skipped=skipped,
        snapshot=snapshot,
    )


def _heartbeat_frame(env: _Envelope, events: list[_HeartbeatEvent]) -> HeartbeatFrame:
    counters: list[int] = []
    for event in events:
        value = event.heartbeat_counter
        if isinstance(value, str):
            value = int(value) if value.strip().isdigit() else None
        if isinstance(value, int) and value >= 0:
            counters.append(value)
    return HeartbeatFrame(sequence_num=env.sequence_num, counters=tuple(counters))


def _decode_events(decoder: msgspec.json.Decoder[Any], env: _Envelope) -> Any:
    return decoder.decode(env.events)


def parse_frame(data: str | bytes) -> Frame:
    """Parse one text frame; raise :exc:`FeedProtocolError` if it is not Coinbase JSON."""
    try:
        env = _envelope_decoder.decode(data)
        if env.channel is None:
            if env.type == "error":
                return ErrorFrame(message=(env.message or "")[:500])
            raise FeedProtocolError(f"frame without channel (type={env.type!r})")
        if env.channel == TICKER_CHANNEL:
            return _ticker_frame(env, _decode_events(_ticker_events, env))
        if env.channel == CANDLES_CHANNEL:
            return _candles_frame(env, _decode_events(_candles_events, env))
        if env.channel == HEARTBEATS_CHANNEL:
            return _heartbeat_frame(env, _decode_events(_heartbeat_events, env))
        if env.channel == SUBSCRIPTIONS_CHANNEL:
            subs: dict[str, list[str]] = {}
            for event in _decode_events(_subscription_events, env):
                subs.update(event.subscriptions)
            return SubscriptionsFrame(sequence_num=env.sequence_num, subscriptions=subs)
        return OtherFrame(channel=env.channel[:64], sequence_num=env.sequence_num)
    except (*NOT_JSON, msgspec.ValidationError) as exc:
        raise FeedProtocolError(f"malformed frame: {exc}") from None


# --- outgoing ------------------------------------------------------------------------

_encoder = msgspec.json.Encoder()


def subscribe_message(channel: str, product_ids: Iterable[str]) -> str:
    """A subscribe frame for one channel (Coinbase takes one channel per message)."""
    return _control("subscribe", channel, product_ids)


def unsubscribe_message(channel: str, product_ids: Iterable[str]) -> str:
    """An unsubscribe frame for one channel and the given products."""
    return _control("unsubscribe", channel, product_ids)


def _control(kind: str, channel: str, product_ids: Iterable[str]) -> str:
    body = {"type": kind, "product_ids": sorted(product_ids), "channel": channel}
    return _encoder.encode(body).decode()


def diff(wanted: Iterable[str], on_wire: Iterable[str]) -> tuple[list[str], list[str]]:
    """(products to subscribe, products to unsubscribe) to move the wire to ``wanted``."""
    want, have = set(wanted), set(on_wire)
    return sorted(want - have), sorted(have - want)


# --- subscription ref counts ---------------------------------------------------------

K = TypeVar("K", bound=Hashable)


class SubscriptionBook(Generic[K]):
    """Which subscriber wants which product; a product's ref count is its holder count."""

    def __init__(self) -> None:
        self._by_key: dict[K, frozenset[str]] = {}
        self._holders: dict[str, set[K]] = {}

    def add(self, key: K, products: Iterable[str]) -> list[str]:
        """Register ``key``; return the products nobody wanted before (sorted)."""
        if key in self._by_key:
            raise ValueError("subscriber already registered")
        wanted = frozenset(products)
        self._by_key[key] = wanted
        new: list[str] = []
        for product in wanted:
            holders = self._holders.setdefault(product, set())
            if not holders:
                new.append(product)
            holders.add(key)
        return sorted(new)

    def remove(self, key: K) -> list[str]:
        """Forget ``key``; return the products nobody wants any more (sorted)."""
        gone: list[str] = []
        for product in self._by_key.pop(key, frozenset()):
            holders = self._holders[product]
            holders.discard(key)
            if not holders:
                del self._holders[product]
                gone.append(product)
        return sorted(gone)

    def holders(self, product: str) -> frozenset[K]:
        """The subscribers of ``product`` (empty if none)."""
        return frozenset(self._holders.get(product, ()))

    def refcount(self, product: str) -> int:
        """How many subscribers want ``product``."""
        return len(self._holders.get(product, ()))

    def wanted(self) -> frozenset[str]:
        """Every product at least one subscriber wants."""
        return frozenset(self._holders)

    def __len__(self) -> int:
        return len(self._by_key)


# --- gap tracking --------------------------------------------------------------------


class CounterTracker:
    """Spots jumps in a counter that should grow by one per message.

    Coinbase's ``sequence_num`` is one counter per connection across all
    channels, so a new tracker is used for every connection. A smaller or equal
    value (a replay or reorder) is ignored rather than treated as a gap.
    """

    __slots__ = ("gaps", "last", "missed")

    def __init__(self) -> None:
        self.last: int | None = None
        self.gaps = 0
        self.missed = 0

    def observe(self, value: int) -> int:
        """Record ``value``; return how many values were skipped before it (0 = none)."""
        last, self.last = self.last, value if self.last is None else max(self.last, value)
        if last is None or value <= last + 1:
            return 0
        skipped = value - last - 1
        self.gaps += 1
        self.missed += skipped
        return skipped
