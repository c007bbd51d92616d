"""Risk check and paper-broker costs, against baselines measured in the same run.

    .venv/bin/python bench/trading_bench.py [--n 20000]

1. RiskEngine.check per intent, against parse_intent alone (the validation
   every intent pays anyway).
2. PaperBroker.submit (record PENDING_SUBMIT, open, fill, position) per order
   with synchronous=FULL (the default: survives power loss) against NORMAL
   (survives a process crash only).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

import anyio

from daemon.events import FeedEvent
from daemon.trading.broker import OrderRequest
from daemon.trading.intents import RiskLimits, parse_intent
from daemon.trading.paper import PaperBroker
from daemon.trading.portfolio import PortfolioView
from daemon.trading.risk import RiskEngine

RAW: dict[str, Any] = {
    "action": "PLACE_LIMIT_ORDER",
    "symbol": "ETH-USD",
    "side": "buy",
    "volume": 0.01,
    "openPrice": 1000.0,
    "stopLoss": 990.0,
    "takeProfit": 1020.0,
}


def per_call_us(fn: Any, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


async def submit_us(n: int, sync: Literal["NORMAL", "FULL"]) -> float:
    async def publish(_: FeedEvent) -> None:
        return None

    with tempfile.TemporaryDirectory() as d:
        broker = PaperBroker(Path(d), publish, synchronous=sync)
        await broker.on_tick("ETH-USD", 1000.0, 1)
        intent = parse_intent(
            {**RAW, "action": "PLACE_MARKET_ORDER", "openPrice": None, "takeProfit": None}
        )
        t0 = time.perf_counter()
        for i in range(n):
            await broker.submit(OrderRequest(client_order_id=f"c{i}", agent_id="a", intent=intent))
        elapsed = time.perf_counter() - t0
        broker.close()
    return elapsed / n * 1e6


async def main(n: int) -> None:
    engine = RiskEngine(RiskLimits())
    intent = parse_intent(RAW)
    view = PortfolioView()
    parse = per_call_us(lambda: parse_intent(RAW), n)
    check = per_call_us(lambda: engine.check(intent, view, 1000.0, 0), n)
    print(f"parse_intent: {parse:.2f} us/intent (baseline)")
    print(f"RiskEngine.check: {check:.2f} us/intent (ratio {check / parse:.1f}x parse)")
    m = max(50, n // 100)
    normal = await submit_us(m, "NORMAL")
    full = await submit_us(m, "FULL")
    print(
        f"PaperBroker.submit (market, fills, {m} orders): NORMAL {normal:.0f} us, FULL {full:.0f} us "
        f"(ratio FULL/NORMAL {full / normal:.2f})"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=20_000)
    anyio.run(main, parser.parse_args().n)
