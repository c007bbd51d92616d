"""``fetch_sentiment_data``: a sentiment query, the news it finds and a score, in one
call (seed 002).

The configured sources (``[tools.sentiment]``: news feeds, a search API, the
Fear & Greed index) are asked **concurrently**; whatever has answered after
15 s is used, and a source that failed, timed out or was not configured is a
warning. The call never raises, and with nothing at all it still answers a
neutral score (15 of 30). The score is deterministic
(:mod:`daemon.tools.sentiment_score`), so the model may override it but a
test can assert it.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable
from functools import partial
from typing import Annotated, Final

import aiohttp
import anyio
import msgspec

from daemon.errors import FeedError
from daemon.tools.base import Tool
from daemon.tools.context import ToolContext
from daemon.tools.news import FearGreed, Headline, parse_fear_greed, parse_feed, parse_search
from daemon.tools.sentiment_score import read_headline, score, summary
from feeds.http import read_capped

BUDGET_SECONDS: Final = 15.0
MAX_CONTEXT_CHARS: Final = 200

# Names news uses for the most traded bases; any other base is matched by its ticker.
NAMES: Final = {
    "BTC": ("Bitcoin",), "ETH": ("Ethereum", "Ether"), "SOL": ("Solana",),
    "XRP": ("Ripple", "XRP"), "DOGE": ("Dogecoin",), "ADA": ("Cardano",),
    "AVAX": ("Avalanche",), "LINK": ("Chainlink",), "DOT": ("Polkadot",),
    "LTC": ("Litecoin",), "BCH": ("Bitcoin Cash",), "POL": ("Polygon",),
    "MATIC": ("Polygon",), "SHIB": ("Shiba Inu",), "UNI": ("Uniswap",),
    "ATOM": ("Cosmos",), "XLM": ("Stellar",), "SUI": ("Sui",), "NEAR": ("NEAR Protocol",),
    "APT": ("Aptos",), "ARB": ("Arbitrum",), "OP": ("Optimism",), "PEPE": ("Pepe",),
}  # fmt: skip

Symbol = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9]{1,20}(-[A-Za-z0-9]{1,20})?$")]


class SentimentRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The asset and, optionally, why it is being looked at."""

    symbol: Annotated[
        Symbol, msgspec.Meta(description="A product id (BTC-USD) or a base asset (BTC).")
    ]
    context: Annotated[
        str,
        msgspec.Meta(
            max_length=1000,
            description="Optional: what prompted the look (e.g. 'up 12% in 24h'); "
            "its first words are added to the search query.",
        ),
    ] = ""


class WebResult(msgspec.Struct, frozen=True, kw_only=True):
    """One headline with its lexicon reading (+ positive, - negative, 0 neutral)."""

    title: str
    snippet: str
    url: str
    source: str
    published: str | None
    polarity: int


class SentimentData(msgspec.Struct, frozen=True, kw_only=True):
    """Seed 002's response, plus the index and the score's parts."""

    symbol: str
    sentiment_query: str
    web_results: list[WebResult]
    sentiment_summary: str
    suggested_sentiment_score: int
    fear_greed: FearGreed | None
    warnings: list[str]
    success: bool


def base_of(symbol: str) -> str:
    """``BTC-USD`` -> ``BTC``."""
    return symbol.split("-", 1)[0].upper()


def sentiment_query(symbol: str, context: str) -> str:
    """The search query: the asset's name and ticker, the context's first words."""
    base = base_of(symbol)
    name = NAMES.get(base, (base,))[0]
    words = " ".join(context.split())
    if len(words) > MAX_CONTEXT_CHARS:  # whole words only
        words = words[: MAX_CONTEXT_CHARS + 1].rsplit(" ", 1)[0]
    lead = f"{name} {base}" if name.upper() != base else base
    return f"{lead} crypto price news catalysts {words}".strip()


def mentions(symbol: str) -> Callable[[Headline], bool]:
    """Whether a headline is about the asset: its name (any case) or its ticker
    (upper case, or with a ``$``), as a whole word."""
    base = base_of(symbol)
    names = "|".join(re.escape(n) for n in NAMES.get(base, ()))
    name_re = re.compile(rf"\b(?:{names})\b", re.IGNORECASE) if names else None
    ticker_re = re.compile(rf"(?:\$|\b){re.escape(base)}\b")

    def about(h: Headline) -> bool:
        text = f"{h.title} {h.snippet}"
        return bool(ticker_re.search(text) or (name_re is not None and name_re.search(text)))

    return about


async def _get(session: aiohttp.ClientSession, url: str, limit: int) -> bytes:
    async with session.get(url) as resp:
        if resp.status != 200:
            raise FeedError(f"HTTP {resp.status}")
        return await read_capped(resp, limit, url)


async def fetch_sentiment_data(ctx: ToolContext, req: SentimentRequest) -> msgspec.Struct:
    """Every source at once, cut at the 15 s budget; never raises."""
    refused = ctx.present_only(
        "fetch_sentiment_data",
        "news, web search and the Fear & Greed index",
        "score sentiment as neutral (15 of 30) and decide on the market data",
    )
    if refused is not None:
        return refused
    cfg = ctx.sentiment
    query = sentiment_query(req.symbol, req.context)
    about = mentions(req.symbol)
    warnings: list[str] = []
    found: dict[str, list[Headline]] = {}
    index: list[FearGreed] = []
    started: list[str] = []
    finished: set[str] = set()

    async def ask(label: str, work: Callable[[], Awaitable[None]]) -> None:
        started.append(label)
        try:
            with anyio.fail_after(cfg.request_timeout_seconds):
                await work()
        except TimeoutError:
            warnings.append(f"{label}: no answer within {cfg.request_timeout_seconds:g} s")
        except (aiohttp.ClientError, FeedError, OSError) as exc:
            warnings.append(f"{label}: {exc or type(exc).__name__}")
        finished.add(label)

    def feed(session: aiohttp.ClientSession, url: str) -> Callable[[], Awaitable[None]]:
        async def work() -> None:
            body = await _get(session, url, cfg.max_body_bytes)
            items = await anyio.to_thread.run_sync(parse_feed, body, url)
            found[url] = [h for h in items if about(h)]

        return work

    async def search(session: aiohttp.ClientSession) -> None:
        body = {"query": query, "topic": "news", "max_results": cfg.max_results}
        headers = {"authorization": f"Bearer {cfg.search_api_key.reveal()}"}
        async with session.post(cfg.search_url, json=body, headers=headers) as resp:
            if resp.status != 200:
                raise FeedError(f"HTTP {resp.status}")
            answer = await read_capped(resp, cfg.max_body_bytes, cfg.search_url)
        found[cfg.search_url] = parse_search(answer, "search")

    async def fear_greed(session: aiohttp.ClientSession) -> None:
        index.append(parse_fear_greed(await _get(session, cfg.fear_greed_url, cfg.max_body_bytes)))

    session = ctx.http
    if not cfg.configured:
        warnings.append("no sentiment sources are configured ([tools.sentiment] in config.toml)")
    elif session is None:
        warnings.append("sentiment sources are configured but no HTTP session is open")
    else:
        with anyio.move_on_after(BUDGET_SECONDS):
            async with anyio.create_task_group() as tg:
                if cfg.search_url:
                    tg.start_soon(ask, "web search", partial(search, session))
                for url in cfg.rss_feeds:
                    tg.start_soon(ask, f"news feed {url}", feed(session, url))
                if cfg.fear_greed_url:
                    tg.start_soon(ask, "Fear & Greed index", partial(fear_greed, session))
        cut = [label for label in started if label not in finished]
        warnings += [f"{label}: cut at the {BUDGET_SECONDS:g} s budget" for label in cut]

    # Search results first (they answer the query), then feeds in configured order.
    order = [cfg.search_url, *cfg.rss_feeds]
    headlines = _unique(h for src in order for h in found.get(src, []))[: cfg.max_results]
    fng = index[0] if index else None
    result = score(headlines, fng)
    return SentimentData(
        symbol=req.symbol,
        sentiment_query=query,
        web_results=[
            WebResult(
                title=h.title,
                snippet=h.snippet,
                url=h.url,
                source=h.source,
                published=h.published,
                polarity=max(-1, min(1, read_headline(h).value)),
            )
            for h in headlines
        ],
        sentiment_summary=summary(result, fng),
        suggested_sentiment_score=result.score,
        fear_greed=fng,
        warnings=sorted(warnings),
        success=bool(found or index),
    )


def _unique(headlines: Iterable[Headline]) -> list[Headline]:
    """The same story from two sources once (by URL, else title)."""
    seen: set[str] = set()
    out: list[Headline] = []
    for h in headlines:
        key = h.url or h.title.lower()
        if key not in seen:
            seen.add(key)
            out.append(h)
    return out


TOOL: Tool[SentimentRequest, ToolContext] = Tool(
    name="fetch_sentiment_data",
    title="Sentiment (news, web search, Fear & Greed) in one call",
    description=(
        "Fetch all sentiment data for one asset in ONE call: builds the news query, "
        "searches the configured news sources and the web, and reads the crypto Fear & "
        "Greed index, all at once. Returns the headlines (`web_results`, each with a "
        "polarity of +1/0/-1), a `sentiment_summary` naming the catalysts found, and a "
        "`suggested_sentiment_score` out of 30 (15 = neutral) from a fixed lexicon; "
        "override it if the headlines say otherwise. Call it once per asset; when "
        "`warnings` lists a source that failed, use what came back and do not retry."
    ),
    request=SentimentRequest,
    run=fetch_sentiment_data,
    timeout_seconds=BUDGET_SECONDS + 5.0,
)
