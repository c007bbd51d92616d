"""Paper fills in parts: a candle's volume caps what one order fills in it
(``[trading] paper_max_participation``); the rest keeps working."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from daemon.audit.render import render
from daemon.errors import BrokerError
from daemon.events import Candle
from daemon.trading.intents import parse_intent
from daemon.trading.ledger import Ledger
from daemon.trading.paper import PaperBroker
from daemon.trading.records import order_record_from_event
from tests.trading.test_paper import MIN, T0, Sink, request


def bar(low: float, close: float, volume: float, close_ms: int) -> Candle:
    return Candle(
        open=close, high=close + 1, low=low, close=close, volume=volume,
        open_time_ms=close_ms - MIN, close_time_ms=close_ms,
    )  # fmt: skip


@pytest.fixture
def sink() -> Sink:
    return Sink()


@pytest.fixture
def parts(tmp_path: Path, sink: Sink) -> Iterator[PaperBroker]:
    b = PaperBroker(tmp_path, sink, max_participation=0.1)
    yield b
    b.close()


async def test_a_limit_fills_in_parts_with_its_bracket_growing(
    parts: PaperBroker, sink: Sink
) -> None:
    await parts.on_tick("BTC", 100.0, T0)
    entry = await parts.submit(
        request(action="PLACE_LIMIT_ORDER", openPrice=98.0, stopLoss=90.0, volume=2.0)
    )
    coid = entry.client_order_id
    await parts.on_candle("BTC", bar(97, 99, 8.0, T0 + MIN))  # 10 % of 8 = 0.8
    got = parts.get_order(coid)
    assert got is not None and (got.status, got.filled_volume) == ("OPEN", 0.8)
    assert parts.positions("agent")["BTC"].quantity == 0.8
    stop = parts.get_order(coid + ":sl")
    assert stop is not None and (stop.status, stop.volume) == ("OPEN", 0.8)
    await parts.on_candle("BTC", bar(97, 99, 8.0, T0 + 2 * MIN))
    assert parts.get_order(coid).filled_volume == pytest.approx(1.6)  # type: ignore[union-attr]
    assert parts.get_order(coid + ":sl").volume == pytest.approx(1.6)  # type: ignore[union-attr]
    await parts.on_candle("BTC", bar(97, 99, 100.0, T0 + 3 * MIN))  # the last 0.4
    done = parts.get_order(coid)
    assert done is not None and (done.status, done.filled, done.fill_price) == ("FILLED", 2.0, 98.0)
    assert parts.positions("agent")["BTC"].quantity == pytest.approx(2.0)
    assert parts.get_order(coid + ":sl").volume == 2.0  # type: ignore[union-attr]

    # every part is an account.order.filled: audited as PARTIALLY_FILLED, then FILLED;
    # a ledger fed the events ends where the broker is
    fills = [e for e in sink.events if e.topic == "account.order.filled"]
    records = [order_record_from_event(e) for e in fills]
    assert [(r.status, r.filled) for r in records if r] == [
        ("PARTIALLY_FILLED", 0.8), ("PARTIALLY_FILLED", pytest.approx(1.6)), ("FILLED", None)
    ]  # fmt: skip
    assert (
        "order PARTIALLY_FILLED buy 0.8 of 2.0 BTC" in render(msgspec.to_builtins(records[0])).plain
    )
    ledger = Ledger("agent")
    for e in sink.events:
        ledger.apply(e)
    assert ledger.positions["BTC"].quantity == pytest.approx(2.0)


async def test_an_edit_during_a_partial_fill_moves_the_live_stop_and_cannot_undercut_it(
    parts: PaperBroker,
) -> None:
    await parts.on_tick("BTC", 100.0, T0)
    entry = await parts.submit(
        request(action="PLACE_LIMIT_ORDER", openPrice=98.0, stopLoss=90.0, volume=2.0)
    )
    coid = entry.client_order_id
    await parts.on_candle("BTC", bar(97, 99, 5.0, T0 + MIN))  # 0.5 filled
    change = parse_intent(
        {"action": "MODIFY_ORDER", "symbol": "BTC", "orderId": coid, "stopLoss": 94.0}
    )
    moved = await parts.modify(coid, change)
    assert moved.stop_loss == 94.0 and moved.filled_volume == 0.5
    assert parts.get_order(coid + ":sl").stop_price == 94.0  # type: ignore[union-attr]
    shrink = parse_intent(
        {"action": "MODIFY_ORDER", "symbol": "BTC", "orderId": coid, "volume": 0.4}
    )
    with pytest.raises(BrokerError, match=r"0\.5 filled already"):
        await parts.modify(coid, shrink)
    # canceled with a part filled: the part stays, protected by its stop
    canceled = await parts.cancel(coid)
    assert (canceled.status, canceled.filled) == ("CANCELED", 0.5)
    await parts.on_tick("BTC", 93.0, T0 + 2 * MIN)
    assert parts.get_order(coid + ":sl").status == "FILLED"  # type: ignore[union-attr]
    assert "BTC" not in parts.positions("agent")
    assert parts.realized_pnl("agent") == pytest.approx(0.5 * (93.0 - 98.0))


async def test_without_a_cap_or_volume_an_order_fills_whole(tmp_path: Path, sink: Sink) -> None:
    for participation, volume in ((0.0, 8.0), (0.1, 0.0)):
        b = PaperBroker(tmp_path / str(participation), sink, max_participation=participation)
        try:
            await b.on_tick("BTC", 100.0, T0)
            o = await b.submit(request(action="PLACE_LIMIT_ORDER", openPrice=98.0))
            await b.on_candle("BTC", bar(97, 99, volume, T0 + MIN))
            assert b.get_order(o.client_order_id).status == "FILLED"  # type: ignore[union-attr]
        finally:
            b.close()
