"""TradingView strategy alerts as copy-trade signals (sans-I/O).

TradingView can only POST an alert's message as the body, so the documented
template (docs/copytrade.md) is JSON whose values are TradingView
placeholders, each in quotes (an unexpanded one stays valid JSON and is
refused with its name):

``ticker`` (``{{exchange}}:{{ticker}}``), ``action``
(``{{strategy.order.action}}``), ``contracts``
(``{{strategy.order.contracts}}``), ``marketPosition`` /
``prevMarketPosition`` (``{{strategy.market_position}}`` /
``{{strategy.prev_market_position}}``), ``orderId``
(``{{strategy.order.id}}``), ``price`` (``{{close}}``), ``time``
(``{{timenow}}``); optionally ``positionSize`` (``{{strategy.position_size}}``)
and ``passphrase``.

:func:`parse_alert` checks a body; :class:`TvMapper` turns alerts into
signals by position transition: flat to long/short is ``opened``; a size
change on the same side is ``modified`` with the new size; to flat is
``closed``; long to short (or back) is ``closed`` then ``opened``. An
alert's id is its order id and time, so TradingView delivering it twice
makes the second a no-op.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
from typing import Literal

import msgspec

from daemon.errors import SignalRejected
from daemon.events import MAX_AMOUNT, SignalKind, SignalPayload, iso_ms, parse_iso_ms
from feeds.copytrade.protocol import decode_body

SOURCE = "tradingview"
# The alert message to paste into TradingView (docs/copytrade.md shows the same).
# Every value is quoted: an unexpanded placeholder is still JSON, and is named.
ALERT_TEMPLATE = """{
  "ticker": "{{exchange}}:{{ticker}}",
  "action": "{{strategy.order.action}}",
  "contracts": "{{strategy.order.contracts}}",
  "positionSize": "{{strategy.position_size}}",
  "marketPosition": "{{strategy.market_position}}",
  "prevMarketPosition": "{{strategy.prev_market_position}}",
  "orderId": "{{strategy.order.id}}",
  "price": "{{close}}",
  "time": "{{timenow}}"
}"""
EPS = 1e-12
_PLACEHOLDER = re.compile(r"\{\{\s*([^{}]{1,64}?)\s*\}\}")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
Position = Literal["long", "short", "flat"]


class TvAlert(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """One alert as the template sends it, checked and typed."""

    ticker: str
    action: Literal["buy", "sell"]
    contracts: float
    market_position: Position
    prev_market_position: Position
    order_id: str
    price: float | None = None
    time: str  # RFC 3339, normalised to milliseconds
    position_size: float | None = None  # absolute size after the order, if sent

    @property
    def alert_id(self) -> str:
        """Order id and time: what makes a second delivery a duplicate."""
        safe = _UNSAFE.sub("-", self.order_id).strip("-")[:40] or "order"
        digest = hashlib.blake2b(self.order_id.encode(), digest_size=4).hexdigest()
        return f"{safe}-{digest}.{parse_iso_ms(self.time)}"


class _Wire(msgspec.Struct, kw_only=True, rename="camel", forbid_unknown_fields=True):
    ticker: str
    action: str
    contracts: str | float
    market_position: str
    prev_market_position: str
    order_id: str
    time: str
    price: str | float | None = None
    position_size: str | float | None = None
    passphrase: str | None = None


_decoder = msgspec.json.Decoder(_Wire)


def _number(name: str, value: str | float | None, *, positive: bool) -> float | None:
    if value is None or value == "":
        return None
    try:
        number = float(value)
    except ValueError:
        raise SignalRejected(422, f"{name} must be a number (got {str(value)[:40]!r})") from None
    if not math.isfinite(number):
        raise SignalRejected(422, f"{name} must be a finite number")
    if positive and number <= 0:
        raise SignalRejected(422, f"{name} must be above 0 (got {number:g})")
    if abs(number) >= MAX_AMOUNT:  # an order's bound: what passes here can become one
        raise SignalRejected(422, f"{name} must be below 1e15 (got {number:g})")
    return number


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> str:
    value = value.strip().lower()
    if value not in allowed:
        raise SignalRejected(
            422, f"{name} must be one of {', '.join(allowed)} (got {value[:20]!r})"
        )
    return value


def parse_alert(body: bytes, content_type: str, passphrase: str = "") -> TvAlert:
    """The alert in ``body``; :exc:`SignalRejected` 415 for a text body, 400 for bad
    JSON, 422 for an unexpanded placeholder or a value out of range, 401 for a wrong
    ``passphrase`` (when one is configured)."""
    if content_type.split(";", 1)[0].strip().lower() != "application/json":
        raise SignalRejected(
            415,
            "the alert message is not JSON (TradingView sends text/plain then): "
            "paste the documented template",
        )
    wire = decode_body(_decoder, body, "alert")
    for field in wire.__struct_fields__:
        found = _PLACEHOLDER.search(str(getattr(wire, field) or ""))
        if found:
            raise SignalRejected(
                422,
                f"placeholder {{{{{found.group(1)[:40]}}}}} was not expanded "
                "(is the alert on a strategy, and the name spelt as documented?)",
            )
    if passphrase and not _same(wire.passphrase or "", passphrase):
        raise SignalRejected(401, "wrong or missing passphrase")
    try:
        at = parse_iso_ms(wire.time)
    except ValueError:
        raise SignalRejected(422, f"time must be RFC 3339 (got {wire.time[:40]!r})") from None
    if not 0 < len(wire.ticker) <= 64 or not 0 < len(wire.order_id) <= 128:
        raise SignalRejected(422, "ticker (1-64) and orderId (1-128 characters) are required")
    contracts = _number("contracts", wire.contracts, positive=True)
    if contracts is None:  # "" (an empty placeholder)
        raise SignalRejected(422, "contracts is required ({{strategy.order.contracts}})")
    size = _number("positionSize", wire.position_size, positive=False)
    return TvAlert(
        ticker=wire.ticker.strip(),
        action="buy" if _choice("action", wire.action, ("buy", "sell")) == "buy" else "sell",
        contracts=contracts,
        market_position=_position("marketPosition", wire.market_position),
        prev_market_position=_position("prevMarketPosition", wire.prev_market_position),
        order_id=wire.order_id,
        price=_number("price", wire.price, positive=True),
        time=iso_ms(at),
        position_size=abs(size) if size is not None else None,
    )


def _position(name: str, value: str) -> Position:
    got = _choice(name, value, ("long", "short", "flat"))
    return "long" if got == "long" else "short" if got == "short" else "flat"


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


def map_symbol(ticker: str, table: dict[str, str]) -> str:
    """The agents' symbol for a TradingView ticker: the table's entry for
    ``EXCHANGE:TICKER`` or ``TICKER``, else the ticker without its exchange."""
    bare = ticker.split(":", 1)[-1]
    return table.get(ticker) or table.get(bare) or bare


class Held(msgspec.Struct, kw_only=True):
    """A position the mapper has opened for a (leader, symbol)."""

    position_id: str
    side: Literal["long", "short"]
    size: float


class TvMapper:
    """Alerts to signals for one daemon, remembering the open position per
    (leader, symbol) so a position's signals share its id (see the module doc).
    ``dump`` / ``load`` keep that across restarts."""

    def __init__(self) -> None:
        self.held: dict[str, Held] = {}  # "<leader> <symbol>" -> position

    def dump(self) -> bytes:
        """The open positions, to keep with the mapping that produced them."""
        return msgspec.json.encode(self.held)

    def load(self, data: bytes) -> None:
        """Restore a :meth:`dump`."""
        self.held = msgspec.json.decode(data, type=dict[str, Held])

    def map(self, leader: str, symbol: str, alert: TvAlert) -> list[SignalPayload]:
        """The signals one alert makes (none when no position changed)."""
        key = f"{leader} {symbol}"
        held = self.held.get(key)
        now = alert.market_position
        out: list[SignalPayload] = []

        def signal(kind: SignalKind, suffix: str, h: Held, quantity: float | None) -> None:
            out.append(
                SignalPayload(
                    leader=leader,
                    signal_id=alert.alert_id + suffix,
                    kind=kind,
                    position_id=h.position_id,
                    symbol=symbol,
                    side=h.side,
                    time=alert.time,
                    quantity=quantity,
                    price=alert.price,
                )
            )

        closed = 0.0
        if held is not None and (now == "flat" or now != held.side):
            signal("closed", "" if now == "flat" else ":close", held, None)
            closed = held.size
            del self.held[key]
            held = None
        if now == "flat":
            return out
        if held is None:
            size = alert.position_size or alert.contracts
            if alert.position_size is None and closed and alert.contracts > closed + EPS:
                size = alert.contracts - closed  # a reversal's order also closed the old side
            opened = Held(position_id=alert.alert_id, side=now, size=size)
            self.held[key] = opened
            signal("opened", ":open" if out else "", opened, size)
            return out
        adds = (alert.action == "buy") == (held.side == "long")
        step = alert.contracts if adds else -alert.contracts
        size = alert.position_size if alert.position_size is not None else held.size + step
        if abs(size - held.size) > EPS and size > EPS:
            held.size = size
            signal("modified", "", held, size)
        return out
