"""Incremental technical indicators: O(1) work per new value, no pass over history.

Each indicator is a small object with ``update(...)`` that takes the next input
(a close, or a candle's high/low/close) and returns the current value, or
``None`` while it is still warming up; ``value`` returns the last result.
Hooks see these values on every candle close, so recomputing over the whole
buffer each time would make a 500-candle cache cost 500x more than it needs to.

Conventions (the classic definitions, as in Wilder 1978 and TA-Lib's
"classic" mode; see docs/state.md for the full table):

* ``EMA(p)``: ``alpha = 2 / (p + 1)``, seeded with the SMA of the first ``p``
  inputs; first value on input ``p``.
* ``RSI(p)``: Wilder smoothing (``alpha = 1 / p``) of gains and losses; the
  seed averages are the simple means of the first ``p`` changes, so the first
  value is on input ``p + 1``. ``RSI = 100 * avgGain / (avgGain + avgLoss)``
  (the same as ``100 - 100 / (1 + RS)``); a perfectly flat window gives 50.
* ``MACD(12, 26, 9)``: fast and slow EMAs as above, each seeded from the first
  input; the line exists from input 26; the signal EMA(9) is seeded with the
  SMA of the first 9 line values, so signal and histogram exist from input 34.
* ``ATR(p)``: true range needs the previous close, so the first TR is on
  input 2; the first ATR is the mean of the first ``p`` TRs (input ``p + 1``),
  then Wilder smoothing.
* ``Bollinger(p, k)``: SMA(p) middle, ``k`` population standard deviations
  (ddof=0) either side; first value on input ``p``.

Inputs must be finite floats; the state cache rejects anything else before it
gets here (a single NaN would poison an EMA forever).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any, NamedTuple

# Rolling sums drift by rounding; re-add the window exactly this often.
# The cost is O(period) per RESYNC updates, i.e. O(1) amortised.
_RESYNC_EVERY = 1024


def _check_period(period: int) -> None:
    if not isinstance(period, int) or isinstance(period, bool) or period < 1:
        raise ValueError(f"indicator period must be a positive int, got {period!r}")


class SMA:
    """Simple moving average over the last ``period`` inputs (rolling sum)."""

    __slots__ = ("_since_resync", "_sum", "_value", "_window", "period")

    def __init__(self, period: int) -> None:
        _check_period(period)
        self.period = period
        self._window: deque[float] = deque(maxlen=period)
        self._sum = 0.0
        self._since_resync = 0
        self._value: float | None = None

    @property
    def value(self) -> float | None:
        """The last average, or None while fewer than ``period`` inputs were seen."""
        return self._value

    def update(self, x: float) -> float | None:
        """Add one input; returns the average of the last ``period`` inputs."""
        window = self._window
        if len(window) == self.period:
            self._sum -= window[0]
        window.append(x)
        self._sum += x
        self._since_resync += 1
        if self._since_resync >= max(_RESYNC_EVERY, self.period):
            self._sum = math.fsum(window)
            self._since_resync = 0
        if len(window) == self.period:
            self._value = self._sum / self.period
        return self._value


class EMA:
    """Exponential moving average, ``alpha = 2 / (period + 1)``, SMA-seeded."""

    __slots__ = ("_count", "_seed_sum", "_value", "alpha", "period")

    def __init__(self, period: int) -> None:
        _check_period(period)
        self.period = period
        self.alpha = 2.0 / (period + 1)
        self._count = 0
        self._seed_sum = 0.0
        self._value: float | None = None

    @property
    def value(self) -> float | None:
        """The last EMA, or None before ``period`` inputs."""
        return self._value

    def update(self, x: float) -> float | None:
        """Add one input; the first value is the mean of the first ``period`` inputs."""
        if self._value is not None:
            self._value += self.alpha * (x - self._value)
            return self._value
        self._count += 1
        self._seed_sum += x
        if self._count == self.period:
            self._value = self._seed_sum / self.period
        return self._value


class _Wilder:
    """Wilder's running mean: simple mean of the first ``period`` inputs, then
    ``avg = (avg * (period - 1) + x) / period``. Shared by RSI and ATR."""

    __slots__ = ("_count", "_sum", "period", "value")

    def __init__(self, period: int) -> None:
        self.period = period
        self._count = 0
        self._sum = 0.0
        self.value: float | None = None

    def update(self, x: float) -> float | None:
        if self.value is not None:
            self.value = (self.value * (self.period - 1) + x) / self.period
            return self.value
        self._count += 1
        self._sum += x
        if self._count == self.period:
            self.value = self._sum / self.period
        return self.value


class RSI:
    """Relative strength index with Wilder smoothing; 0..100."""

    __slots__ = ("_gain", "_loss", "_prev", "_value", "period")

    def __init__(self, period: int = 14) -> None:
        _check_period(period)
        self.period = period
        self._prev: float | None = None
        self._gain = _Wilder(period)
        self._loss = _Wilder(period)
        self._value: float | None = None

    @property
    def value(self) -> float | None:
        """The last RSI, or None before ``period + 1`` closes."""
        return self._value

    def update(self, close: float) -> float | None:
        """Add one close; the first value needs ``period`` changes."""
        prev, self._prev = self._prev, close
        if prev is None:
            return None
        change = close - prev
        gain = self._gain.update(max(0.0, change))
        loss = self._loss.update(max(0.0, -change))
        if gain is None or loss is None:
            return None
        total = gain + loss
        self._value = 50.0 if total == 0.0 else 100.0 * gain / total
        return self._value


class MacdValue(NamedTuple):
    """MACD line, its signal EMA and the histogram (line - signal)."""

    macd: float
    signal: float | None
    histogram: float | None


class MACD:
    """Moving average convergence/divergence: EMA(fast) - EMA(slow), signal EMA."""

    __slots__ = ("_fast", "_signal", "_slow", "_value", "fast", "signal", "slow")

    def __init__(self, fast: int = 12, slow: int = 26, signal: int = 9) -> None:
        for p in (fast, slow, signal):
            _check_period(p)
        if fast >= slow:
            raise ValueError(f"MACD fast period {fast} must be shorter than slow {slow}")
        self.fast, self.slow, self.signal = fast, slow, signal
        self._fast = EMA(fast)
        self._slow = EMA(slow)
        self._signal = EMA(signal)
        self._value: MacdValue | None = None

    @property
    def value(self) -> MacdValue | None:
        """The last (macd, signal, histogram), or None before ``slow`` closes."""
        return self._value

    def update(self, close: float) -> MacdValue | None:
        """Add one close; signal and histogram stay None for ``signal - 1`` more."""
        f = self._fast.update(close)
        s = self._slow.update(close)
        if f is None or s is None:
            return None
        line = f - s
        sig = self._signal.update(line)
        self._value = MacdValue(line, sig, None if sig is None else line - sig)
        return self._value


class ATR:
    """Average true range with Wilder smoothing."""

    __slots__ = ("_avg", "_prev_close", "period")

    def __init__(self, period: int = 14) -> None:
        _check_period(period)
        self.period = period
        self._prev_close: float | None = None
        self._avg = _Wilder(period)

    @property
    def value(self) -> float | None:
        """The last ATR, or None before ``period + 1`` candles."""
        return self._avg.value

    def update(self, high: float, low: float, close: float) -> float | None:
        """Add one candle; its true range uses the previous candle's close."""
        prev, self._prev_close = self._prev_close, close
        if prev is None:
            return None
        tr = max(high - low, abs(high - prev), abs(low - prev))
        return self._avg.update(tr)


class BollingerValue(NamedTuple):
    """Middle band (SMA) and the bands ``k`` standard deviations away."""

    middle: float
    upper: float
    lower: float


class Bollinger:
    """Bollinger bands: SMA(period) +- k * population std, rolling in O(1).

    The window mean and the sum of squared deviations are updated by replacing
    the oldest input (a stable Welford-style update rather than sum of squares,
    which cancels badly at BTC prices), and recomputed exactly now and then.
    """

    __slots__ = ("_m2", "_mean", "_since_resync", "_value", "_window", "k", "period")

    def __init__(self, period: int = 20, k: float = 2.0) -> None:
        _check_period(period)
        self.period, self.k = period, float(k)
        self._window: deque[float] = deque(maxlen=period)
        self._mean = 0.0
        self._m2 = 0.0
        self._since_resync = 0
        self._value: BollingerValue | None = None

    @property
    def value(self) -> BollingerValue | None:
        """The last bands, or None before ``period`` inputs."""
        return self._value

    def update(self, x: float) -> BollingerValue | None:
        """Add one input; returns the bands over the last ``period`` inputs."""
        self._roll(x)
        if len(self._window) < self.period:
            return None
        std = math.sqrt(max(self._m2, 0.0) / self.period)
        mid = self._mean
        self._value = BollingerValue(mid, mid + self.k * std, mid - self.k * std)
        return self._value

    def _roll(self, x: float) -> None:
        window = self._window
        if len(window) < self.period:
            window.append(x)
            delta = x - self._mean
            self._mean += delta / len(window)
            self._m2 += delta * (x - self._mean)
            return
        old = window[0]
        window.append(x)
        old_mean = self._mean
        self._mean += (x - old) / self.period
        self._m2 += (x - old) * (x - self._mean + old - old_mean)
        self._since_resync += 1
        if self._since_resync >= max(_RESYNC_EVERY, self.period):
            self._mean = math.fsum(window) / self.period
            self._m2 = math.fsum((v - self._mean) ** 2 for v in window)
            self._since_resync = 0


class CandleIndicators:
    """The default indicator set kept for every (symbol, timeframe) series.

    ``export()`` is the per-series part of the hooks' ``state["indicators"]``:
    every key is always present (values None while warming up) so a hook can
    index without guarding against KeyError.
    """

    __slots__ = ("atr14", "bb20", "count", "ema20", "ema50", "ema200", "macd", "rsi14", "sma20")

    def __init__(self) -> None:
        self.sma20 = SMA(20)
        self.ema20 = EMA(20)
        self.ema50 = EMA(50)
        self.ema200 = EMA(200)
        self.rsi14 = RSI(14)
        self.macd = MACD(12, 26, 9)
        self.atr14 = ATR(14)
        self.bb20 = Bollinger(20, 2.0)
        self.count = 0

    def update(self, high: float, low: float, close: float) -> None:
        """Feed one closed candle to every indicator."""
        self.count += 1
        self.sma20.update(close)
        self.ema20.update(close)
        self.ema50.update(close)
        self.ema200.update(close)
        self.rsi14.update(close)
        self.macd.update(close)
        self.atr14.update(high, low, close)
        self.bb20.update(close)

    def export(self) -> dict[str, Any]:
        """Current values as plain JSON-compatible data."""
        m = self.macd.value
        bb = self.bb20.value
        return {
            "count": self.count,
            "sma20": self.sma20.value,
            "ema20": self.ema20.value,
            "ema50": self.ema50.value,
            "ema200": self.ema200.value,
            "rsi14": self.rsi14.value,
            "macd": {
                "macd": None if m is None else m.macd,
                "signal": None if m is None else m.signal,
                "histogram": None if m is None else m.histogram,
            },
            "atr14": self.atr14.value,
            "bb20": {
                "middle": None if bb is None else bb.middle,
                "upper": None if bb is None else bb.upper,
                "lower": None if bb is None else bb.lower,
            },
        }
