"""Indicator columns over a float series, for ingest.

They run the same incremental indicators the live state cache uses
(:mod:`daemon.indicators`), so a stored pattern and a live state are computed
the same way. Values before an indicator's warm-up are NaN, never a made-up
number.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from daemon.indicators import EMA, RSI

F64 = NDArray[np.float64]
NAN = math.nan


def _column(indicator: EMA | RSI, values: F64) -> F64:
    out = [indicator.update(x) for x in values.tolist()]
    return np.asarray([NAN if v is None else v for v in out], dtype=np.float64)


def ema(values: F64, period: int) -> F64:
    """EMA seeded with the simple mean of the first ``period`` values (TA-Lib style)."""
    return _column(EMA(period), values)


def rsi(closes: F64, period: int) -> F64:
    """Wilder's RSI: simple mean of the first ``period`` moves, then Wilder smoothing."""
    return _column(RSI(period), closes)
