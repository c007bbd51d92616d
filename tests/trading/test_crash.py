"""kill -9 between intent and fill, then restart: the order exists exactly once."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from daemon.events import FeedEvent
from daemon.trading.broker import OrderRequest, client_order_id
from daemon.trading.intents import parse_intent
from daemon.trading.paper import PaperBroker

INTENT = {
    "action": "PLACE_MARKET_ORDER",
    "symbol": "BTC",
    "side": "buy",
    "volume": 1.5,
    "stopLoss": 90.0,
}

CHILD = textwrap.dedent(
    """
    import asyncio, os, signal, sys
    from pathlib import Path
    from daemon.trading.broker import OrderRequest, client_order_id
    from daemon.trading.intents import parse_intent
    from daemon.trading.paper import PaperBroker

    state_dir, stage = Path(sys.argv[1]), sys.argv[2]

    def die(*_args, **_kw):
        os.kill(os.getpid(), signal.SIGKILL)

    async def publish(event):
        if stage == "opened" and event.topic == "account.order.placed":
            die()  # the order is OPEN in the store, the event never left

    async def main():
        broker = PaperBroker(state_dir, publish)
        if stage == "recorded":
            broker._open = die  # crash right after the PENDING_SUBMIT commit
        if stage == "filling":
            await broker.on_tick("BTC", 100.0, 1_700_000_000_000)  # a price: fills on arrival
            broker._fill = die  # crash while the arrival fill is written
        intent = parse_intent(INTENT_REPR)
        await broker.submit(OrderRequest(
            client_order_id=client_order_id("agent", "dedupe-1"), agent_id="agent", intent=intent))
        print("not killed")

    asyncio.run(main())
    """
).replace("INTENT_REPR", repr(INTENT))


def run_child(state_dir: Path, stage: str, script: str = CHILD) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", script, str(state_dir), stage],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr


@pytest.mark.parametrize(("stage", "status"), [("recorded", "PENDING_SUBMIT"), ("opened", "OPEN")])
async def test_resubmit_after_kill_places_one_order(
    tmp_path: Path, stage: str, status: str
) -> None:
    """After SIGKILL mid-submit, resubmitting the same intent yields one order and one fill."""
    run_child(tmp_path, stage)
    published: list[FeedEvent] = []

    async def publish(event: FeedEvent) -> None:
        published.append(event)

    broker = PaperBroker(tmp_path, publish)
    try:
        coid = client_order_id("agent", "dedupe-1")
        crashed = broker.get_order(coid)
        assert crashed is not None and crashed.status == status
        request = OrderRequest(client_order_id=coid, agent_id="agent", intent=parse_intent(INTENT))
        await broker.submit(request)
        await broker.submit(request)
        await broker.on_tick("BTC", 100.0, 1_700_000_000_000)
        entries = [o for o in broker.orders() if o.role == "entry"]
        assert [o.client_order_id for o in entries] == [coid]
        assert entries[0].status == "FILLED"
        assert broker.positions("agent")["BTC"].quantity == 1.5
        placed = [
            e
            for e in published
            if e.topic == "account.order.placed" and e.payload["role"] == "entry"
        ]
        assert len(placed) == (1 if stage == "recorded" else 0)
    finally:
        broker.close()


async def test_recover_finishes_pending_orders(tmp_path: Path) -> None:
    """recover() opens orders recorded before a crash, exactly once."""
    run_child(tmp_path, "recorded")

    async def publish(event: FeedEvent) -> None:
        return None

    broker = PaperBroker(tmp_path, publish)
    try:
        recovered = await broker.recover()
        assert [o.status for o in recovered] == ["OPEN"]
        assert await broker.recover() == []
    finally:
        broker.close()


async def test_a_crash_while_filling_on_arrival_leaves_the_order_unopened(tmp_path: Path) -> None:
    """Opening a market order and its fill on arrival are one transaction: a crash in
    between used to leave it OPEN and unfilled, to fill a candle late (seen in a
    kill -9 replay); now nothing of it happened, and recover() opens and fills it
    at once, as it would have without the crash."""
    run_child(tmp_path, "filling")

    async def publish(event: FeedEvent) -> None:
        return None

    broker = PaperBroker(tmp_path, publish)
    try:
        coid = client_order_id("agent", "dedupe-1")
        crashed = broker.get_order(coid)
        assert crashed is not None and crashed.status == "PENDING_SUBMIT"
        await broker.on_tick("BTC", 100.0, 1_700_000_000_000)  # the price, as it was
        [recovered] = await broker.recover()
        assert recovered.status == "FILLED" and recovered.filled_volume == 1.5
        assert broker.positions("agent")["BTC"].quantity == 1.5
    finally:
        broker.close()


MOVED = (
    textwrap.dedent(
        """
    import asyncio, os, signal, sys
    from pathlib import Path
    from daemon.trading.broker import OrderRequest
    from daemon.trading.intents import parse_intent
    from daemon.trading.paper import PaperBroker

    async def publish(event):
        return None

    def die(*_args, **_kw):
        os.kill(os.getpid(), signal.SIGKILL)

    async def main():
        broker = PaperBroker(Path(sys.argv[1]), publish)
        await broker.on_tick("BTC", 100.0, 1_700_000_000_000)
        first = parse_intent(MARKET)  # fills at 100: the stored mark is 100
        await broker.submit(OrderRequest(client_order_id="first", agent_id="agent", intent=first))
        await broker.on_tick("BTC", 92.0, 1_700_000_060_000)  # the market moves (not stored)
        broker._open = die  # crash right after the limit order's PENDING_SUBMIT commit
        limit = parse_intent(LIMIT)
        await broker.submit(OrderRequest(client_order_id="limit", agent_id="agent", intent=limit))

    asyncio.run(main())
    """
    )
    .replace("MARKET", repr(INTENT))
    .replace(
        "LIMIT",
        repr({**INTENT, "action": "PLACE_LIMIT_ORDER", "openPrice": 95.0, "stopLoss": 80.0}),
    )
)


@pytest.mark.parametrize("as_recorded", [True, False])
async def test_recovery_on_event_time_opens_as_recorded(tmp_path: Path, as_recorded: bool) -> None:
    """A replay (event time) recovers an order at the time and price it was recorded at,
    as the run without the crash had it: a buy limit at 95 recorded with the market at
    92 fills at 92 then. The stored mark (100, the last fill's) would leave it open,
    stamped with the wall clock: live recovery, which opens it now, at the last price."""
    run_child(tmp_path, "recorded", MOVED)

    async def publish(event: FeedEvent) -> None:
        return None

    broker = PaperBroker(tmp_path, publish)
    try:
        assert broker.get_order("limit").status == "PENDING_SUBMIT"  # type: ignore[union-attr]
        [order] = await broker.recover(as_recorded=as_recorded)
        if as_recorded:
            assert (order.status, order.fill_price) == ("FILLED", 92.0)
            assert order.filled_ms == order.created_ms == 1_700_000_060_000
        else:
            assert order.status == "OPEN" and order.updated_ms > 1_700_000_060_000
    finally:
        broker.close()


async def test_live_recovery_waits_for_this_runs_price(tmp_path: Path) -> None:
    """Live, an order recorded before a crash and recovered at start is not filled at
    the store's last price (the last fill's, maybe hours old): it waits for the
    first price of this run, as a new order after a restart does."""

    async def publish(event: FeedEvent) -> None:
        return None

    before = PaperBroker(tmp_path, publish)
    await before.on_tick("BTC", 100.0, 1_700_000_000_000)
    first = OrderRequest(client_order_id="first", agent_id="agent", intent=parse_intent(INTENT))
    await before.submit(first)  # fills at 100: the stored price
    before._record(
        OrderRequest(client_order_id="lost", agent_id="agent", intent=parse_intent(INTENT))
    )
    before.close()  # (the crash: recorded, never opened)

    after = PaperBroker(tmp_path, publish)
    try:
        [order] = await after.recover()
        assert order.status == "OPEN" and order.fill_price is None
        await after.on_tick("BTC", 120.0, 1_700_000_600_000)
        filled = after.get_order("lost")
        assert filled is not None and (filled.status, filled.fill_price) == ("FILLED", 120.0)
    finally:
        after.close()
