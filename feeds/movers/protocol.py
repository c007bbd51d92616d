"""Sans-I/O part of the movers feed: parse ``GET /market/products`` and decide which
products are new movers.

A product is a mover while ``|price_percentage_change_24h| >= min_change_pct``.
It is announced once when it becomes one. The event id is
``movers:<product>:<up|down>:<UTC date>``, so a restart on the same day
re-announces it under the same id, and agents skip it as already seen.
Products that are offline, disabled or outside the quote filter are ignored,
as are numbers Coinbase leaves empty and product ids no symbol may have.
"""

from __future__ import annotations

import math
from typing import Final, Literal

import msgspec

from daemon.errors import NOT_JSON, FeedProtocolError
from daemon.events import MARKET_MOVERS_DETECTED, FeedEvent, MoverPayload, iso_ms
from feeds.coinbase_ws.protocol import product_id

SOURCE: Final = "movers"


class _WireProduct(msgspec.Struct):
    product_id: str
    price: str = ""
    price_percentage_change_24h: str = ""
    volume_24h: str = ""
    quote_currency_id: str = ""
    status: str = "online"
    trading_disabled: bool = False


class _WireProducts(msgspec.Struct):
    products: list[_WireProduct]


class Quote(msgspec.Struct, frozen=True):
    """One product's 24 h move."""

    product_id: str
    price: float
    change_pct: float
    volume_24h: float


_decoder = msgspec.json.Decoder(_WireProducts)


def _num(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def parse_products(body: bytes, quotes: frozenset[str]) -> list[Quote]:
    """The tradable products of a response (any quote when ``quotes`` is empty)."""
    try:
        wire = _decoder.decode(body)
    except (*NOT_JSON, msgspec.ValidationError) as exc:
        raise FeedProtocolError(f"products response is not the expected JSON: {exc}") from None
    out = []
    for p in wire.products:
        if p.status != "online" or p.trading_disabled:
            continue
        if quotes and p.quote_currency_id not in quotes:
            continue
        product = product_id(p.product_id)
        price, change = _num(p.price), _num(p.price_percentage_change_24h)
        if product is None or price is None or price <= 0 or change is None:
            continue
        out.append(Quote(product, price, change, _num(p.volume_24h) or 0.0))
    return out


class MoverTracker:
    """Remembers who is a mover, so each becomes an event once per move."""

    def __init__(self, min_change_pct: float, min_volume_24h: float = 0.0) -> None:
        self.min_change_pct = min_change_pct
        self.min_volume_24h = min_volume_24h
        self._moving: dict[str, str] = {}  # product -> "up" | "down"

    def update(self, quotes: list[Quote], now_ms: int) -> list[FeedEvent]:
        """The events of products that became movers since the last update."""
        events = []
        seen: dict[str, str] = {}
        for q in quotes:
            if abs(q.change_pct) < self.min_change_pct or q.volume_24h < self.min_volume_24h:
                continue
            direction: Literal["up", "down"] = "up" if q.change_pct > 0 else "down"
            seen[q.product_id] = direction
            if self._moving.get(q.product_id) != direction:
                events.append(self._event(q, direction, now_ms))
        self._moving = seen
        return events

    def _event(self, q: Quote, direction: Literal["up", "down"], now_ms: int) -> FeedEvent:
        ts = iso_ms(now_ms)
        return FeedEvent(
            event_id=f"{SOURCE}:{q.product_id}:{direction}:{ts[:10]}",
            ts=ts,
            source=SOURCE,
            topic=MARKET_MOVERS_DETECTED,
            symbol=q.product_id,
            partition_key=f"{SOURCE}:{q.product_id}",
            payload=msgspec.to_builtins(
                MoverPayload(
                    product_id=q.product_id,
                    price=q.price,
                    percent_change24h=q.change_pct,
                    volume24h=q.volume_24h,
                    direction=direction,
                    threshold_pct=self.min_change_pct,
                )
            ),
            received_ts=ts,
        )
