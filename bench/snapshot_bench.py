"""The technical snapshot's timeframes built from finer candles (a replay of 1m data
holds only 1m: 15m, 1h and 4h are resampled from it per call), against the same
snapshot when the state holds each timeframe itself, same run.

    .venv/bin/python bench/snapshot_bench.py [--candles 12240] [--calls 20]

12,240 1m candles is what ``backtest --run-llm`` keeps of a 1m replay (enough
for 50 whole 4h candles). Prints milliseconds per timeframe built.
"""

from __future__ import annotations

import argparse
import random
import time

from daemon.events import TIMEFRAMES, iso_ms
from daemon.state import StateCache
from daemon.tools.context import ToolContext
from daemon.tools.snapshot import from_state

T0 = 1_700_006_400_000  # a day boundary (00:00 UTC)
WANTED = ("5m", "15m", "1h", "4h")


def candle(open_ms: int, price: float, step_ms: int) -> dict[str, object]:
    return {
        "open": price, "high": price * 1.001, "low": price * 0.999, "close": price,
        "volume": 1.0, "openTimeMs": open_ms, "closeTimeMs": open_ms + step_ms,
        "openTime": iso_ms(open_ms), "closeTime": iso_ms(open_ms + step_ms),
    }  # fmt: skip


def fill(state: StateCache, timeframe: str, n: int) -> None:
    rng = random.Random(7)
    step = TIMEFRAMES[timeframe] * 1000
    price = 100.0
    for i in range(n):
        price *= 1 + rng.gauss(0, 0.001)
        state.add_closed("BTCUSDT", timeframe, candle(T0 + i * step, price, step))


def per_call_ms(ctx: ToolContext, timeframe: str, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        assert from_state(ctx, "BTCUSDT", timeframe) is not None
    return (time.perf_counter() - start) / calls * 1000


def main(n: int, calls: int) -> None:
    finer = StateCache(max_candles=n)
    fill(finer, "1m", n)
    direct = StateCache(max_candles=n)
    for tf in WANTED:  # each timeframe held as such: no resampling
        fill(direct, tf, n * 60 // TIMEFRAMES[tf])
    for tf in WANTED:
        built = per_call_ms(ToolContext(state=finer), tf, calls)
        held = per_call_ms(ToolContext(state=direct), tf, calls)
        print(
            f"{tf:>3} from {n} 1m candles: {built:6.2f} ms a call; held as {tf}: "
            f"{held:5.2f} ms (ratio {built / held:.1f})"
        )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--candles", type=int, default=12_240)
    ap.add_argument("--calls", type=int, default=20)
    args = ap.parse_args()
    main(args.candles, args.calls)
