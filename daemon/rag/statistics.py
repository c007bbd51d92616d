"""Aggregate statistics over the matches a query returns (seed 004's shape).

Only outcomes known at query time count; with none known, the 4 h figures are
``null`` and the counts 0 rather than a made-up 0.0 mean.
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
            "mean": None,
            "median": None,
            "p10": None,
            "p90": None,
            "positive_count": 0,
            "negative_count": 0,
            "win_rate": None,
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
        "avg_similarity": sum(sims) / len(sims) if sims else None,
        "similarity_range": [min(sims), max(sims)] if sims else None,
        "outcome_4h": outcome_4h_stats(four),
        "stop_loss_hits": sum(1 for o in outs if o["hit_stop_loss"] is True),
        "take_profit_hits": sum(1 for o in outs if o["hit_take_profit"] is True),
    }
