"""SYNTHETIC candle data for the offline demo and tests: not market data.

A seeded random walk that looks enough like a crypto chart to exercise the
example hooks: trend regimes, volatility clusters (GARCH-like), a few forced
runs of green candles, doji candles (close == open), and one crash of about
20% within 24 h of candles. The output is the replay CSV
(``open_time_ms,open,high,low,close,volume``, no comment line, so the header
stays exact); name files ``synthetic_<SYMBOL>_<tf>.csv`` so nobody mistakes
them for recordings. Same arguments -> byte-identical file (stdlib ``random``
with an explicit seed, fixed formatting).

    python -m feeds.synthetic synthetic_BTC-USD_1m.csv --seed 7 --n 4320
"""

from __future__ import annotations

import argparse
import math
import random
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Final, NamedTuple

from daemon.events import TIMEFRAMES

DEFAULT_START_MS: Final = 1_704_067_200_000  # 2024-01-01T00:00:00Z
CRASH_DROP: Final = 0.20  # the crash's total drift, as a fraction of price
GREEN_RUNS: Final = 3
GREEN_RUN_LENGTH: Final = 6
DOJI_PROBABILITY: Final = 0.04


class Row(NamedTuple):
    """One synthetic candle."""

    open_time_ms: int
    open: float
    high: float
    low: float
    close: float
    volume: float


class _Script(NamedTuple):
    crash: range  # bar indices of the crash
    green: frozenset[int]  # bar indices forced green


def _script(rng: random.Random, n: int, tf_s: int) -> _Script:
    """Where the crash and the green runs go (deterministic for the seed)."""
    bars_per_day = max(1, 86_400 // tf_s)
    length = max(1, min(bars_per_day // 2, n // 5))
    start = int(n * 0.6)
    green: set[int] = set()
    for _ in range(GREEN_RUNS):
        at = rng.randrange(0, max(1, start - GREEN_RUN_LENGTH))
        green.update(range(at, at + GREEN_RUN_LENGTH))
    return _Script(crash=range(start, start + length), green=frozenset(green))


def synthetic_rows(
    *, seed: int, n: int, start_ms: int, timeframe: str, start_price: float
) -> Iterator[Row]:
    """The candles, oldest first; ``start_ms`` is floored to the timeframe."""
    if n < 10:
        raise ValueError("n must be at least 10 candles")
    if start_price <= 0:
        raise ValueError("start_price must be positive")
    tf_s = TIMEFRAMES[timeframe]
    rng = random.Random(seed)
    script = _script(rng, n, tf_s)
    base_sigma = min(0.05, 0.0012 * math.sqrt(tf_s / 60))
    crash_step = math.log(1 - CRASH_DROP) / len(script.crash)
    variance, drift, price = base_sigma**2, 0.0, float(start_price)
    open_ms = start_ms // (tf_s * 1000) * tf_s * 1000
    last_r = 0.0
    for i in range(n):
        if rng.random() < 1 / 150:  # new trend regime
            drift = rng.gauss(0, base_sigma * 0.15)
        variance = base_sigma**2 * 0.03 + 0.07 * last_r**2 + 0.90 * variance
        sigma = math.sqrt(variance)
        r = drift + rng.gauss(0, sigma)
        if i in script.crash:
            r = crash_step + rng.gauss(0, base_sigma * 0.5)
        elif i in script.green:
            r = abs(r) + base_sigma * 0.2
        elif rng.random() < DOJI_PROBABILITY:
            r = 0.0
        last_r = r
        row = _candle(
            rng, open_ms + i * tf_s * 1000, price, r, sigma, base_sigma, i in script.crash
        )
        price = row.close
        yield row


def _candle(
    rng: random.Random, open_ms: int, price: float, r: float, sigma: float, base: float, crash: bool
) -> Row:
    o = round(price, 2)
    c = o if r == 0.0 else round(o * math.exp(r), 2)
    h = round(max(o, c) * math.exp(abs(rng.gauss(0, sigma * 0.6))), 2)
    lo = round(min(o, c) * math.exp(-abs(rng.gauss(0, sigma * 0.6))), 2)
    volume = 40.0 * math.exp(rng.gauss(0, 0.35)) * (sigma / base) * (3.0 if crash else 1.0)
    return Row(open_ms, o, h, lo, c, round(volume, 4))


def format_row(row: Row) -> str:
    """One CSV line (no newline), fixed precision so files are byte-stable."""
    return (
        f"{row.open_time_ms},{row.open:.2f},{row.high:.2f},{row.low:.2f},"
        f"{row.close:.2f},{row.volume:.4f}"
    )


def generate_candles(
    path: Path | str,
    *,
    seed: int,
    n: int,
    start_ms: int = DEFAULT_START_MS,
    timeframe: str = "1m",
    start_price: float = 30_000.0,
) -> int:
    """Write a SYNTHETIC candle CSV for replay; returns the number of rows."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = synthetic_rows(
        seed=seed, n=n, start_ms=start_ms, timeframe=timeframe, start_price=start_price
    )
    count = 0
    with out.open("w", encoding="utf-8", newline="\n") as fh:
        fh.write("open_time_ms,open,high,low,close,volume\n")
        for row in rows:
            fh.write(format_row(row) + "\n")
            count += 1
    return count


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m feeds.synthetic OUT [--seed --n --timeframe --start-price --start-ms]``."""
    parser = argparse.ArgumentParser(description="Write a SYNTHETIC OHLCV candle CSV for replay.")
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--n", type=int, default=4320)
    parser.add_argument("--timeframe", choices=sorted(TIMEFRAMES), default="1m")
    parser.add_argument("--start-price", type=float, default=30_000.0)
    parser.add_argument("--start-ms", type=int, default=DEFAULT_START_MS)
    args = parser.parse_args(argv)
    generate_candles(
        args.out,
        seed=args.seed,
        n=args.n,
        start_ms=args.start_ms,
        timeframe=args.timeframe,
        start_price=args.start_price,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
