"""Aggregate statistics over the matches a query returns (seed 004's shape).

Every match's outcomes are known (the store only searches points whose
horizons are in the data and passed before the query), so the figures are
numbers, as the seed's schema types them. With no match at all (only possible
with ``min_matches`` 0) they are 0 and ``count`` / ``total_matches`` say so.
"""

from __future__ import annotations

from typing import Any


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default), without numpy's overhead."""
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def outcome_4h_stats(values: list[float]) -> dict[str, Any]:
    """mean, median, p10, p90 (linear interpolation), sign counts, win rate."""
    pos = sum(1 for v in values if v > 0)
    neg = sum(1 for v in values if v < 0)
    if not values:
        return {
            "mean": 0.0,
            "median": 0.0,
            "p10": 0.0,
            "p90": 0.0,
            "positive_count": 0,
            "negative_count": 0,
            "win_rate": 0.0,
            "count": 0,
        }
    return {
        "mean": sum(values) / len(values),
        "median": percentile(values, 50),
        "p10": percentile(values, 10),
        "p90": percentile(values, 90),
        "positive_count": pos,
        "negative_count": neg,
        "win_rate": pos / len(values),
        "count": len(values),
    }


def outcome_stats(matches: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``statistics`` member of a query_patterns result."""
    sims = [m["similarity"] for m in matches]
    outs = [m["outcomes"] for m in matches]
    four = [o["outcome_4h"] for o in outs if o["outcome_4h"] is not None]
    return {
        "total_matches": len(matches),
        "avg_similarity": sum(sims) / len(sims) if sims else 0.0,
        "similarity_range": [min(sims), max(sims)] if sims else [0.0, 0.0],
        "outcome_4h": outcome_4h_stats(four),
        "stop_loss_hits": sum(1 for o in outs if o["hit_stop_loss"] is True),
        "take_profit_hits": sum(1 for o in outs if o["hit_take_profit"] is True),
    }
