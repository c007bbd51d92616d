"""Incremental indicators against straightforward full-history recomputations."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pytest

from daemon.indicators import ATR, EMA, MACD, RSI, SMA, Bollinger, CandleIndicators

Ref = list[float | None]


# --- independent reference formulas (whole list at once, no incremental state) ---


def ohlc_series(n: int, seed: int = 7, start: float = 100.0) -> tuple[list[float], ...]:
    """A seeded random walk with gaps between candles and consistent highs and lows."""
    rng = np.random.default_rng(seed)
    closes = start * np.exp(np.cumsum(rng.normal(0.0, 0.01, n)))
    # Opens gap away from the previous close, so true range differs from high - low.
    opens = np.concatenate([[start], closes[:-1]]) * np.exp(rng.normal(0.0, 0.01, n))
    wick = np.abs(rng.normal(0.0, 0.005, (2, n))) * closes
    highs = np.maximum(opens, closes) + wick[0]
    lows = np.minimum(opens, closes) - wick[1]
    return opens.tolist(), highs.tolist(), lows.tolist(), closes.tolist()


def sma_ref(x: Sequence[float], p: int) -> Ref:
    return [None if i < p - 1 else math.fsum(x[i - p + 1 : i + 1]) / p for i in range(len(x))]


def ema_ref(x: Sequence[float], p: int) -> Ref:
    out: Ref = [None] * len(x)
    if len(x) < p:
        return out
    alpha = 2.0 / (p + 1)
    ema = float(np.mean(x[:p]))
    out[p - 1] = ema
    for i in range(p, len(x)):
        ema = alpha * x[i] + (1.0 - alpha) * ema
        out[i] = ema
    return out


def rsi_ref(x: Sequence[float], p: int) -> Ref:
    diffs = np.diff(np.asarray(x))
    gains, losses = np.where(diffs > 0, diffs, 0.0), np.where(diffs < 0, -diffs, 0.0)
    out: Ref = [None] * len(x)
    avg_g, avg_l = float(gains[:p].mean()), float(losses[:p].mean())
    for i in range(p, len(x)):
        if i > p:
            avg_g = (avg_g * (p - 1) + gains[i - 1]) / p
            avg_l = (avg_l * (p - 1) + losses[i - 1]) / p
        out[i] = 100.0 if avg_l == 0 else 100.0 - 100.0 / (1.0 + avg_g / avg_l)
    return out


def atr_ref(h: Sequence[float], lo: Sequence[float], c: Sequence[float], p: int) -> Ref:
    tr = [math.nan] + [
        max(h[i] - lo[i], abs(h[i] - c[i - 1]), abs(lo[i] - c[i - 1])) for i in range(1, len(c))
    ]
    out: Ref = [None] * len(c)
    atr = float(np.mean(tr[1 : p + 1]))
    out[p] = atr
    for i in range(p + 1, len(c)):
        atr = (atr * (p - 1) + tr[i]) / p
        out[i] = atr
    return out


def macd_ref(x: Sequence[float]) -> tuple[Ref, Ref, Ref]:
    fast, slow = ema_ref(x, 12), ema_ref(x, 26)
    line: Ref = [None if s is None or f is None else f - s for f, s in zip(fast, slow, strict=True)]
    defined = [v for v in line if v is not None]
    lead: Ref = [None] * 25
    signal = lead + ema_ref(defined, 9)
    hist: Ref = [
        None if s is None or m is None else m - s for m, s in zip(line, signal, strict=True)
    ]
    return line, signal, hist


def bollinger_std_ref(x: Sequence[float], p: int) -> Ref:
    return [None if i < p - 1 else float(np.std(x[i - p + 1 : i + 1])) for i in range(len(x))]


def assert_matches(got: Sequence[float | None], ref: Ref, rel: float = 1e-9) -> None:
    """Same warm-up (None) positions, and values equal to ``rel`` relative."""
    assert len(got) == len(ref)
    assert [g is None for g in got] == [r is None for r in ref]
    scale = max(abs(r) for r in ref if r is not None)
    for i, (g, r) in enumerate(zip(got, ref, strict=True)):
        if r is not None:
            assert g is not None
            assert math.isclose(g, r, rel_tol=rel, abs_tol=rel * scale * 1e-3), (i, g, r)


N = 3000  # long enough to cross the rolling-sum resync point several times
OPENS, HIGHS, LOWS, CLOSES = ohlc_series(N)


# --- tests -----------------------------------------------------------------------


@pytest.mark.parametrize("period", [1, 5, 20])
def test_sma_matches_window_means(period: int) -> None:
    """SMA equals the mean of the last `period` closes at every step."""
    ind = SMA(period)
    assert_matches([ind.update(x) for x in CLOSES], sma_ref(CLOSES, period))


@pytest.mark.parametrize("period", [1, 9, 20, 50, 200])
def test_ema_matches_sma_seeded_loop(period: int) -> None:
    """EMA equals a loop from the SMA seed with alpha = 2/(p+1)."""
    ind = EMA(period)
    got = [ind.update(x) for x in CLOSES]
    assert_matches(got, ema_ref(CLOSES, period))
    assert ind.value == got[-1]


@pytest.mark.parametrize("period", [2, 14, 30])
def test_rsi_matches_wilder_from_scratch(period: int) -> None:
    """RSI equals Wilder's formula recomputed from the full list of changes."""
    ind = RSI(period)
    assert_matches([ind.update(x) for x in CLOSES], rsi_ref(CLOSES, period))


@pytest.mark.parametrize("period", [1, 14, 21])
def test_atr_matches_wilder_true_range_from_scratch(period: int) -> None:
    """ATR equals Wilder smoothing of true ranges that use the previous close."""
    ind = ATR(period)
    got = [ind.update(h, lo, c) for h, lo, c in zip(HIGHS, LOWS, CLOSES, strict=True)]
    assert_matches(got, atr_ref(HIGHS, LOWS, CLOSES, period))


def test_macd_matches_two_full_emas_and_signal() -> None:
    """MACD line, signal and histogram equal those built from full EMAs."""
    ind = MACD()
    got = [ind.update(x) for x in CLOSES]
    line, signal, hist = macd_ref(CLOSES)
    assert_matches([None if v is None else v.macd for v in got], line)
    assert_matches([None if v is None else v.signal for v in got], signal)
    assert_matches([None if v is None else v.histogram for v in got], hist)


def test_bollinger_matches_population_std() -> None:
    """Bollinger middle is the SMA and the band half-width is k * np.std(ddof=0)."""
    ind = Bollinger(20, 2.0)
    got = [ind.update(x) for x in CLOSES]
    assert_matches([None if v is None else v.middle for v in got], sma_ref(CLOSES, 20))
    half = [None if v is None else (v.upper - v.lower) / 4.0 for v in got]
    assert_matches(half, bollinger_std_ref(CLOSES, 20), rel=1e-7)


def test_rolling_stats_stay_accurate_at_large_offsets() -> None:
    """SMA and Bollinger std stay exact over many updates at BTC-like prices."""
    rng = np.random.default_rng(3)
    xs = (120_000.0 + rng.normal(0.0, 5.0, 20_000)).tolist()
    sma, bb = SMA(20), Bollinger(20, 1.0)
    for x in xs:
        sma.update(x)
        bb.update(x)
    window = xs[-20:]
    assert sma.value is not None and bb.value is not None
    assert math.isclose(sma.value, math.fsum(window) / 20, rel_tol=1e-12)
    assert math.isclose(bb.value.upper - bb.value.middle, float(np.std(window)), rel_tol=1e-6)


def test_warm_up_lengths() -> None:
    """The first value appears exactly after the documented number of inputs."""

    def first(values: Sequence[object]) -> int:
        return next(i for i, v in enumerate(values) if v is not None) + 1

    assert first(_run(EMA(20))) == 20
    assert first(_run(SMA(20))) == 20
    assert first(_run(RSI(14))) == 15
    assert first(_run(Bollinger(20))) == 20
    atr = ATR(14)
    assert first([atr.update(h, lo, c) for h, lo, c in zip(HIGHS, LOWS, CLOSES, strict=True)]) == 15
    m_ind = MACD()
    macd = [m_ind.update(x) for x in CLOSES[:60]]
    assert first(macd) == 26
    assert first([None if m is None else m.signal for m in macd]) == 34
    assert first([None if m is None else m.histogram for m in macd]) == 34


def _run(ind: EMA | SMA | RSI | Bollinger | MACD) -> list[object]:
    return [ind.update(x) for x in CLOSES[:60]]


def test_rsi_edge_cases_flat_and_one_sided() -> None:
    """A flat window gives 50, only gains 100, only losses 0."""
    flat, up, down = RSI(3), RSI(3), RSI(3)
    for i in range(6):
        flat.update(10.0)
        up.update(10.0 + i)
        down.update(10.0 - i)
    assert (flat.value, up.value, down.value) == (50.0, 100.0, 0.0)


def test_value_is_none_before_any_input() -> None:
    """Every indicator reports None until it has warmed up."""
    for ind in (SMA(3), EMA(3), RSI(3), ATR(3), MACD(), Bollinger(3)):
        assert ind.value is None


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_bad_period_is_rejected(bad: object) -> None:
    """Periods must be positive ints; anything else is a ValueError, not a silent bug."""
    with pytest.raises(ValueError, match="period"):
        EMA(bad)  # type: ignore[arg-type]


def test_macd_fast_must_be_shorter_than_slow() -> None:
    """MACD with fast >= slow is rejected with a message naming both."""
    with pytest.raises(ValueError, match="26 must be shorter than slow 12"):
        MACD(26, 12, 9)


def test_candle_indicators_export_shape_during_and_after_warm_up() -> None:
    """The default set exposes every key from the first candle, filled once warm."""
    ind = CandleIndicators()
    ind.update(HIGHS[0], LOWS[0], CLOSES[0])
    early = ind.export()
    assert early["ema20"] is None and early["macd"] == {
        "macd": None,
        "signal": None,
        "histogram": None,
    }
    for h, lo, c in zip(HIGHS[1:250], LOWS[1:250], CLOSES[1:250], strict=True):
        ind.update(h, lo, c)
    late = ind.export()
    assert set(late) == set(early) and late["count"] == 250
    flat = [late[k] for k in ("sma20", "ema20", "ema50", "ema200", "rsi14", "atr14")]
    flat += list(late["macd"].values()) + list(late["bb20"].values())
    assert all(isinstance(v, float) for v in flat)
    ema200 = ema_ref(CLOSES[:250], 200)[-1]
    assert ema200 is not None and math.isclose(late["ema200"], ema200, rel_tol=1e-9)
