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

    def die(*_args):
        os.kill(os.getpid(), signal.SIGKILL)

    async def publish(event):
        if stage == "opened" and event.topic == "account.order.placed":
            die()  # the order is OPEN in the store, the event never left

    async def main():
        broker = PaperBroker(state_dir, publish)
        if stage == "recorded":
            broker._open = die  # crash right after the PENDING_SUBMIT commit
        intent = parse_intent(INTENT_REPR)
        await broker.submit(OrderRequest(
            client_order_id=client_order_id("agent", "dedupe-1"), agent_id="agent", intent=intent))
        print("not killed")

    asyncio.run(main())
    """
).replace("INTENT_REPR", repr(INTENT))


def run_child(state_dir: Path, stage: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(state_dir), stage],
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
