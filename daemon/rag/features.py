"""Per-bar market state and outcomes, computed column-wise with no look-ahead.

A bar's *state* uses only bars that closed at or before its close time ``t``
(``t = open_time + timeframe``), 4 h EMAs only over 4 h buckets that had closed
by ``t``, and funding/OI observations known at or before ``t``. Its *outcomes*
use the bars after ``t`` and are NaN unless every bar of the horizon is present
in the data: an outcome exists only once its horizon has passed.

Outcome horizons: ``outcome_1h/4h/24h`` = close at ``t + h`` vs close at ``t`` (needs that bar);
``max_runup_1h``/``max_drawdown_1h`` = highest high / lowest low of the bars
opening in ``[t, t + 1h)`` vs the close at ``t`` (clamped at 0);
``hit_stop_loss``/``hit_take_profit`` = a low <= -2 % / a high >= +3 % within
the next **4 h** (both may be true: bars carry no intra-bar order). Window
outcomes need every bar of their window; a gap leaves them NaN.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from numpy.typing import NDArray

from daemon.rag.indicators import ema, rsi

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]

HOUR_MS: Final = 3_600_000
H4_MS: Final = 4 * HOUR_MS
DAY_MS: Final = 24 * HOUR_MS
STOP_PCT: Final = -2.0
TARGET_PCT: Final = 3.0
HIT_HORIZON_MS: Final = H4_MS

# Timeframes we can ingest: each must divide one hour (1 h run-up needs whole bars).
TIMEFRAME_MS: Final[dict[str, int]] = {
    "1m": 60_000,
    "3m": 180_000,
    "5m": 300_000,
    "15m": 900_000,
    "30m": 1_800_000,
    "1h": HOUR_MS,
}

STATE_COLUMNS: Final = (
    "price",
    "rsi_7",
    "rsi_14",
    "macd",
    "ema_20",
    "ema_20_4h",
    "ema_50_4h",
    "funding_rate",
    "open_interest_latest",
    "open_interest_avg_24h",
    "price_change_1h",
    "price_change_4h",
)
OUTCOME_COLUMNS: Final = (
    "outcome_1h",
    "outcome_4h",
    "outcome_24h",
    "max_runup_1h",
    "max_drawdown_1h",
    "hit_stop_loss",
    "hit_take_profit",
)
# Columns that must be finite for a bar to become a point at all (warm-up, gaps).
REQUIRED_STATE: Final = (
    "price",
    "rsi_7",
    "rsi_14",
    "macd",
    "ema_20",
    "ema_20_4h",
    "ema_50_4h",
    "price_change_1h",
    "price_change_4h",
)


@dataclass(frozen=True, slots=True)
class Bars:
    """Candles of one symbol and timeframe, sorted by open time, unique."""

    open_ms: I64
    open: F64
    high: F64
    low: F64
    close: F64
    volume: F64

    @classmethod
    def from_rows(cls, rows: NDArray[np.float64]) -> Bars:
        """From an (n, 6) array; sorts and keeps the last row of duplicate open times."""
        order = np.argsort(rows[:, 0], kind="stable")
        rows = rows[order]
        keep = np.ones(len(rows), dtype=bool)
        keep[:-1] = rows[1:, 0] != rows[:-1, 0]
        rows = rows[keep]
        cols = [np.ascontiguousarray(rows[:, k]) for k in range(6)]
        return cls(cols[0].astype(np.int64), *cols[1:])

    def __len__(self) -> int:
        return len(self.open_ms)


@dataclass(frozen=True, slots=True)
class Observations:
    """A time series known at ``time_ms`` (funding settlements, OI snapshots), sorted."""

    time_ms: I64
    value: F64

    @classmethod
    def of(cls, times: NDArray[np.int64], values: F64) -> Observations:
        """Sorted by time, NaN values dropped."""
        ok = np.isfinite(values)
        order = np.argsort(times[ok], kind="stable")
        return cls(times[ok][order].astype(np.int64), values[ok][order].astype(np.float64))

    @classmethod
    def levels(cls, times: NDArray[np.int64], values: F64) -> Observations:
        """:meth:`of` for a quantity that is never 0 or below (open interest): such a
        value is a gap, as NaN is (else it would divide the 24 h average by 0)."""
        return cls.of(times, np.where(values > 0, values, np.nan))


def _asof(obs: Observations | None, t: I64, max_age_ms: int) -> tuple[F64, I64]:
    """The latest value known at each ``t`` (NaN if none or older than max age)."""
    out = np.full(len(t), np.nan)
    if obs is None or len(obs.time_ms) == 0:
        return out, np.full(len(t), -1, dtype=np.int64)
    j = np.searchsorted(obs.time_ms, t, side="right") - 1
    ok = (j >= 0) & (t - obs.time_ms[np.maximum(j, 0)] <= max_age_ms)
    out[ok] = obs.value[j[ok]]
    return out, j


def _oi_avg_24h(obs: Observations | None, t: I64, latest_j: I64) -> F64:
    """Mean of OI observations known in ``(t - 24h, t]``; NaN when there are none."""
    out = np.full(len(t), np.nan)
    if obs is None or len(obs.time_ms) == 0:
        return out
    cs = np.concatenate(([0.0], np.cumsum(obs.value)))
    lo = np.searchsorted(obs.time_ms, t - DAY_MS, side="right")
    hi = latest_j + 1
    ok = hi > lo
    out[ok] = (cs[hi[ok]] - cs[lo[ok]]) / (hi[ok] - lo[ok])
    # One observation in the window (daily OI): its value exactly, not a difference of
    # two year-long sums (which left OI deltas of ~1e-13 % where there was none).
    one = hi - lo == 1
    out[one] = obs.value[lo[one]]
    return out


def _at_offset(t: I64, offset_ms: int) -> tuple[I64, NDArray[np.bool_]]:
    """Index of the bar closing exactly at ``t + offset`` and whether it exists."""
    target = t + offset_ms
    j = np.searchsorted(t, target)
    jc = np.minimum(j, len(t) - 1)
    return jc, (j < len(t)) & (t[jc] == target)


def _pct(a: F64, b: F64) -> F64:
    return (a / b - 1.0) * 100.0


def _ema_4h(bars: Bars, t: I64, period: int) -> F64:
    """EMA over closed 4 h buckets (last close in each), as known at each ``t``."""
    bucket = bars.open_ms // H4_MS
    last = np.ones(len(bucket), dtype=bool)
    last[:-1] = bucket[1:] != bucket[:-1]
    closes = bars.close[last]
    closed_at = (bucket[last] + 1) * H4_MS
    values = ema(closes, period)
    k = np.searchsorted(closed_at, t, side="right") - 1
    out = np.full(len(t), np.nan)
    ok = k >= 0
    out[ok] = values[k[ok]]
    return out


def _window(values: F64, n_bars: int, reduce: str) -> F64:
    """max/min of ``values[i+1 .. i+n]`` for each i (NaN where the window runs off)."""
    out = np.full(len(values), np.nan)
    if len(values) <= n_bars:
        return out
    win = sliding_window_view(values[1:], n_bars)
    out[: len(win)] = win.max(axis=1) if reduce == "max" else win.min(axis=1)
    return out


def state_columns(
    bars: Bars,
    tf_ms: int,
    funding: Observations | None,
    oi: Observations | None,
    max_funding_age_ms: int,
    max_oi_age_ms: int,
) -> dict[str, F64]:
    """The seed's market-state features at every bar close (NaN before warm-up)."""
    t = bars.open_ms + tf_ms
    c = bars.close
    cols: dict[str, F64] = {"price": c.copy()}
    cols["rsi_7"], cols["rsi_14"] = rsi(c, 7), rsi(c, 14)
    cols["macd"] = ema(c, 12) - ema(c, 26)
    cols["ema_20"] = ema(c, 20)
    cols["ema_20_4h"], cols["ema_50_4h"] = _ema_4h(bars, t, 20), _ema_4h(bars, t, 50)
    cols["funding_rate"], _ = _asof(funding, t, max_funding_age_ms)
    cols["open_interest_latest"], j = _asof(oi, t, max_oi_age_ms)
    avg = _oi_avg_24h(oi, t, j)
    avg[~np.isfinite(cols["open_interest_latest"])] = np.nan
    cols["open_interest_avg_24h"] = avg
    for name, hours in (("price_change_1h", 1), ("price_change_4h", 4)):
        jb, ok = _at_offset(t, -hours * HOUR_MS)
        cols[name] = np.where(ok, _pct(c, c[jb]), np.nan)
    return cols


def outcome_columns(bars: Bars, tf_ms: int) -> dict[str, F64]:
    """What happened after each bar close; NaN until the whole horizon is in the data."""
    t = bars.open_ms + tf_ms
    c = bars.close
    cols: dict[str, F64] = {}
    for name, hours in (("outcome_1h", 1), ("outcome_4h", 4), ("outcome_24h", 24)):
        jf, ok = _at_offset(t, hours * HOUR_MS)
        cols[name] = np.where(ok, _pct(c[jf], c), np.nan)
    n1, n4 = HOUR_MS // tf_ms, HIT_HORIZON_MS // tf_ms
    # Window outcomes need every bar of the horizon: the bar n rows ahead must
    # close exactly n bars later (rows are unique and sorted, so no gap between).
    rows = np.arange(len(t))
    j1, ok1 = _at_offset(t, HOUR_MS)
    j4, ok4 = _at_offset(t, HIT_HORIZON_MS)
    ok1 &= j1 - rows == n1
    ok4 &= j4 - rows == n4
    runup = np.maximum(_pct(_window(bars.high, n1, "max"), c), 0.0)
    drawdown = np.minimum(_pct(_window(bars.low, n1, "min"), c), 0.0)
    cols["max_runup_1h"] = np.where(ok1, runup, np.nan)
    cols["max_drawdown_1h"] = np.where(ok1, drawdown, np.nan)
    low4 = _pct(_window(bars.low, n4, "min"), c)
    high4 = _pct(_window(bars.high, n4, "max"), c)
    cols["hit_stop_loss"] = np.where(ok4, (low4 <= STOP_PCT).astype(np.float64), np.nan)
    cols["hit_take_profit"] = np.where(ok4, (high4 >= TARGET_PCT).astype(np.float64), np.nan)
    return cols
