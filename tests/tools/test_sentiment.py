"""fetch_sentiment_data: sources asked at once, a deterministic score, partial on failure."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import anyio
import msgspec
import pytest
from aiohttp import web

from daemon.config import SentimentSection, ToolsSection, parse
from daemon.errors import ConfigError
from daemon.secret import Secret
from daemon.tools import registry, sentiment
from daemon.tools.base import ToolError
from daemon.tools.context import ToolContext
from daemon.tools.news import Headline, SourceError, parse_fear_greed, parse_feed, parse_search
from daemon.tools.sentiment import SentimentData, mentions, sentiment_query
from daemon.tools.sentiment_score import read_headline, score
from tests.loopback import serve_app

RSS = b"""<?xml version="1.0" encoding="UTF-8"?>
<rss version="2.0"><channel><title>Crypto desk</title>
<item><title>Bitcoin ETF inflows surge as institutional demand returns</title>
  <link>https://news.test/a</link><description>&lt;p&gt;Funds took in &amp;amp; more.&lt;/p&gt;</description>
  <pubDate>Tue, 24 Nov 2026 10:00:00 GMT</pubDate></item>
<item><title>Ethereum developers schedule upgrade</title><link>https://news.test/b</link></item>
<item><title>Exchange hacked; BTC withdrawals halted</title><link>https://news.test/c</link></item>
<item><title>Bitcoin price steady ahead of Fed meeting</title><link>https://news.test/d</link></item>
<item><title>Crypto market update</title><link>https://news.test/e</link></item>
</channel></rss>"""

ATOM = b"""<?xml version="1.0" encoding="utf-8"?>
<feed xmlns="http://www.w3.org/2005/Atom"><title>Chain news</title>
<entry><title>Bitcoin miners did not sell off despite crash fears</title>
  <link href="https://chain.test/1"/><updated>2026-11-24T09:00:00Z</updated>
  <summary>Hash rate held.</summary></entry>
<entry><title>$BTC rally extends to record high</title>
  <link href="https://chain.test/2"/><updated>2026-11-24T08:00:00Z</updated></entry>
</feed>"""

SEARCH = {
    "query": "ignored",
    "results": [
        {"title": "Bitcoin rebounds after liquidations", "url": "https://s.test/1",
         "content": "Shorts were squeezed.", "score": 0.9},
        {"title": "Bitcoin adoption grows in Latin America", "url": "https://s.test/2",
         "content": "", "score": 0.8, "published_date": "2026-11-23"},
        {"title": "Bitcoin ETF inflows surge as institutional demand returns",
         "url": "https://news.test/a", "content": "same story", "score": 0.7},
    ],
    "response_time": 0.4,
}  # fmt: skip

FNG = {
    "name": "Fear and Greed Index",
    "data": [{"value": "72", "value_classification": "Greed", "timestamp": "1795478400"}],
    "metadata": {"error": None},
}


class Sources:
    """News feeds, a Tavily-style search and the Fear & Greed index on loopback;
    ``broken`` names the ones that misbehave and how."""

    def __init__(self, broken: dict[str, str] | None = None) -> None:
        self.broken = broken or {}
        self.searches: list[tuple[str | None, dict[str, Any]]] = []
        self.release = anyio.Event()

    async def _trouble(self, name: str) -> web.StreamResponse | None:
        how = self.broken.get(name)
        if how == "500":
            return web.json_response({"error": "down"}, status=500)
        if how == "garbage":
            return web.Response(body=b"<html>not a feed{", content_type="text/html")
        if how == "hang":
            await self.release.wait()
        if how == "huge":
            return web.Response(body=b"x" * (3 * 1024 * 1024), content_type="text/plain")
        return None

    async def rss(self, request: web.Request) -> web.StreamResponse:
        return await self._trouble("rss") or web.Response(body=RSS, content_type="text/xml")

    async def atom(self, request: web.Request) -> web.StreamResponse:
        return await self._trouble("atom") or web.Response(body=ATOM, content_type="text/xml")

    async def search(self, request: web.Request) -> web.StreamResponse:
        self.searches.append((request.headers.get("authorization"), await request.json()))
        return await self._trouble("search") or web.json_response(SEARCH)

    async def fng(self, request: web.Request) -> web.StreamResponse:
        return await self._trouble("fng") or web.json_response(FNG)


@asynccontextmanager
async def context(
    broken: dict[str, str] | None = None, **overrides: Any
) -> AsyncIterator[tuple[ToolContext, Sources]]:
    fake = Sources(broken)
    app = web.Application()
    app.router.add_get("/rss", fake.rss)
    app.router.add_get("/atom", fake.atom)
    app.router.add_post("/search", fake.search)
    app.router.add_get("/fng/", fake.fng)
    async with serve_app(app) as url, aiohttp.ClientSession() as session:
        fields: dict[str, Any] = {
            "rss_feeds": [f"{url}/rss", f"{url}/atom"],
            "search_url": f"{url}/search",
            "search_api_key": Secret("tvly-test"),
            "fear_greed_url": f"{url}/fng/",
        } | overrides
        try:
            yield ToolContext(sentiment=SentimentSection(**fields), http=session), fake
        finally:
            fake.release.set()


async def call(ctx: ToolContext, **args: Any) -> SentimentData:
    out = await registry().call(ctx, "fetch_sentiment_data", {"symbol": "BTC-USD", **args})
    assert isinstance(out, SentimentData), out
    return out


async def test_every_source_at_once_and_the_score_is_the_documented_arithmetic() -> None:
    """Search first, then the feeds in order, the duplicate story once, only items
    about Bitcoin: 3 positive, 1 negative, 3 neutral headlines -> news = 2 / 6;
    index 72 -> 0.44; 0.7 * 0.3333 + 0.3 * 0.44 = 0.3653 -> floor(15 + 5.48 + 0.5) = 20."""
    async with context() as (ctx, fake):
        out = await call(ctx, context="up 12% in 24h on ETF news")
    assert out.success and out.warnings == []
    assert (
        out.sentiment_query == "Bitcoin BTC crypto price news catalysts up 12% in 24h on ETF news"
    )
    assert fake.searches == [
        (
            "Bearer tvly-test",
            {"query": out.sentiment_query, "topic": "news", "max_results": 8},
        )
    ]
    assert [(r.title, r.polarity) for r in out.web_results] == [
        ("Bitcoin rebounds after liquidations", 0),
        ("Bitcoin adoption grows in Latin America", 1),
        ("Bitcoin ETF inflows surge as institutional demand returns", 1),
        ("Exchange hacked; BTC withdrawals halted", -1),
        ("Bitcoin price steady ahead of Fed meeting", 0),
        ("Bitcoin miners did not sell off despite crash fears", 0),
        ("$BTC rally extends to record high", 1),
    ]
    assert out.web_results[2].source == "search"  # the search had it first
    assert out.fear_greed is not None and out.fear_greed.value == 72
    assert out.suggested_sentiment_score == 20
    assert out.sentiment_summary == (
        "7 headlines: 3 positive, 1 negative, 3 neutral; positive catalysts: adoption, "
        "inflows, institutional, rally, rebounds; negative catalysts: hacked, halted, "
        "liquidations; "
        "Fear & Greed index 72 (Greed). Suggested sentiment score 20/30 (15 = neutral)."
    )


async def test_failed_sources_are_warnings_and_the_rest_still_scores() -> None:
    """The search answers 500, the Atom feed is HTML, the index hangs past the request
    timeout: the RSS feed alone gives 1 positive and 1 negative -> news 0 -> 15."""
    broken = {"search": "500", "atom": "garbage", "fng": "hang"}
    async with context(broken, request_timeout_seconds=0.5) as (ctx, _):
        with anyio.fail_after(10):
            out = await call(ctx)
    assert out.success
    assert [w.split(":")[0] for w in out.warnings] == [
        "Fear & Greed index",
        "news feed http",
        "web search",
    ]
    assert "no answer within 0.5 s" in out.warnings[0]
    assert "not an RSS or Atom feed" in out.warnings[1]
    assert out.warnings[2] == "web search: HTTP 500"
    assert len(out.web_results) == 3 and out.fear_greed is None
    assert out.suggested_sentiment_score == 15


async def test_a_source_past_the_whole_budget_is_cut_and_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sentiment, "BUDGET_SECONDS", 0.5)
    async with context({"rss": "hang"}) as (ctx, _):
        with anyio.fail_after(10):
            out = await call(ctx)
    assert any(w.endswith("/rss: cut at the 0.5 s budget") for w in out.warnings), out.warnings
    assert out.success and out.fear_greed is not None


async def test_an_oversized_answer_is_refused_not_buffered() -> None:
    async with context({"search": "huge"}, rss_feeds=[], fear_greed_url="") as (ctx, _):
        out = await call(ctx)
    assert not out.success and out.suggested_sentiment_score == 15
    assert out.warnings == [
        f"web search: {ctx.sentiment.search_url}: the answer is over 2097152 bytes"
    ]


async def test_nothing_configured_is_a_neutral_answer_with_a_warning() -> None:
    out = await call(ToolContext())
    assert not out.success and out.web_results == [] and out.suggested_sentiment_score == 15
    assert out.warnings == [
        "no sentiment sources are configured ([tools.sentiment] in config.toml)"
    ]
    assert out.sentiment_summary == (
        "No headlines were found. Suggested sentiment score 15/30 (15 = neutral)."
    )


async def test_bad_arguments_are_a_tool_error() -> None:
    out = await registry().call(ToolContext(), "fetch_sentiment_data", {"symbol": "btc usd"})
    assert isinstance(out, ToolError) and out.error == "invalid_arguments"
    assert out.problems[0].path == "symbol"


# --- sans-I/O: the parsers and the lexicon, on bytes and strings ---


def test_rss_items_are_plain_text_with_links_and_dates() -> None:
    items = parse_feed(RSS, "rss")
    assert len(items) == 5
    assert items[0].snippet == "Funds took in & more."
    assert items[0].url == "https://news.test/a"
    assert items[0].published == "Tue, 24 Nov 2026 10:00:00 GMT"


def test_atom_entries_parse_and_garbage_is_a_source_error() -> None:
    items = parse_feed(ATOM, "atom")
    assert [i.url for i in items] == ["https://chain.test/1", "https://chain.test/2"]
    with pytest.raises(SourceError, match="not an RSS or Atom feed"):
        parse_feed(b"\x00\x01 definitely not xml <", "x")


def test_a_feed_url_inside_the_body_is_never_fetched() -> None:
    """feedparser fetches a str that looks like a URL; the parser only reads bytes."""
    with pytest.raises(SourceError):
        parse_feed(b"http://127.0.0.1:9/never", "x")


def test_search_and_index_answers() -> None:
    results = parse_search(msgspec.json.encode(SEARCH), "search")
    assert [r.url for r in results][:2] == ["https://s.test/1", "https://s.test/2"]
    assert results[1].published == "2026-11-23"
    assert parse_fear_greed(msgspec.json.encode(FNG)).classification == "Greed"
    for bad in (
        b"{}",
        b'{"data": []}',
        b'{"data": [{"value": "x"}]}',
        b'{"data":[{"value":"101"}]}',
    ):
        with pytest.raises(SourceError):
            parse_fear_greed(bad)
    with pytest.raises(SourceError):
        parse_search(b'{"results": "no"}', "search")


def test_negation_and_phrases() -> None:
    def value(title: str) -> int:
        return read_headline(Headline(title=title, snippet="", url="", source="t")).value

    assert value("Bitcoin rally") == 1
    assert value("No rally for Bitcoin") == 0
    assert value("Stocks hit a record high") == 1
    assert value("Ether at a record low after sell-off") == -2
    assert value("Whales sell off") == -1


def test_score_bounds_and_weights() -> None:
    bull = [
        Headline(title="surge rally gains", snippet="", url=str(i), source="t") for i in range(50)
    ]
    assert score(bull, None).score == 29  # 50 / 52 of the way up, never past 30
    assert score([], None).score == 15 and score([], None).news is None


def test_query_and_relevance_of_other_assets() -> None:
    assert sentiment_query("SOL", "") == "Solana SOL crypto price news catalysts"
    assert sentiment_query("FOO-USD", "") == "FOO crypto price news catalysts"
    about = mentions("ETH-USD")
    h = Headline(title="Ether climbs", snippet="", url="", source="t")
    assert about(h)
    assert not about(Headline(title="Bitcoin climbs, eth flat", snippet="", url="", source="t"))


def test_source_urls_are_checked_in_config() -> None:
    with pytest.raises(ValueError, match="rss_feeds"):
        SentimentSection(rss_feeds=["ftp://x"])
    with pytest.raises(ConfigError, match="search_url"):
        parse('[tools.sentiment]\nsearch_url = "not a url"\n', "config.toml")
    assert ToolsSection().sentiment.configured is False
