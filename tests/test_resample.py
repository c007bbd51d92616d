"""Coarser candles from finer ones: whole buckets only, OHLCV merged."""

from __future__ import annotations

import pytest

from daemon.events import Candle
from daemon.resample import resample

M5 = 300_000
H1 = 3_600_000
T0 = 1_704_067_200_000  # on the hour


def c5(i: int, close: float, *, high: float | None = None, low: float | None = None) -> Candle:
    start = T0 + i * M5
    return Candle(open=close - 1, high=high or close + 1, low=low or close - 2, close=close,
                  volume=1.0 + i, open_time_ms=start, close_time_ms=start + M5)  # fmt: skip


def test_whole_buckets_merge_open_high_low_close_and_volume() -> None:
    candles = [c5(i, 100.0 + i) for i in range(24)]
    candles[3] = c5(3, 103.0, high=500.0)
    candles[20] = c5(20, 120.0, low=1.0)
    first, second = resample(candles, H1)
    assert (first.open_time_ms, first.close_time_ms) == (T0, T0 + H1)
    assert (first.open, first.high, first.low, first.close) == (99.0, 500.0, 98.0, 111.0)
    assert first.volume == sum(1.0 + i for i in range(12))
    assert (second.open, second.high, second.low, second.close) == (111.0, 124.0, 1.0, 123.0)


def test_a_bucket_the_series_starts_inside_or_has_not_finished_is_left_out() -> None:
    """Starting at :10 the first hour's open is unknown; ending at :55 the last hour is
    still forming. Only the whole hour between comes out."""
    candles = [c5(i, 100.0 + i) for i in range(2, 35)]
    (whole,) = resample(candles, H1)
    assert whole.open_time_ms == T0 + H1 and whole.close == 100.0 + 23


def test_a_candle_missing_inside_a_bucket_keeps_the_bucket() -> None:
    """Exchanges omit a 5 m candle without trades: the hour is still whole."""
    candles = [c5(i, 100.0 + i) for i in range(12) if i != 5]
    (hour,) = resample(candles, H1)
    assert hour.volume == sum(1.0 + i for i in range(12) if i != 5)


def test_nothing_in_nothing_out_and_a_bad_step_is_refused() -> None:
    assert resample([], H1) == []
    with pytest.raises(ValueError, match="positive"):
        resample([c5(0, 1.0)], 0)
