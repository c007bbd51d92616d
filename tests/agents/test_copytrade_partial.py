"""A leader edits its stop while the follower's copy is only partly filled: the stop
that protects the filled part moves, and grows with the later parts."""

from __future__ import annotations

from pathlib import Path

import anyio
from anyio.abc import TaskStatus

from daemon.events import (
    MARKET_CANDLE_CLOSED,
    MARKET_PRICE_TICK,
    FeedEvent,
    Publish,
    candle_event_id,
    iso_ms,
    now_ms,
)
from feeds.base import FeedHealth
from tests.agents.test_copytrade_signals import evaluated, hook_rows, run_daemon
from tests.agents.test_pipeline import audit
from tests.feeds.copytrade_client import post, signal

# Entries as limits at the leader's price; a new stop-loss onto the stop order of an
# entry that has filled, even in part (as agents/follower does).
FOLLOWER = """
def evaluate(event, state):
    s = event["payload"]
    p = state["copytrade"]["position"]
    if s["kind"] == "opened":
        return {"decision": "TRADE_INTENT", "reason": "copy",
                "intent": {"action": "PLACE_LIMIT_ORDER", "symbol": s["symbol"], "side": "buy",
                           "volume": p["target"], "openPrice": s["price"],
                           "stopLoss": s["stopLoss"]}}
    filled = [o["clientOrderId"] for o in p["mirrored"]["orders"].values() if o["filledVolume"] > 0]
    for o in state["orders"]:
        if o.get("parentId") in filled and o["role"] == "stop_loss":
            return {"decision": "TRADE_INTENT",
                    "reason": "stop to " + str(s["stopLoss"]) + " with "
                              + str(p["mirrored"]["quantity"]) + " filled",
                    "intent": {"action": "MODIFY_ORDER", "symbol": s["symbol"],
                               "orderId": o["clientOrderId"], "stopLoss": s["stopLoss"]}}
    return {"decision": "IGNORE", "reason": "nothing filled yet"}
"""


class Market:
    """A BTC-USD price, then the candles a test pushes."""

    name = "market"

    def __init__(self) -> None:
        self.send, self.receive = anyio.create_memory_object_stream[FeedEvent](10)
        self.t0 = now_ms()

    async def run(
        self, publish: Publish, health: FeedHealth, *, task_status: TaskStatus[None]
    ) -> None:
        task_status.started()
        at = self.t0
        await publish(
            FeedEvent(event_id=f"t:{at}", ts=iso_ms(at), source="t", topic=MARKET_PRICE_TICK,
                      symbol="BTC-USD", payload={"price": 97000.0})
        )  # fmt: skip
        async with self.receive:
            async for event in self.receive:
                health.beat()
                await publish(event)

    async def candle(self, i: int, volume: float) -> None:
        """A closed minute whose low reaches 96,400 (the copy's limit is 96,500)."""
        close_ms = self.t0 + 60_000 * i
        await self.send.send(
            FeedEvent(
                event_id=candle_event_id("t", "BTC-USD", "1m", close_ms),
                ts=iso_ms(close_ms), source="t", topic=MARKET_CANDLE_CLOSED,
                symbol="BTC-USD", timeframe="1m",
                payload={"open": 96600.0, "high": 96700.0, "low": 96400.0, "close": 96600.0,
                         "volume": volume, "openTimeMs": close_ms - 60_000,
                         "closeTimeMs": close_ms},
            )
        )  # fmt: skip


def stop_rows(root: Path) -> list[tuple[str, float, float | None]]:
    return [
        (r["status"], r["volume"], r.get("price"))
        for r in audit(root)
        if r["type"] == "order" and r["role"] == "stop_loss"
    ]


async def test_a_leader_edit_during_a_partial_fill(tmp_path: Path) -> None:
    hooks = tmp_path / "agents" / "follower" / "hooks"
    hooks.mkdir(parents=True)
    (hooks.parent / "agent.toml").write_text('topics = ["copytrade.signal.*"]\n')
    (hooks / "copytrade_partial.py").write_text(FOLLOWER)
    market = Market()

    async def leader(url: str) -> None:
        entry = signal("s1", quantity=0.02, price=96500.0, stopLoss=94000.0)
        assert (await post(url, entry))[0] == 200
        await evaluated(tmp_path, 1)
        await market.candle(1, volume=0.04)  # 10 % of it: 0.004 of the copy's 0.01
        await anyio.sleep(0.3)
        assert (await post(url, signal("s2", "modified", stopLoss=95000.0)))[0] == 200
        await evaluated(tmp_path, 2)
        await anyio.sleep(0.3)
        await market.candle(2, volume=1.0)  # the remaining 0.006
        await anyio.sleep(0.5)
        market.send.close()

    status = await run_daemon(tmp_path, leader, market=market, participation=0.1)
    reasons = [r["reason"] for r in hook_rows(tmp_path)]
    assert reasons == ["copy", "stop to 95000.0 with 0.004 filled"]
    entry = [
        (r["status"], r["volume"], r.get("filled"))
        for r in audit(tmp_path)
        if r["type"] == "order" and r["role"] == "entry"
    ]
    assert entry == [
        ("OPEN", 0.01, None),
        ("PARTIALLY_FILLED", 0.01, 0.004),
        ("FILLED", 0.01, None),
    ]
    # the stop: placed for the first part, moved by the edit, grown by the last part
    assert stop_rows(tmp_path) == [
        ("OPEN", 0.004, 94000.0),
        ("OPEN", 0.004, 95000.0),
        ("OPEN", 0.01, 95000.0),
    ]
    assert status.components["copytrade"]["drift"] == {}  # a working copy is no drift
