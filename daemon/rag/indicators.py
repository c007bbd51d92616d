"""Recursive indicators (EMA, Wilder RSI) over a float series.

They are plain loops over Python floats: each value depends on the previous
one, and a loop over a list is faster than numpy scalar indexing. Values
before an indicator's warm-up are NaN, never a made-up number.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

F64 = NDArray[np.float64]
NAN = math.nan


def ema(values: F64, period: int) -> F64:
    """EMA seeded with the simple mean of the first ``period`` values (TA-Lib style)."""
    xs = values.tolist()
    out = [NAN] * len(xs)
    if len(xs) < period:
        return np.asarray(out, dtype=np.float64)
    alpha = 2.0 / (period + 1)
    prev = sum(xs[:period]) / period
    out[period - 1] = prev
    for i in range(period, len(xs)):
        prev = alpha * xs[i] + (1.0 - alpha) * prev
        out[i] = prev
    return np.asarray(out, dtype=np.float64)


def _rsi_value(gain: float, loss: float) -> float:
    if loss == 0.0:
        return 100.0 if gain > 0.0 else 50.0
    return 100.0 - 100.0 / (1.0 + gain / loss)


def rsi(closes: F64, period: int) -> F64:
    """Wilder's RSI: simple mean of the first ``period`` moves, then Wilder smoothing."""
    xs = closes.tolist()
    out = [NAN] * len(xs)
    if len(xs) <= period:
        return np.asarray(out, dtype=np.float64)
    moves = [xs[i] - xs[i - 1] for i in range(1, len(xs))]
    gain = sum(m for m in moves[:period] if m > 0) / period
    loss = sum(-m for m in moves[:period] if m < 0) / period
    out[period] = _rsi_value(gain, loss)
    for i in range(period + 1, len(xs)):
        m = moves[i - 1]
        gain = (gain * (period - 1) + (m if m > 0 else 0.0)) / period
        loss = (loss * (period - 1) + (-m if m < 0 else 0.0)) / period
        out[i] = _rsi_value(gain, loss)
    return np.asarray(out, dtype=np.float64)
