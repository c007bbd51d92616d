"""``discover_event``: prediction-market events with their markets, from DFlow (seed 003).

Routing follows the seed, first match wins:

1. ``event_ticker``: that event (``GET /api/v1/event/{ticker}``);
2. ``category`` and/or ``tags``: the matching series (``GET /api/v1/series``),
   then their events (``GET /api/v1/events?seriesTickers=…``, at most 25 series);
3. ``series_ticker``: that series' events;
4. ``query`` alone: DFlow's search (``GET /api/v1/search``);
5. nothing: browse the active events (``GET /api/v1/events``).

``query`` also filters every route client-side (each word must appear in the
event's or a market's title). Markets are filtered by ``status`` (default
active; a named event shows all unless a status is given) and events left
with none are dropped. ``cursor`` is DFlow's offset into the upstream list:
the returned one resumes right after the last event consumed, so a filtered
page never skips anything. The tool never raises: upstream failures are
``success: false`` with the seed's error and a suggestion.
"""

from __future__ import annotations

import difflib
import time
from typing import Annotated, Any, Final
from urllib.parse import quote

import aiohttp
import anyio
import msgspec

from daemon.errors import FeedError
from daemon.events import iso_ms
from daemon.tools.base import Tool
from daemon.tools.context import ToolContext
from daemon.tools.dflow import (
    DflowError,
    EventsPage,
    EventView,
    MarketStatus,
    SeriesList,
    TagsByCategories,
    WireEvent,
    WireSeries,
    decode,
    error_message,
    event_view,
    next_offset,
    select,
)
from feeds.http import read_capped

PRICE_NOTE: Final = "Prices are indicative snapshots. Actual execution prices may differ."
MAX_SERIES: Final = 25
SCAN_PAGE: Final = 100  # upstream page size when a query filters client-side
API: Final = "/api/v1"

Ticker = Annotated[str, msgspec.Meta(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9._-]+$")]


class DiscoverRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Seed 003's inputs; all optional."""

    query: (
        Annotated[
            str,
            msgspec.Meta(
                max_length=200, description="Search terms matched against event and market titles."
            ),
        ]
        | None
    ) = None
    category: (
        Annotated[
            str,
            msgspec.Meta(
                max_length=100, description="A category: crypto, sports, politics, economics, ..."
            ),
        ]
        | None
    ) = None
    tags: (
        Annotated[
            list[Annotated[str, msgspec.Meta(max_length=100)]],
            msgspec.Meta(max_length=20, description="Tags, e.g. ['BTC']."),
        ]
        | None
    ) = None
    series_ticker: (
        Annotated[Ticker, msgspec.Meta(description="A series, e.g. 'KXBTCD'.")] | None
    ) = None
    event_ticker: (
        Annotated[Ticker, msgspec.Meta(description="One event by ticker, with all its markets.")]
        | None
    ) = None
    status: (
        Annotated[
            MarketStatus, msgspec.Meta(description="Market status to keep (default: active).")
        ]
        | None
    ) = None
    limit: Annotated[int, msgspec.Meta(ge=1, le=50, description="Events to return.")] = 10
    cursor: (
        Annotated[
            str,
            msgspec.Meta(
                max_length=20, description="The cursor of a previous answer, for the next page."
            ),
        ]
        | None
    ) = None


class SeriesRef(msgspec.Struct, frozen=True):
    ticker: str
    title: str


class DiscoverResult(msgspec.Struct, frozen=True, omit_defaults=True):
    """Seed 003's output."""

    success: bool
    events: list[EventView] = msgspec.field(default_factory=list)
    total_events: int = 0
    total_markets: int = 0
    filters_applied: dict[str, Any] = msgspec.field(default_factory=dict)
    has_more: bool = False
    cursor: str | None = None
    price_note: str | None = None
    prices_as_of: str | None = None
    available_categories: list[str] | None = None
    available_series: list[SeriesRef] | None = None
    error: str | None = None
    suggestion: str | None = None


class RateLimited(DflowError):
    """DFlow answered 429."""


class NotFound(DflowError):
    """DFlow answered 404."""


class Client:
    """GETs against the configured DFlow base URL on the shared session."""

    def __init__(self, ctx: ToolContext) -> None:
        cfg = ctx.dflow
        if ctx.http is None:
            raise DflowError("no HTTP session is open")
        self.session = ctx.http
        self.base = cfg.base_url.rstrip("/") + API
        self.headers = {"x-api-key": cfg.api_key.reveal()} if cfg.api_key else {}
        self.timeout = cfg.request_timeout_seconds
        self.limit = cfg.max_body_bytes

    async def get(self, path: str, params: dict[str, str], tp: type[Any]) -> Any:
        url = self.base + path
        with anyio.fail_after(self.timeout):
            async with self.session.get(url, params=params, headers=self.headers) as resp:
                body = await read_capped(resp, self.limit, f"GET {path}")
                status = resp.status
        if status == 429:
            raise RateLimited("rate limited")
        if status == 404:
            raise NotFound(error_message(status, body))
        if status != 200:
            raise DflowError(error_message(status, body))
        return decode(body, tp)


def _filters(req: DiscoverRequest, status: str | None) -> dict[str, Any]:
    out = {k: v for k, v in msgspec.to_builtins(req).items() if v is not None}
    out.pop("cursor", None)
    if status is not None:
        out["status"] = status
    return out


async def discover_event(ctx: ToolContext, req: DiscoverRequest) -> msgspec.Struct:
    """Route, fetch, filter and shape; never raises."""
    refused = ctx.present_only(
        "discover_event",
        "the prediction markets DFlow lists",
        "leave prediction markets out of a replayed decision",
    )
    if refused is not None:
        return refused
    status: MarketStatus | None = req.status or (None if req.event_ticker else "active")
    filters = _filters(req, status)
    try:
        offset = int(req.cursor) if req.cursor else 0
        if offset < 0:
            raise ValueError
    except ValueError:
        return DiscoverResult(
            success=False,
            filters_applied=filters,
            error=f"cursor {req.cursor!r} is not one this tool returned",
            suggestion="pass the cursor of the previous answer unchanged, or none for page 1",
        )
    try:
        client = Client(ctx)
        return await _route(client, req, status, offset, filters)
    except RateLimited:
        return DiscoverResult(
            success=False,
            filters_applied=filters,
            error="Rate limited. Try again in a few seconds.",
        )
    except TimeoutError:
        return DiscoverResult(
            success=False,
            filters_applied=filters,
            error=f"dflow API error: no answer within {ctx.dflow.request_timeout_seconds:g} s",
        )
    except (FeedError, aiohttp.ClientError, OSError) as exc:
        return DiscoverResult(
            success=False, filters_applied=filters, error=f"dflow API error: {exc}"
        )


async def _route(
    client: Client,
    req: DiscoverRequest,
    status: MarketStatus | None,
    offset: int,
    filters: dict[str, Any],
) -> DiscoverResult:
    words = (req.query or "").lower().split()
    as_of = iso_ms(int(time.time() * 1000))
    series: dict[str, WireSeries] = {}
    categories: list[str] | None = None
    params = {"withNestedMarkets": "true"}

    if req.event_ticker:
        try:
            event = await client.get(
                f"/event/{quote(req.event_ticker, safe='')}", params, WireEvent
            )
        except NotFound:
            return DiscoverResult(
                success=False,
                filters_applied=filters,
                error=f"No event with ticker '{req.event_ticker}'",
                suggestion="Check the ticker, or list a series' events with series_ticker",
            )
        return _answer(
            [event], None, offset, req, status, words, series, categories, as_of, filters
        )

    if req.category or req.tags:
        tags_by = (await client.get("/tags_by_categories", {}, TagsByCategories)).tags_by_categories
        categories = sorted(tags_by)
        category = None
        if req.category:
            category = next((c for c in tags_by if c.lower() == req.category.lower()), None)
            if category is None:
                close = difflib.get_close_matches(
                    req.category.lower(), [c.lower() for c in categories], n=1, cutoff=0.6
                )
                named = next((c for c in categories if close and c.lower() == close[0]), None)
                return DiscoverResult(
                    success=False,
                    filters_applied=filters,
                    error=f"No markets found for category '{req.category}'",
                    suggestion=f"Did you mean '{named.lower()}'?"
                    if named
                    else "Use one of available_categories",
                    available_categories=categories,
                )
        q: dict[str, str] = {}
        if category:
            q["category"] = category
        if req.tags:
            q["tags"] = ",".join(req.tags)
        found = (await client.get("/series", q, SeriesList)).series
        series = {s.ticker: s for s in found[:MAX_SERIES]}
        if not series:
            known = sorted({t for ts in tags_by.values() for t in ts or []})
            close = [m for t in req.tags or [] for m in difflib.get_close_matches(t, known, n=1)]
            hint = f"Did you mean tags {close}?" if close else "Try broadening your search"
            return DiscoverResult(
                success=True,
                filters_applied=filters,
                suggestion=hint,
                available_categories=categories,
            )
        tickers = ",".join(series)
        page = await _events(
            client, {**params, "seriesTickers": tickers}, req, status, offset, words
        )
    elif req.series_ticker:
        page = await _events(
            client, {**params, "seriesTickers": req.series_ticker}, req, status, offset, words
        )
    elif words:
        size = str(SCAN_PAGE)
        q = {**params, "q": req.query or "", "limit": size, "cursor": str(offset)}
        page = await client.get("/search", q, EventsPage)
    else:
        page = await _events(client, {**params, "sort": "volume"}, req, status, offset, words)
    return _answer(
        page.events, page, offset, req, status, words, series, categories, as_of, filters
    )


async def _events(
    client: Client,
    params: dict[str, str],
    req: DiscoverRequest,
    status: MarketStatus | None,
    offset: int,
    words: list[str],
) -> EventsPage:
    """One upstream page: just ``limit`` events, or a larger one to filter a query in."""
    size = SCAN_PAGE if words else req.limit
    q = {**params, "limit": str(size), "cursor": str(offset)}
    if status is not None:
        q["status"] = status
    page: EventsPage = await client.get("/events", q, EventsPage)
    return page


def _answer(
    events: list[WireEvent],
    page: EventsPage | None,
    offset: int,
    req: DiscoverRequest,
    status: MarketStatus | None,
    words: list[str],
    series: dict[str, WireSeries],
    categories: list[str] | None,
    as_of: str,
    filters: dict[str, Any],
) -> DiscoverResult:
    """Filter ``events`` (an upstream page starting at ``offset``) down to ``limit``
    and say where the next page starts."""
    views: list[EventView] = []
    consumed = 0
    for event in events:
        if len(views) == req.limit:
            break
        consumed += 1
        markets = select(event, words, status)
        if markets:
            views.append(event_view(event, markets, series.get(event.series_ticker), as_of))
    upstream_next = next_offset(page) if page is not None else None
    more_here = consumed < len(events)
    next_cursor = offset + consumed if more_here or upstream_next is not None else None
    total_markets = sum(v.market_count for v in views)
    priced = any(m.indicative_prices is not None for v in views for m in v.markets)
    listed = series.values() if series else []
    refs = [SeriesRef(s.ticker, s.title) for s in listed] or _series_of(views)
    return DiscoverResult(
        success=True,
        events=views,
        total_events=len(views),
        total_markets=total_markets,
        filters_applied=filters,
        has_more=next_cursor is not None,
        cursor=str(next_cursor) if next_cursor is not None else None,
        price_note=PRICE_NOTE if priced else None,
        prices_as_of=as_of if priced else None,
        available_categories=categories,
        available_series=refs or None,
        suggestion=None if views else "Try broadening your search",
    )


def _series_of(views: list[EventView]) -> list[SeriesRef]:
    seen: dict[str, str] = {}
    for v in views:
        seen.setdefault(v.series_ticker, v.series_title or "")
    return [SeriesRef(t, title) for t, title in seen.items() if t]


TOOL: Tool[DiscoverRequest, ToolContext] = Tool(
    name="discover_event",
    title="Discover prediction-market events (DFlow)",
    description=(
        "Find prediction-market events with their markets in ONE call. Filter by "
        "event_ticker (one event), category and/or tags, series_ticker, or a free-text "
        "query (matched against titles); with no filter it browses active events by "
        "volume. Each market has its yes_mint/no_mint (for trading tools), indicative "
        "yes/no prices (0-1, a snapshot: see price_note), volume and open interest. "
        "status defaults to active; limit 1-50 (default 10); pass `cursor` back for the "
        "next page while has_more is true. On a mistake the answer says how to fix it "
        "(suggestion, available_categories)."
    ),
    request=DiscoverRequest,
    run=discover_event,
    timeout_seconds=30.0,
)
