"""The DFlow Prediction Market Metadata API, parsed from bytes (sans-I/O).

Wire shapes follow DFlow's public reference (camelCase JSON): events with
nested markets, series, tags by category, and the error body
``{"code": "404", "msg": "Not found"}``. Only the fields ``discover_event``
uses are typed; unknown fields are ignored so a new API field never breaks a
call. :func:`event_view` turns a wire event into seed 003's event-centric
output, so the whole transformation is tested without a socket.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from daemon.errors import NOT_JSON, FeedError

# Settlement mints a market's ``accounts`` map is keyed by: USDC first, then CASH.
USDC_MINT = "EPjFWdd5AufqSSqeM2qN1xzybapC8G4wEGGkZwyTDt1v"

MarketStatus = Literal["active", "initialized", "determined", "finalized"]


class DflowError(FeedError):
    """The API answered something unusable."""


class WireMarket(msgspec.Struct, frozen=True, rename="camel"):
    ticker: str
    title: str = ""
    subtitle: str | None = None
    yes_sub_title: str | None = None
    status: str = ""
    result: str | None = None
    volume: float | None = None
    volume24h: float | None = msgspec.field(default=None, name="volume24h")
    open_interest: float | None = None
    yes_bid: str | float | None = None
    yes_ask: str | float | None = None
    no_bid: str | float | None = None
    no_ask: str | float | None = None
    # A map keyed by settlement mint of {yesMint, noMint, ...}; older answers have one
    # flat account. Read by :func:`mints`.
    accounts: dict[str, Any] | None = None


class WireEvent(msgspec.Struct, frozen=True, rename="camel"):
    ticker: str
    series_ticker: str = ""
    title: str = ""
    subtitle: str | None = None
    volume: float | None = None
    volume24h: float | None = msgspec.field(default=None, name="volume24h")
    markets: list[WireMarket] = msgspec.field(default_factory=list)


class WireSeries(msgspec.Struct, frozen=True, rename="camel"):
    ticker: str
    title: str = ""
    category: str = ""
    tags: list[str] = msgspec.field(default_factory=list)


class EventsPage(msgspec.Struct, frozen=True):
    """``/events`` and ``/search``: a page and the next offset (null at the end)."""

    events: list[WireEvent]
    cursor: int | str | None = None


class SeriesList(msgspec.Struct, frozen=True):
    series: list[WireSeries]


class TagsByCategories(msgspec.Struct, frozen=True, rename="camel"):
    tags_by_categories: dict[str, list[str] | None]


class _ErrorBody(msgspec.Struct, frozen=True):
    code: str | int | None = None
    msg: str = ""


def decode(body: bytes, tp: type[Any]) -> Any:
    """``body`` as ``tp``; DflowError says what did not fit."""
    try:
        return msgspec.json.decode(body, type=tp)
    except (*NOT_JSON, msgspec.ValidationError) as exc:
        raise DflowError(f"unexpected answer from dflow: {exc}") from None


def error_message(status: int, body: bytes) -> str:
    """The API's own message for a non-200 answer, else the status."""
    try:
        msg = msgspec.json.decode(body, type=_ErrorBody).msg
    except (*NOT_JSON, msgspec.ValidationError):
        msg = ""
    return f"HTTP {status}: {msg}" if msg else f"HTTP {status}"


def next_offset(page: EventsPage) -> int | None:
    """The integer offset of the next page, if there is one."""
    if page.cursor is None or page.cursor == "":
        return None
    try:
        return int(page.cursor)
    except ValueError:
        return None


# --- seed 003's output ------------------------------------------------------------


class IndicativePrices(msgspec.Struct, frozen=True):
    """Point-in-time mid prices, 0..1 (dollars per contract)."""

    yes: float
    no: float
    timestamp: str


class MarketView(msgspec.Struct, frozen=True, omit_defaults=True):
    market_ticker: str
    title: str
    status: str
    yes_mint: str
    no_mint: str
    indicative_prices: IndicativePrices | None = None
    volume_24h: float | None = None
    volume: float | None = None
    open_interest: float | None = None
    result: Literal["yes", "no"] | None = None


class EventView(msgspec.Struct, frozen=True, omit_defaults=True):
    event_ticker: str
    event_title: str
    series_ticker: str
    markets: list[MarketView]
    market_count: int
    event_subtitle: str | None = None
    series_title: str | None = None
    category: str | None = None
    tags: list[str] | None = None
    total_volume: float | None = None


def _price(value: str | float | None) -> float | None:
    if value is None or value == "":
        return None
    try:
        p = float(value)
    except ValueError:
        return None
    return p if 0.0 <= p <= 1.0 else None


def _mid(bid: float | None, ask: float | None) -> float | None:
    if bid is not None and ask is not None:
        return round((bid + ask) / 2, 4)
    return bid if bid is not None else ask


def indicative(m: WireMarket, as_of: str) -> IndicativePrices | None:
    """Mid of bid and ask per side (one side from the other when it has no quotes)."""
    yes = _mid(_price(m.yes_bid), _price(m.yes_ask))
    no = _mid(_price(m.no_bid), _price(m.no_ask))
    if yes is None and no is None:
        return None
    yes = yes if yes is not None else round(1 - (no or 0.0), 4)
    no = no if no is not None else round(1 - yes, 4)
    return IndicativePrices(yes=yes, no=no, timestamp=as_of)


def mints(m: WireMarket) -> tuple[str, str]:
    """(yes, no) mints: the USDC-settled account when there is one, else the first."""
    acc = m.accounts or {}
    if "yesMint" in acc:
        chosen: Any = acc
    else:
        usdc = acc.get(USDC_MINT)
        chosen = (
            usdc
            if isinstance(usdc, dict)
            else next((v for v in acc.values() if isinstance(v, dict)), {})
        )
    yes, no = chosen.get("yesMint"), chosen.get("noMint")
    return (yes if isinstance(yes, str) else "", no if isinstance(no, str) else "")


def market_view(m: WireMarket, as_of: str) -> MarketView:
    yes_mint, no_mint = mints(m)
    result = m.result if m.result in ("yes", "no") else None
    return MarketView(
        market_ticker=m.ticker,
        title=m.title or m.yes_sub_title or m.ticker,
        status=m.status,
        yes_mint=yes_mint,
        no_mint=no_mint,
        indicative_prices=indicative(m, as_of),
        volume_24h=m.volume24h,
        volume=m.volume,
        open_interest=m.open_interest,
        result=result,  # type: ignore[arg-type]
    )


def event_view(
    e: WireEvent, markets: list[WireMarket], series: WireSeries | None, as_of: str
) -> EventView:
    """One event of the answer, with the given (already filtered) markets."""
    views = [market_view(m, as_of) for m in markets]
    return EventView(
        event_ticker=e.ticker,
        event_title=e.title,
        event_subtitle=e.subtitle or None,
        series_ticker=e.series_ticker,
        series_title=series.title if series is not None else None,
        category=series.category if series is not None else None,
        tags=series.tags if series is not None and series.tags else None,
        markets=views,
        market_count=len(views),
        total_volume=e.volume,
    )


def matches(text: str, words: list[str]) -> bool:
    """Every query word appears in ``text`` (case-insensitive substring)."""
    low = text.lower()
    return all(w in low for w in words)


def select(e: WireEvent, words: list[str], status: MarketStatus | None) -> list[WireMarket]:
    """The markets of ``e`` to show: those with ``status`` (any when None), and, for
    a query, all of them when the event's own text matches, else those whose text
    does. Empty when nothing is left (the event is dropped)."""
    markets = [m for m in e.markets if status is None or m.status == status]
    if words and not matches(f"{e.ticker} {e.title} {e.subtitle or ''}", words):
        markets = [
            m
            for m in markets
            if matches(f"{m.ticker} {m.title} {m.subtitle or ''} {m.yes_sub_title or ''}", words)
        ]
    return markets
