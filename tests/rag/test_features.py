"""Features and outcomes against independent, bar-by-bar reference code."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from daemon.rag.features import F64, Bars, Observations, outcome_columns, state_columns
from tests.rag import synth

TF = 900_000  # 15m keeps the 4 h EMA(50) warm-up short
H = 3_600_000
N = 1600
AGE = 24 * H


def ref_ema(xs: list[float], n: int) -> float:
    """EMA of the whole list, seeded with the mean of the first n values."""
    if len(xs) < n:
        return math.nan
    v = sum(xs[:n]) / n
    for x in xs[n:]:
        v = x * 2 / (n + 1) + v * (1 - 2 / (n + 1))
    return v


def ref_rsi(xs: list[float], n: int) -> float:
    """Wilder RSI of the whole list."""
    if len(xs) <= n:
        return math.nan
    d = [b - a for a, b in itertools.pairwise(xs)]
    g = sum(max(x, 0) for x in d[:n]) / n
    lo = sum(max(-x, 0) for x in d[:n]) / n
    for x in d[n:]:
        g, lo = (g * (n - 1) + max(x, 0)) / n, (lo * (n - 1) + max(-x, 0)) / n
    return 50.0 if g == lo == 0 else (100.0 if lo == 0 else 100 - 100 / (1 + g / lo))


def ref_state(rows: np.ndarray, i: int, fund: np.ndarray, oi: np.ndarray) -> dict[str, float]:
    """Every state feature of bar i from rows[: i + 1] and observations known by its close."""
    t = rows[i, 0] + TF
    past = rows[: i + 1]
    closes = past[:, 4].tolist()
    by_close = {r[0] + TF: r[4] for r in past}
    buckets: dict[int, float] = {}
    for r in past:
        b = int(r[0] // (4 * H))
        if (b + 1) * 4 * H <= t:
            buckets[b] = r[4]
    b_closes = [buckets[k] for k in sorted(buckets)]
    f_known = [(ft, fv) for ft, fv in fund if ft <= t and t - ft <= AGE]
    o_known = [(ot, ov) for ot, ov in oi if ot <= t]
    o_latest = o_known[-1] if o_known and t - o_known[-1][0] <= AGE else None
    window = [ov for ot, ov in o_known if ot > t - 24 * H]

    def change(h: int) -> float:
        prev = by_close.get(t - h * H)
        return math.nan if prev is None else (closes[-1] / prev - 1) * 100

    return {
        "price": closes[-1],
        "rsi_7": ref_rsi(closes, 7),
        "rsi_14": ref_rsi(closes, 14),
        "macd": ref_ema(closes, 12) - ref_ema(closes, 26),
        "ema_20": ref_ema(closes, 20),
        "ema_20_4h": ref_ema(b_closes, 20),
        "ema_50_4h": ref_ema(b_closes, 50),
        "funding_rate": f_known[-1][1] if f_known else math.nan,
        "open_interest_latest": o_latest[1] if o_latest else math.nan,
        "open_interest_avg_24h": sum(window) / len(window) if o_latest and window else math.nan,
        "price_change_1h": change(1),
        "price_change_4h": change(4),
    }


def ref_outcomes(rows: np.ndarray, i: int) -> dict[str, float]:
    """Outcomes of bar i from the bars after its close (NaN unless the horizon is covered)."""
    t, entry = rows[i, 0] + TF, rows[i, 4]
    by_open = {r[0]: r for r in rows}

    def ahead(h: int) -> list[np.ndarray] | None:
        bars = [by_open.get(t + k * TF) for k in range(h * H // TF)]
        return None if any(b is None for b in bars) else bars  # type: ignore[return-value]

    out: dict[str, float] = {}
    for h in (1, 4, 24):
        end = by_open.get(t + h * H - TF)
        out[f"outcome_{h}h"] = math.nan if end is None else (end[4] / entry - 1) * 100
    one, four = ahead(1), ahead(4)
    out["max_runup_1h"] = (
        math.nan if one is None else max(0.0, (max(b[2] for b in one) / entry - 1) * 100)
    )
    out["max_drawdown_1h"] = (
        math.nan if one is None else min(0.0, (min(b[3] for b in one) / entry - 1) * 100)
    )
    out["hit_stop_loss"] = (
        math.nan if four is None else float(min(b[3] for b in four) <= entry * 0.98)
    )
    out["hit_take_profit"] = (
        math.nan if four is None else float(max(b[2] for b in four) >= entry * 1.03)
    )
    return out


@pytest.fixture(scope="module")
def series() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """15m candles with a 3-bar gap, 8 h funding that stops early, hourly OI from bar 300."""
    rows = synth.candles(N, seed=11, tf=TF)
    rows = np.delete(rows, [1000, 1001, 1002], axis=0)
    start, end = int(rows[0, 0]), int(rows[-1, 0])
    fund = synth.funding(start - 8 * H, end - 3 * 24 * H)
    oi = synth.open_interest(start + 300 * TF, end)
    return rows, fund, oi


def _close(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


def _compute(
    rows: np.ndarray, fund: np.ndarray, oi: np.ndarray
) -> tuple[dict[str, F64], dict[str, F64]]:
    bars = Bars.from_rows(rows)
    f = Observations.of(fund[:, 0].astype(np.int64), fund[:, 1])
    o = Observations.of(oi[:, 0].astype(np.int64), oi[:, 1])
    return state_columns(bars, TF, f, o, AGE, AGE), outcome_columns(bars, TF)


SAMPLE = [
    0,
    5,
    13,
    14,
    30,
    299,
    300,
    301,
    350,
    800,
    801,
    999,
    1000,
    1001,
    1004,
    1005,
    1020,
    1200,
    1500,
    1555,
    1596,
]


def test_every_feature_matches_reference(series: tuple[np.ndarray, ...]) -> None:
    """rsi, macd, EMAs (3 m and 4 h), funding, OI, price changes equal the bar-by-bar reference."""
    rows, fund, oi = series
    state, _ = _compute(rows, fund, oi)
    for i in SAMPLE:
        for name, want in ref_state(rows, i, fund, oi).items():
            assert _close(state[name][i], want), (i, name, state[name][i], want)


def test_every_outcome_matches_reference(series: tuple[np.ndarray, ...]) -> None:
    """1/4/24 h outcomes, 1 h run-up/drawdown and 4 h stop/target hits equal the reference."""
    rows, fund, oi = series
    _, outcomes = _compute(rows, fund, oi)
    for i in SAMPLE:
        for name, want in ref_outcomes(rows, i).items():
            assert _close(outcomes[name][i], want), (i, name, outcomes[name][i], want)


def test_hits_are_exercised(series: tuple[np.ndarray, ...]) -> None:
    """The generated series contains both stop and target hits, so the hit checks bite."""
    rows, fund, oi = series
    _, outcomes = _compute(rows, fund, oi)
    assert np.nansum(outcomes["hit_stop_loss"]) > 0
    assert np.nansum(outcomes["hit_take_profit"]) > 0


def test_state_uses_no_future_data(series: tuple[np.ndarray, ...]) -> None:
    """State at bar k is identical whether later bars exist, are absent, or are scrambled."""
    rows, fund, oi = series
    full, _ = _compute(rows, fund, oi)
    for k in (400, 900, 1300):
        cut, _ = _compute(rows[: k + 1], fund, oi)
        scrambled = rows.copy()
        scrambled[k + 1 :, 1:5] *= 1.5
        scr, _ = _compute(scrambled, fund, oi)
        for name in full:
            assert _close(cut[name][k], full[name][k]), (k, name)
            assert _close(scr[name][k], full[name][k]), (k, name)


def test_outcomes_absent_until_horizon_passed(series: tuple[np.ndarray, ...]) -> None:
    """The last bars have no 24 h (or 4 h, 1 h) outcome: their horizon is not in the data."""
    rows, fund, oi = series
    _, out = _compute(rows, fund, oi)
    per_hour = H // TF
    assert np.isnan(out["outcome_24h"][-24 * per_hour :]).all()
    assert np.isfinite(out["outcome_24h"][-24 * per_hour - 1])
    assert np.isnan(out["outcome_4h"][-4 * per_hour :]).all()
    assert np.isnan(out["hit_stop_loss"][-4 * per_hour :]).all()
    assert np.isnan(out["max_runup_1h"][-per_hour:]).all()


def test_missing_funding_and_oi_are_nan_not_zero(series: tuple[np.ndarray, ...]) -> None:
    """Bars before the first OI snapshot and after funding stops carry NaN, never 0."""
    rows, fund, oi = series
    state, _ = _compute(rows, fund, oi)
    assert np.isnan(state["open_interest_latest"][:299]).all()
    assert np.isnan(state["funding_rate"][-100:]).all()
    assert np.isfinite(state["funding_rate"][500])


def test_daily_open_interest_has_no_delta_within_its_day(series: tuple[np.ndarray, ...]) -> None:
    """With one OI snapshot a day (Binance's daily history), the 24 h average inside a
    day is that snapshot, exactly: the OI delta there is 0, not rounding noise."""
    rows, fund, _ = series
    start, end = int(rows[0, 0]), int(rows[-1, 0])
    daily = synth.open_interest(start, end, step=24 * H) * np.array([1.0, 8e3])
    state, _ = _compute(rows, fund, daily)
    latest, avg = state["open_interest_latest"], state["open_interest_avg_24h"]
    one = np.isfinite(latest) & (latest == avg)
    assert one.sum() > len(latest) // 2
    assert (latest[one] / avg[one] - 1.0 == 0.0).all()
