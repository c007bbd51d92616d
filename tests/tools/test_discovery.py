"""discover_event against a loopback fake of DFlow's Metadata API (seed 003)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import msgspec
import pytest
from aiohttp import web

from daemon.config import DflowSection
from daemon.secret import Secret
from daemon.tools import registry
from daemon.tools.base import ToolError
from daemon.tools.context import ToolContext
from daemon.tools.dflow import USDC_MINT, WireMarket, indicative, mints
from daemon.tools.discovery import PRICE_NOTE, DiscoverResult
from tests.loopback import serve_app

CASH_MINT = "CASHx9KJUStyftLFWGvEVf59SGeG9sh5FfcnZMVPCASH"
SERIES = [
    {"ticker": "KXBTCD", "title": "Bitcoin daily", "category": "Crypto", "tags": ["BTC"]},
    {"ticker": "KXETHD", "title": "Ether daily", "category": "Crypto", "tags": ["ETH"]},
    {"ticker": "KXEPL", "title": "Premier League", "category": "Sports", "tags": ["Soccer"]},
]


def market(ticker: str, status: str = "active", **kw: Any) -> dict[str, Any]:
    accounts = {
        CASH_MINT: {"yesMint": f"{ticker}-cash-yes", "noMint": f"{ticker}-cash-no"},
        USDC_MINT: {"yesMint": f"{ticker}-yes", "noMint": f"{ticker}-no", "isInitialized": True},
    }
    return {"ticker": ticker, "title": f"{ticker} title", "status": status, "result": "",
            "volume": 1000, "openInterest": 300, "accounts": accounts, **kw}  # fmt: skip


def event(ticker: str, series: str, title: str, markets: list[dict[str, Any]]) -> dict[str, Any]:
    return {"ticker": ticker, "seriesTicker": series, "title": title, "subtitle": "",
            "volume": sum(m["volume"] for m in markets), "volume24h": 50, "markets": markets}  # fmt: skip


EVENTS = [
    event("KXBTCD-26NOV25", "KXBTCD", "Bitcoin price on Nov 25, 2026?", [
        market("KXBTCD-26NOV25-T1", yesBid="0.6500", yesAsk="0.6700", noBid="0.3300", noAsk="0.3500"),
        market("KXBTCD-26NOV25-T2", yesBid="0.2000"),
        market("KXBTCD-26NOV25-T3", status="determined", result="yes"),
    ]),
    event("KXETHD-26NOV25", "KXETHD", "Ether price on Nov 25, 2026?", [
        market("KXETHD-26NOV25-T1", yesAsk="0.4000") | {"accounts": {"yesMint": "e-yes", "noMint": "e-no"}},
    ]),
    event("KXEPL-26NOV25", "KXEPL", "Arsenal vs Wolves", [market("KXEPL-26NOV25-ARS")]),
    event("KXBTCD-26NOV24", "KXBTCD", "Bitcoin price on Nov 24, 2026?", [
        market("KXBTCD-26NOV24-T1", status="determined", result="no"),
    ]),
] + [
    event(f"KXBTCD-26OCT{d:02d}", "KXBTCD",
          f"Bitcoin {'above 100k' if d % 3 == 0 else 'range'} on Oct {d}?",
          [market(f"KXBTCD-26OCT{d:02d}-T1")])
    for d in range(1, 25)
]  # fmt: skip


class FakeDflow:
    """The Metadata API's endpoints over EVENTS/SERIES; ``fail`` forces a status."""

    def __init__(self, fail: int | None = None) -> None:
        self.fail = fail
        self.requests: list[tuple[str, dict[str, str], str | None]] = []

    def _seen(self, request: web.Request) -> web.Response | None:
        query = dict(request.query)
        self.requests.append((request.path, query, request.headers.get("x-api-key")))
        if self.fail:
            return web.json_response({"code": str(self.fail), "msg": "boom"}, status=self.fail)
        return None

    @staticmethod
    def _page(events: list[dict[str, Any]], q: dict[str, str]) -> web.Response:
        start, size = int(q.get("cursor", "0")), int(q.get("limit", "100"))
        page = events[start : start + size]
        more = start + size < len(events)
        return web.json_response({"events": page, "cursor": start + size if more else None})

    async def events(self, request: web.Request) -> web.Response:
        if (bad := self._seen(request)) is not None:
            return bad
        q = request.query
        out = EVENTS
        if "seriesTickers" in q:
            out = [e for e in out if e["seriesTicker"] in q["seriesTickers"].split(",")]
        if "status" in q:
            out = [e for e in out if any(m["status"] == q["status"] for m in e["markets"])]
        return self._page(out, dict(q))

    async def one_event(self, request: web.Request) -> web.Response:
        if (bad := self._seen(request)) is not None:
            return bad
        for e in EVENTS:
            if e["ticker"] == request.match_info["ticker"]:
                return web.json_response(e)
        return web.json_response({"code": "404", "msg": "Not found"}, status=404)

    async def series(self, request: web.Request) -> web.Response:
        if (bad := self._seen(request)) is not None:
            return bad
        q = request.query
        out = [s for s in SERIES if "category" not in q or s["category"] == q["category"]]
        if "tags" in q:
            out = [s for s in out if set(q["tags"].split(",")) & set(s["tags"])]
        return web.json_response({"series": out})

    async def tags(self, request: web.Request) -> web.Response:
        if (bad := self._seen(request)) is not None:
            return bad
        body = {"Crypto": ["BTC", "ETH"], "Sports": ["Soccer"], "Politics": None}
        return web.json_response({"tagsByCategories": body})

    async def search(self, request: web.Request) -> web.Response:
        if (bad := self._seen(request)) is not None:
            return bad
        words = request.query["q"].lower().split()
        out = [e for e in EVENTS if all(w in e["title"].lower() for w in words)]
        return self._page(out, dict(request.query))


@asynccontextmanager
async def dflow(
    fail: int | None = None, key: str = ""
) -> AsyncIterator[tuple[ToolContext, FakeDflow]]:
    fake = FakeDflow(fail)
    app = web.Application()
    app.router.add_get("/api/v1/events", fake.events)
    app.router.add_get("/api/v1/event/{ticker}", fake.one_event)
    app.router.add_get("/api/v1/series", fake.series)
    app.router.add_get("/api/v1/tags_by_categories", fake.tags)
    app.router.add_get("/api/v1/search", fake.search)
    async with serve_app(app) as url, aiohttp.ClientSession() as session:
        cfg = DflowSection(base_url=url, api_key=Secret(key))
        yield ToolContext(dflow=cfg, http=session), fake


async def discover(ctx: ToolContext, **args: Any) -> DiscoverResult:
    out = await registry().call(ctx, "discover_event", args)
    assert isinstance(out, DiscoverResult), out
    return out


async def test_browse_returns_active_events_with_nested_markets_prices_and_mints() -> None:
    async with dflow() as (ctx, fake):
        out = await discover(ctx, limit=2)
    assert out.success and [e.event_ticker for e in out.events] == [
        "KXBTCD-26NOV25",
        "KXETHD-26NOV25",
    ]
    path, query, _ = fake.requests[0]
    assert path == "/api/v1/events"
    assert query == {"withNestedMarkets": "true", "sort": "volume", "limit": "2", "cursor": "0",
                     "status": "active"}  # fmt: skip
    btc = out.events[0]
    assert [m.market_ticker for m in btc.markets] == ["KXBTCD-26NOV25-T1", "KXBTCD-26NOV25-T2"]
    t1, t2 = btc.markets
    assert (t1.yes_mint, t1.no_mint) == ("KXBTCD-26NOV25-T1-yes", "KXBTCD-26NOV25-T1-no")  # USDC
    assert t1.indicative_prices is not None and (
        t1.indicative_prices.yes,
        t1.indicative_prices.no,
    ) == (0.66, 0.34)
    assert t2.indicative_prices is not None and (
        t2.indicative_prices.yes,
        t2.indicative_prices.no,
    ) == (0.2, 0.8)
    assert t1.indicative_prices.timestamp == out.prices_as_of and out.price_note == PRICE_NOTE
    assert (btc.market_count, out.total_events, out.total_markets) == (2, 2, 3)
    assert out.events[1].markets[0].yes_mint == "e-yes"  # the older flat accounts form
    assert out.has_more and out.cursor == "2"
    assert out.filters_applied == {"status": "active", "limit": 2}


async def test_category_is_matched_loosely_and_a_typo_gets_a_suggestion() -> None:
    async with dflow() as (ctx, fake):
        out = await discover(ctx, category="crypto", limit=3)
        typo = await discover(ctx, category="cryptoo")
    assert ("/api/v1/series", {"category": "Crypto"}, None) in fake.requests
    events_query = next(q for p, q, _ in fake.requests if p == "/api/v1/events")
    assert events_query["seriesTickers"] == "KXBTCD,KXETHD"
    assert [e.event_ticker for e in out.events] == [
        "KXBTCD-26NOV25",
        "KXETHD-26NOV25",
        "KXBTCD-26OCT01",
    ]
    assert (out.events[0].category, out.events[0].series_title, out.events[0].tags) == (
        "Crypto",
        "Bitcoin daily",
        ["BTC"],
    )
    assert out.available_categories == ["Crypto", "Politics", "Sports"]
    assert out.available_series is not None and [s.ticker for s in out.available_series] == [
        "KXBTCD",
        "KXETHD",
    ]
    assert not typo.success and typo.error == "No markets found for category 'cryptoo'"
    assert (
        typo.suggestion == "Did you mean 'crypto'?"
        and typo.available_categories == out.available_categories
    )


async def test_tags_with_no_series_answer_empty_with_a_hint() -> None:
    async with dflow() as (ctx, _):
        out = await discover(ctx, tags=["BTCC"])
    assert out.success and out.events == [] and out.suggestion == "Did you mean tags ['BTC']?"


async def test_one_event_shows_all_its_markets_and_results() -> None:
    async with dflow() as (ctx, _):
        out = await discover(ctx, event_ticker="KXBTCD-26NOV25")
        gone = await discover(ctx, event_ticker="KXNOPE-1")
        only = await discover(ctx, event_ticker="KXBTCD-26NOV25", status="determined")
    (ev,) = out.events
    assert [m.status for m in ev.markets] == ["active", "active", "determined"]
    assert ev.markets[2].result == "yes" and ev.markets[2].indicative_prices is None
    assert not out.has_more and out.cursor is None
    assert not gone.success and gone.error == "No event with ticker 'KXNOPE-1'"
    assert [m.market_ticker for m in only.events[0].markets] == ["KXBTCD-26NOV25-T3"]


async def test_a_filtered_query_pages_without_skipping_or_repeating() -> None:
    """Only every third October event says 'above 100k': pages of 3 walk through them
    all, each cursor resuming right after the last event consumed upstream."""
    async with dflow() as (ctx, _):
        seen: list[str] = []
        cursor: str | None = None
        for _ in range(10):
            args: dict[str, Any] = {"series_ticker": "KXBTCD", "query": "Above 100K", "limit": 3}
            page = await discover(ctx, **args, **({"cursor": cursor} if cursor else {}))
            seen += [e.event_ticker for e in page.events]
            if not page.has_more:
                break
            cursor = page.cursor
    assert seen == [f"KXBTCD-26OCT{d:02d}" for d in range(3, 25, 3)]


async def test_a_query_alone_uses_dflow_search() -> None:
    async with dflow() as (ctx, fake):
        out = await discover(ctx, query="arsenal")
    assert fake.requests[0][0] == "/api/v1/search" and fake.requests[0][1]["q"] == "arsenal"
    assert [e.event_ticker for e in out.events] == ["KXEPL-26NOV25"]
    assert out.available_series is not None and out.available_series[0].ticker == "KXEPL"


async def test_upstream_errors_are_answers_not_exceptions() -> None:
    async with dflow(fail=429) as (ctx, _):
        limited = await discover(ctx)
    async with dflow(fail=500, key="k-123") as (ctx, fake):
        broken = await discover(ctx, series_ticker="KXBTCD")
    assert not limited.success and limited.error == "Rate limited. Try again in a few seconds."
    assert not broken.success and broken.error == "dflow API error: HTTP 500: boom"
    assert fake.requests[0][2] == "k-123"  # x-api-key when one is configured
    async with dflow() as (ctx, _):
        bad = await discover(ctx, cursor="minus-one")
        assert not bad.success and bad.error is not None and "cursor" in bad.error
    nothing = await discover(ToolContext(dflow=DflowSection(base_url="http://127.0.0.1:9")))
    assert not nothing.success and nothing.error == "dflow API error: no HTTP session is open"


async def test_bad_arguments_name_the_field() -> None:
    out = await registry().call(ToolContext(), "discover_event", {"status": "open", "limit": 500})
    assert isinstance(out, ToolError) and out.error == "invalid_arguments"
    assert out.problems[0].path in ("status", "limit")


def test_prices_and_mints_from_wire_markets() -> None:
    def m(**kw: Any) -> WireMarket:
        return msgspec.convert({"ticker": "T", **kw}, WireMarket)

    assert indicative(m(), "t") is None
    assert indicative(m(noBid="0.3", noAsk="0.5"), "t") == indicative(m(yesBid="0.6"), "t")
    assert indicative(m(yesBid="", yesAsk="1.7"), "t") is None  # empty and out-of-range prices
    assert mints(m(accounts={CASH_MINT: {"yesMint": "c-y", "noMint": "c-n"}})) == ("c-y", "c-n")
    assert mints(m()) == ("", "")


@pytest.mark.parametrize("ticker", ["../events", "a b", ""])
async def test_tickers_cannot_escape_the_path(ticker: str) -> None:
    out = await registry().call(ToolContext(), "discover_event", {"event_ticker": ticker})
    assert isinstance(out, ToolError) and out.problems[0].path == "event_ticker"
