"""The deterministic sentiment score of ``fetch_sentiment_data`` (docs/tools.md).

The model can override the score (seed 002 calls it "suggested"), but the
number itself must be reproducible, so it comes from a fixed lexicon and fixed
weights, never from a model:

1. Each headline's title and snippet are lower-cased and split into words. A
   lexicon word (or two-word phrase) counts +1 (positive) or -1 (negative);
   one directly after a negation (``no``, ``not``, ``without``, ``denies``...)
   counts 0. A headline is positive when its sum is above 0, negative below.
2. ``news = (positive - negative) / (positive + negative + 2)``: the balance of
   polar headlines, shrunk toward 0 when there are few (the ``+ 2``).
3. ``fear_greed = (index - 50) / 50`` (greed is read as positive sentiment).
4. ``combined = 0.7 * news + 0.3 * fear_greed``; when one part is missing its
   weight goes to the other, and with neither the score is neutral.
5. ``score = floor(15 + 15 * combined + 0.5)``, in 0..30 (15 is neutral).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable
from typing import Final

import msgspec

from daemon.tools.news import FearGreed, Headline

NEUTRAL: Final = 15
MAX_SCORE: Final = 30
NEWS_WEIGHT: Final = 0.7
FEAR_GREED_WEIGHT: Final = 0.3
SHRINK: Final = 2


def _lexicon(words: str, *phrases: str) -> frozenset[str]:
    return frozenset(words.split()) | frozenset(phrases)


POSITIVE: Final = _lexicon(
    """
    accumulate accumulation adoption all-time-high approval approve approved approves
    breakout bullish buy buying gain gained gains inflow inflows institutional
    integration jump jumped jumps launch launched launches milestone outperform
    outperforms partnership rally rallied rallies rebound rebounds recover
    recovers recovery soar soared soars surge surged surges upgrade upgraded upgrades
    """,
    "record high",
)

NEGATIVE: Final = _lexicon(
    """
    ban banned bans bankrupt bankruptcy bearish charged charges crash crashed crashes
    decline declined declines delist delisted delisting drop dropped drops dump dumps
    exploit exploited fall falls fell fraud hack hacked halt halted investigation
    lawsuit liquidation liquidations outage outflow outflows plunge plunged plunges
    probe rejected rejection scam selloff slump slumps sued sues suspend suspended
    sell-off tumble tumbled tumbles vulnerability warning warns
    """,
    "record low",
    "sell off",
)

NEGATIONS: Final = frozenset({"no", "not", "never", "without", "denies", "denied", "despite"})
_WORD = re.compile(r"[a-z0-9]+(?:[-'][a-z0-9]+)*")


class Polarity(msgspec.Struct, frozen=True):
    """One headline's reading: its sum and the lexicon terms that made it."""

    value: int
    positive: list[str]
    negative: list[str]


def read_headline(headline: Headline) -> Polarity:
    """Step 1 for one headline."""
    words = _WORD.findall(f"{headline.title} {headline.snippet}".lower())
    pos: list[str] = []
    neg: list[str] = []
    for i, word in enumerate(words):
        negated = i > 0 and words[i - 1] in NEGATIONS
        for term in (word, f"{word} {words[i + 1]}" if i + 1 < len(words) else ""):
            if negated or not term:
                continue
            if term in POSITIVE:
                pos.append(term)
            elif term in NEGATIVE:
                neg.append(term)
    return Polarity(len(pos) - len(neg), pos, neg)


class Score(msgspec.Struct, frozen=True):
    """The score and what it was made of (for the summary and the tests)."""

    score: int
    positive: int
    negative: int
    neutral: int
    news: float | None
    fear_greed: float | None
    positive_terms: list[str]
    negative_terms: list[str]


def score(headlines: Iterable[Headline], index: FearGreed | None) -> Score:
    """Steps 2 to 5."""
    readings = [read_headline(h) for h in headlines]
    positive = sum(r.value > 0 for r in readings)
    negative = sum(r.value < 0 for r in readings)
    news = (positive - negative) / (positive + negative + SHRINK) if readings else None
    fear_greed = (index.value - 50) / 50 if index is not None else None
    parts = [
        (w, v) for w, v in ((NEWS_WEIGHT, news), (FEAR_GREED_WEIGHT, fear_greed)) if v is not None
    ]
    weight = sum(w for w, _ in parts)
    combined = sum(w * v for w, v in parts) / weight if parts else 0.0
    value = max(0, min(MAX_SCORE, math.floor(NEUTRAL + NEUTRAL * combined + 0.5)))
    return Score(
        score=value,
        positive=positive,
        negative=negative,
        neutral=len(readings) - positive - negative,
        news=news,
        fear_greed=fear_greed,
        positive_terms=_top(t for r in readings for t in r.positive),
        negative_terms=_top(t for r in readings for t in r.negative),
    )


def _top(terms: Iterable[str], n: int = 5) -> list[str]:
    """The most frequent terms, ties alphabetical (so the summary is reproducible)."""
    counts = Counter(terms)
    return [t for t, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]]


def summary(result: Score, index: FearGreed | None) -> str:
    """One paragraph for the model: counts, the catalysts seen, the index."""
    if result.news is None:
        parts = ["No headlines were found"]
    else:
        total = result.positive + result.negative + result.neutral
        parts = [
            f"{total} headlines: {result.positive} positive, "
            + f"{result.negative} negative, {result.neutral} neutral"
        ]
        if result.positive_terms:
            parts.append("positive catalysts: " + ", ".join(result.positive_terms))
        if result.negative_terms:
            parts.append("negative catalysts: " + ", ".join(result.negative_terms))
    if index is not None:
        parts.append(f"Fear & Greed index {index.value} ({index.classification or 'unlabelled'})")
    return "; ".join(parts) + f". Suggested sentiment score {result.score}/30 (15 = neutral)."
