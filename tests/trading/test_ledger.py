"""A Ledger fed the paper broker's own account events holds what the broker holds."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from daemon.trading.ledger import Ledger
from daemon.trading.paper import PaperBroker
from tests.trading.test_paper import MIN, T0, Sink, bar, request


@pytest.fixture
def sink() -> Sink:
    return Sink()


@pytest.fixture
def broker(tmp_path: Path, sink: Sink) -> Iterator[PaperBroker]:
    b = PaperBroker(tmp_path, sink)
    yield b
    b.close()


def ledger_of(sink: Sink, account: str) -> Ledger:
    ledger = Ledger(account)
    for event in sink.events:
        ledger.apply(event)
    return ledger


def same(broker: PaperBroker, sink: Sink, account: str = "agent") -> None:
    got = ledger_of(sink, account).state()
    assert got["positions"] == msgspec.to_builtins(broker.positions(account))
    assert got["orders"] == list(msgspec.to_builtins(broker.open_orders(account)))


async def test_positions_and_working_orders_follow_the_broker(
    broker: PaperBroker, sink: Sink
) -> None:
    """Step by step: a bracketed entry rests, fills (its children appear), a second
    buy adds to the position (no position event: netted from the fill), the stop
    closes it all (one-cancels-other); at every step the ledger equals the broker."""
    await broker.on_tick("BTC", 100.0, T0)
    same(broker, sink)
    entry = request("e1", action="PLACE_LIMIT_ORDER", openPrice=99.0, stopLoss=95.0,
                    takeProfit=110.0, volume=1.0)  # fmt: skip
    await broker.submit(entry)
    same(broker, sink)
    await broker.on_candle("BTC", bar(100, 100, 98.5, 99.5, T0 + MIN))  # entry fills
    same(broker, sink)
    assert ledger_of(sink, "agent").positions["BTC"].quantity == 1.0
    await broker.submit(request("e2", volume=0.5))  # market buy at the last price
    await broker.on_tick("BTC", 101.0, T0 + 2 * MIN)
    same(broker, sink)
    await broker.on_candle("BTC", bar(101, 101, 94.0, 94.5, T0 + 3 * MIN))  # the stop
    same(broker, sink)
    assert ledger_of(sink, "other").state() == {"positions": {}, "orders": []}
