"""Random intents and market data through the desk and the paper broker: nothing
raises, each position is the sum of its fills, and the realized PnL the broker books
is what an independent average-cost recomputation from the same fills gives."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pytest

from daemon.errors import HookResultInvalid
from daemon.events import Candle, FeedEvent
from daemon.trading.desk import TradeDesk
from daemon.trading.intents import RiskLimits, parse_intent
from daemon.trading.matching import FillCosts
from daemon.trading.paper import PaperBroker
from daemon.trading.paper_store import FillRow

SYMBOLS = ("BTC", "ETH")
MINUTE = 60_000
ACTIONS = ("PLACE_MARKET_ORDER", "PLACE_LIMIT_ORDER", "PLACE_LIMIT_ORDER", "CLOSE_POSITION",
           "MODIFY_ORDER", "CANCEL_ORDER")  # fmt: skip
LOOSE = RiskLimits(
    max_order_notional=1e9,
    max_position_per_symbol=1e9,
    max_total_exposure=1e9,
    max_open_orders=50,
    max_orders_per_minute=1000,
    daily_loss_limit=1e9,
    limit_price_band_pct=50.0,
)


def recomputed(fills: list[FillRow]) -> float:
    """Realized PnL of ``fills`` (one symbol, in order) by average cost, before fees."""
    qty = avg = realized = 0.0
    for f in fills:
        if qty == 0 or (qty > 0) == (f.qty > 0):
            avg = (qty * avg + f.qty * f.price) / (qty + f.qty) if qty else f.price
            qty += f.qty
            continue
        realized += min(abs(f.qty), abs(qty)) * (f.price - avg) * (1 if qty > 0 else -1)
        after = qty + f.qty
        if abs(after) < 1e-12:
            qty = avg = 0.0
        elif (after > 0) == (qty > 0):
            qty = after
        else:
            qty, avg = after, f.price  # flipped: the rest opened at this fill's price
    return realized


def random_intent(rnd: random.Random, symbol: str, price: float, broker: PaperBroker) -> Any:
    """An intent a hook might send, well-formed or not (None: the hook's own error)."""
    action = rnd.choice(ACTIONS)
    raw: dict[str, Any] = {"action": action, "symbol": symbol, "side": rnd.choice(["buy", "sell"]),
                           "volume": rnd.choice([0.001, 0.1, 1.0, 2.5, 1e-9])}  # fmt: skip
    sign = 1 if raw["side"] == "buy" else -1
    if action == "PLACE_LIMIT_ORDER":
        raw["openPrice"] = round(price * (1 + rnd.gauss(0, 0.02)), 4)
        if rnd.random() < 0.5:
            raw["expiresInSeconds"] = rnd.choice([30, 600, 3600])
    if action.startswith("PLACE") and rnd.random() < 0.7:
        raw["stopLoss"] = round(price * (1 - sign * abs(rnd.gauss(0.02, 0.02))), 4)
        if rnd.random() < 0.6:
            raw["takeProfit"] = round(price * (1 + sign * abs(rnd.gauss(0.03, 0.02))), 4)
    if action in ("MODIFY_ORDER", "CANCEL_ORDER"):
        working = [o.client_order_id for o in broker.open_orders("a")]
        raw["orderId"] = rnd.choice(working) if working and rnd.random() < 0.9 else "mw-none"
        if action == "MODIFY_ORDER":
            for key in rnd.sample(["openPrice", "stopLoss", "takeProfit", "volume"], 2):
                raw[key] = (
                    rnd.choice([0.05, 0.5, 3.0])
                    if key == "volume"
                    else round(price * (1 + rnd.gauss(0, 0.03)), 4)
                )
    if action == "CLOSE_POSITION" and rnd.random() < 0.5:
        del raw["volume"]
    try:
        return parse_intent(raw)
    except HookResultInvalid:
        return None


@pytest.mark.parametrize("seed", range(40))
async def test_the_books_agree_with_the_fills(tmp_path: Path, seed: int) -> None:
    rnd = random.Random(seed)

    async def publish(event: FeedEvent) -> None:
        pass

    costs = FillCosts(
        maker_fee_bps=rnd.choice([0, 2]),
        taker_fee_bps=rnd.choice([0, 5]),
        slippage_bps=rnd.choice([0, 3]),
    )
    participation = rnd.choice([0.0, 0.0, 0.3])  # partial fills a third of the time
    broker = PaperBroker(
        tmp_path, publish, synchronous="OFF", max_participation=participation, costs=costs
    )
    desk = TradeDesk(broker)
    desk.set_limits("a", LOOSE)
    price = {s: 100.0 * (1 + i) for i, s in enumerate(SYMBOLS)}
    t, placed = 1_700_000_000_000, 0
    try:
        for step in range(200):
            symbol, roll = rnd.choice(SYMBOLS), rnd.random()
            if roll < 0.35:
                t += MINUTE
                o = price[symbol]
                c = price[symbol] = o * math.exp(rnd.gauss(0, 0.02))
                high = max(o, c) * (1 + abs(rnd.gauss(0, 0.01)))
                low = min(o, c) * (1 - abs(rnd.gauss(0, 0.01)))
                volume = rnd.choice([0.0, 0.5, 5.0, 100.0])
                candle = Candle(open_time_ms=t - MINUTE, close_time_ms=t, open=o, high=high,
                                low=low, close=c, volume=volume)  # fmt: skip
                await broker.on_candle(symbol, candle)
            elif roll < 0.5:
                t += rnd.randrange(1, 5000)
                price[symbol] *= math.exp(rnd.gauss(0, 0.01))
                await broker.on_tick(symbol, price[symbol], t)
            elif (intent := random_intent(rnd, symbol, price[symbol], broker)) is not None:
                placed += 1
                await desk.handle(intent, agent_id="a", dedupe_key=f"k{placed}", trace_id="t")
            fills = broker._store.fills("a")
            positions = broker.positions("a")
            for s in SYMBOLS:
                mine = [f for f in fills if f.symbol == s]
                held = positions[s].quantity if s in positions else 0.0
                assert sum(f.qty for f in mine) == pytest.approx(held, abs=1e-6), (step, s)
                booked = sum(f.realized for f in mine)
                assert booked == pytest.approx(recomputed(mine), rel=1e-6, abs=1e-6), (step, s)
        assert placed > 20 and broker._store.fills("a")  # the walk traded
    finally:
        broker.close()
