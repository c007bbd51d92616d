"""The sentiment sources' answers, parsed from bytes (sans-I/O).

Three optional sources feed ``fetch_sentiment_data``: news feeds (RSS or Atom,
read with feedparser), a Tavily-compatible web search API, and the crypto
Fear & Greed index (alternative.me's format). Each parser takes the body as
received and returns typed records or raises :class:`SourceError` saying what
was wrong; none of them does I/O, so each is tested with bytes.
"""

from __future__ import annotations

import html
import io
import re
from typing import Any

import feedparser
import msgspec

from daemon.errors import NOT_JSON, FeedError

# Text kept per headline: enough for the lexicon and the model, bounded.
MAX_TITLE_CHARS = 300
MAX_SNIPPET_CHARS = 600
_TAG = re.compile(r"<[^>]*>")
_SPACE = re.compile(r"\s+")


class SourceError(FeedError):
    """A source answered, but not with something usable."""


class Headline(msgspec.Struct, frozen=True, kw_only=True):
    """One news item or search result, as the model sees it."""

    title: str
    snippet: str
    url: str
    source: str
    published: str | None = None


class FearGreed(msgspec.Struct, frozen=True, kw_only=True):
    """The index today: 0 (extreme fear) to 100 (extreme greed)."""

    value: int
    classification: str


def plain(text: str, limit: int) -> str:
    """Markup stripped, entities decoded, whitespace collapsed, cut to ``limit``."""
    out = _SPACE.sub(" ", html.unescape(_TAG.sub(" ", text))).strip()
    return out if len(out) <= limit else out[: limit - 1].rstrip() + "…"


def parse_feed(body: bytes, source: str) -> list[Headline]:
    """The entries of an RSS or Atom document, in feed order."""
    # A stream, never the bytes or a str: feedparser would fetch a str that looks like a URL.
    parsed: Any = feedparser.parse(io.BytesIO(body))
    entries = parsed.get("entries") or []
    if not entries and parsed.get("bozo"):
        raise SourceError(f"not an RSS or Atom feed ({parsed.get('bozo_exception')})")
    out = []
    for entry in entries:
        title = plain(str(entry.get("title", "")), MAX_TITLE_CHARS)
        if not title:
            continue
        published = entry.get("published") or entry.get("updated")
        out.append(
            Headline(
                title=title,
                snippet=plain(str(entry.get("summary", "")), MAX_SNIPPET_CHARS),
                url=str(entry.get("link", "")),
                source=source,
                published=str(published) if published else None,
            )
        )
    return out


class _SearchResult(msgspec.Struct, frozen=True):
    title: str = ""
    url: str = ""
    content: str = ""
    published_date: str | None = None


class _SearchAnswer(msgspec.Struct, frozen=True):
    results: list[_SearchResult]


def parse_search(body: bytes, source: str) -> list[Headline]:
    """A Tavily-style ``/search`` answer: ``{"results": [{title, url, content}]}``."""
    try:
        answer = msgspec.json.decode(body, type=_SearchAnswer)
    except NOT_JSON as exc:
        raise SourceError(f"unexpected search answer: {exc}") from None
    return [
        Headline(
            title=plain(r.title, MAX_TITLE_CHARS),
            snippet=plain(r.content, MAX_SNIPPET_CHARS),
            url=r.url,
            source=source,
            published=r.published_date,
        )
        for r in answer.results
        if r.title.strip()
    ]


class _FngDay(msgspec.Struct, frozen=True):
    value: str
    value_classification: str = ""


class _FngAnswer(msgspec.Struct, frozen=True):
    data: list[_FngDay]


def parse_fear_greed(body: bytes) -> FearGreed:
    """alternative.me's ``/fng/`` answer: the newest day first, the value as a string."""
    try:
        days = msgspec.json.decode(body, type=_FngAnswer).data
        value = int(days[0].value)
    except (*NOT_JSON, IndexError, ValueError) as exc:
        raise SourceError(f"unexpected Fear & Greed answer: {exc or 'no data'}") from None
    if not 0 <= value <= 100:
        raise SourceError(f"Fear & Greed value {value} is outside 0..100")
    return FearGreed(value=value, classification=days[0].value_classification)
