"""Coarser closed candles from finer ones (5m -> 15m, 1h, 4h), sans-I/O.

The state cache keeps the timeframes the feeds deliver; a tool that wants 1 h
candles of a replay of 5 m data builds them here rather than asking an exchange
for today's. Buckets are aligned to the epoch, as exchanges align them, and
only whole buckets come out: one the series starts inside of, or whose end
is past the newest candle's close, is left out. A finer candle missing inside
a bucket (exchanges omit a minute without trades) does not drop the bucket.
"""

from __future__ import annotations

from collections.abc import Iterable

from daemon.events import Candle


def resample(candles: Iterable[Candle], step_ms: int) -> list[Candle]:
    """``candles`` (closed, oldest first, each within one bucket) as ``step_ms``
    buckets: first open, highest high, lowest low, last close, summed volume."""
    if step_ms <= 0:
        raise ValueError(f"step_ms must be positive, got {step_ms}")
    groups: list[list[Candle]] = []
    start = -1
    for c in candles:
        bucket = c.open_time_ms - c.open_time_ms % step_ms
        if bucket != start:
            groups.append([])
            start = bucket
        groups[-1].append(c)
    if groups and groups[0][0].open_time_ms % step_ms:
        del groups[0]  # the series starts inside this bucket: its open and range are unknown
    if groups and groups[-1][-1].close_time_ms % step_ms:
        del groups[-1]  # still forming as far as the series goes
    return [_merged(g, step_ms) for g in groups]


def _merged(group: list[Candle], step_ms: int) -> Candle:
    start = group[0].open_time_ms - group[0].open_time_ms % step_ms
    return Candle(
        open=group[0].open,
        high=max(c.high for c in group),
        low=min(c.low for c in group),
        close=group[-1].close,
        volume=round(sum(c.volume for c in group), 8),  # no float-sum tail for the model
        open_time_ms=start,
        close_time_ms=start + step_ms,
    )
