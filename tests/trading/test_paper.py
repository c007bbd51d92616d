"""PaperBroker: fills against ticks and candles, brackets, PnL, persistence, idempotency."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import structlog.testing

from daemon import events as ev
from daemon.errors import BrokerError
from daemon.events import Candle, FeedEvent
from daemon.trading.broker import OrderRequest, client_order_id
from daemon.trading.intents import parse_intent
from daemon.trading.paper import PaperBroker


def bar(o: float, h: float, lo: float, c: float, close_ms: int) -> Candle:
    """A closed one-minute candle from its prices and close time."""
    return Candle(
        open=o, high=h, low=lo, close=c, volume=0.0,
        open_time_ms=close_ms - 60_000, close_time_ms=close_ms,
    )  # fmt: skip


T0 = 1_700_000_000_000
MIN = 60_000


class Sink:
    """Collects published events."""

    def __init__(self) -> None:
        self.events: list[FeedEvent] = []

    async def __call__(self, event: FeedEvent) -> None:
        self.events.append(event)

    def topics(self) -> list[str]:
        return [e.topic.removeprefix("account.") for e in self.events]


def request(key: str = "k1", **kw: Any) -> OrderRequest:
    raw: dict[str, Any] = {
        "action": "PLACE_MARKET_ORDER",
        "symbol": "BTC",
        "side": "buy",
        "volume": 2.0,
    }
    raw.update(kw)
    intent = parse_intent({k: v for k, v in raw.items() if v is not None})
    return OrderRequest(
        client_order_id=client_order_id("agent", key),
        agent_id="agent",
        intent=intent,
        trace_id="tr1",
    )


@pytest.fixture
def sink() -> Sink:
    return Sink()


@pytest.fixture
def broker(tmp_path: Path, sink: Sink) -> Iterator[PaperBroker]:
    b = PaperBroker(tmp_path, sink)
    yield b
    b.close()


async def test_market_order_fills_at_last_tick(broker: PaperBroker, sink: Sink) -> None:
    """A market order fills at the last price; placed, filled and position.opened are published."""
    await broker.on_tick("BTC", 100.0, T0)
    order = await broker.submit(request())
    assert order.status == "FILLED" and order.fill_price == 100.0
    assert sink.topics() == ["order.placed", "order.filled", "position.opened"]
    e = sink.events[0]
    assert (e.source, e.account_id, e.partition_key, e.trace_id) == (
        "paper",
        "agent",
        "paper:agent:BTC",
        "tr1",
    )
    assert broker.positions("agent")["BTC"].quantity == 2.0


async def test_market_order_without_price_waits_for_tick(broker: PaperBroker) -> None:
    """With no known price a market order stays OPEN and fills on the next tick."""
    order = await broker.submit(request())
    assert order.status == "OPEN"
    await broker.on_tick("BTC", 101.0, T0 + 1)
    assert broker.get_order(order.client_order_id).fill_price == 101.0  # type: ignore[union-attr]


async def test_limit_buy_fills_on_tick_at_limit(broker: PaperBroker) -> None:
    """A resting buy limit ignores higher ticks and fills at its limit when traded through."""
    await broker.on_tick("BTC", 100.0, T0)
    order = await broker.submit(request(action="PLACE_LIMIT_ORDER", openPrice=98.0))
    assert order.status == "OPEN"
    await broker.on_tick("BTC", 99.0, T0 + 1)
    assert broker.get_order(order.client_order_id).status == "OPEN"  # type: ignore[union-attr]
    await broker.on_tick("BTC", 97.5, T0 + 2)
    filled = broker.get_order(order.client_order_id)
    assert filled is not None and (filled.status, filled.fill_price) == ("FILLED", 98.0)


async def test_marketable_limit_fills_at_market(broker: PaperBroker) -> None:
    """A buy limit above the market fills immediately at the market price."""
    await broker.on_tick("BTC", 100.0, T0)
    order = await broker.submit(request(action="PLACE_LIMIT_ORDER", openPrice=101.0))
    assert (order.status, order.fill_price) == ("FILLED", 100.0)


async def test_limit_fills_on_candle_low_only_for_later_candles(broker: PaperBroker) -> None:
    """A candle that closed before the order existed never fills it; the next one does."""
    await broker.on_tick("BTC", 100.0, T0)
    order = await broker.submit(request(action="PLACE_LIMIT_ORDER", openPrice=98.0))
    await broker.on_candle("BTC", bar(100, 101, 97, 100, T0))
    assert broker.get_order(order.client_order_id).status == "OPEN"  # type: ignore[union-attr]
    await broker.on_candle("BTC", bar(100, 101, 98, 99, T0 + MIN))
    assert broker.get_order(order.client_order_id).fill_price == 98.0  # type: ignore[union-attr]


async def test_stop_loss_on_tick_closes_and_cancels_target(broker: PaperBroker, sink: Sink) -> None:
    """A long's stop fills at the tick through it, realizes the loss and cancels the target."""
    await broker.on_tick("BTC", 100.0, T0)
    entry = await broker.submit(request(stopLoss=95.0, takeProfit=110.0))
    await broker.on_tick("BTC", 96.0, T0 + 1)
    assert broker.positions("agent")["BTC"].quantity == 2.0
    await broker.on_tick("BTC", 94.0, T0 + 2)
    sl = broker.get_order(entry.client_order_id + ":sl")
    tp = broker.get_order(entry.client_order_id + ":tp")
    assert sl is not None and (sl.status, sl.fill_price) == ("FILLED", 94.0)
    assert tp is not None and tp.status == "CANCELED"
    assert broker.positions("agent") == {}
    assert broker.realized_pnl("agent") == pytest.approx(-12.0)
    assert sink.topics()[-3:] == ["order.filled", "position.closed", "order.canceled"]
    closed = sink.events[-2].payload
    assert closed["realizedPnl"] == pytest.approx(-12.0) and closed["closePrice"] == 94.0


async def test_take_profit_on_candle_high(broker: PaperBroker) -> None:
    """A later candle reaching the target fills the take-profit at its price."""
    await broker.on_tick("BTC", 100.0, T0)
    entry = await broker.submit(request(stopLoss=95.0, takeProfit=110.0))
    await broker.on_candle("BTC", bar(100, 111, 99, 108, T0 + MIN))
    tp = broker.get_order(entry.client_order_id + ":tp")
    assert tp is not None and (tp.status, tp.fill_price) == ("FILLED", 110.0)
    assert broker.realized_pnl("agent") == pytest.approx(20.0)
    assert broker.get_order(entry.client_order_id + ":sl").status == "CANCELED"  # type: ignore[union-attr]


async def test_candle_with_both_stop_and_target_takes_the_stop(broker: PaperBroker) -> None:
    """When one candle spans both bracket levels the adverse one (stop) fires."""
    await broker.on_tick("BTC", 100.0, T0)
    entry = await broker.submit(request(stopLoss=95.0, takeProfit=110.0))
    await broker.on_candle("BTC", bar(100, 112, 93, 105, T0 + MIN))
    assert broker.get_order(entry.client_order_id + ":sl").fill_price == 95.0  # type: ignore[union-attr]
    assert broker.get_order(entry.client_order_id + ":tp").status == "CANCELED"  # type: ignore[union-attr]
    assert broker.realized_pnl("agent") == pytest.approx(-10.0)


async def test_gap_through_stop_fills_at_open(broker: PaperBroker) -> None:
    """A candle opening below a long's stop fills the stop at the open, not the stop price."""
    await broker.on_tick("BTC", 100.0, T0)
    entry = await broker.submit(request(stopLoss=95.0))
    await broker.on_candle("BTC", bar(90, 91, 88, 89, T0 + MIN))
    assert broker.get_order(entry.client_order_id + ":sl").fill_price == 90.0  # type: ignore[union-attr]


async def test_entry_and_target_in_same_candle_keeps_position(broker: PaperBroker) -> None:
    """A limit entry filled inside a candle cannot take profit in that same candle."""
    await broker.on_tick("BTC", 100.0, T0)
    entry = await broker.submit(
        request(action="PLACE_LIMIT_ORDER", openPrice=98.0, stopLoss=95.0, takeProfit=102.0)
    )
    await broker.on_candle("BTC", bar(100, 103, 97, 101, T0 + MIN))
    assert broker.get_order(entry.client_order_id).status == "FILLED"  # type: ignore[union-attr]
    assert broker.get_order(entry.client_order_id + ":tp").status == "OPEN"  # type: ignore[union-attr]
    assert broker.positions("agent")["BTC"].quantity == 2.0


async def test_short_bracket_mirrors(broker: PaperBroker) -> None:
    """A short's stop is above: a tick through it buys back at a loss."""
    await broker.on_tick("BTC", 100.0, T0)
    entry = await broker.submit(request(side="sell", stopLoss=105.0, takeProfit=90.0))
    assert broker.positions("agent")["BTC"].quantity == -2.0
    await broker.on_tick("BTC", 106.0, T0 + 1)
    assert broker.get_order(entry.client_order_id + ":sl").side == "buy"  # type: ignore[union-attr]
    assert broker.realized_pnl("agent") == pytest.approx(-12.0)


async def test_pnl_and_view(broker: PaperBroker) -> None:
    """Unrealized PnL follows the mark; the view sums today's realized and unrealized."""
    await broker.on_tick("BTC", 100.0, T0)
    await broker.submit(request("a", volume=2.0))
    await broker.submit(request("b", side="sell", volume=1.0))
    await broker.on_tick("BTC", 104.0, T0 + 1)
    assert broker.realized_pnl("agent") == pytest.approx(0.0)
    assert broker.unrealized_pnl("agent") == pytest.approx(4.0)
    await broker.submit(request("c", side="sell", volume=1.0))
    view = broker.view("agent")
    assert broker.realized_pnl("agent") == pytest.approx(4.0)
    assert view.pnl_today == pytest.approx(4.0) and view.positions == {}
    assert len(view.recent_order_ms) == 3


async def test_duplicate_submit_returns_existing(broker: PaperBroker, sink: Sink) -> None:
    """Submitting the same client order id twice places one order and publishes once."""
    await broker.on_tick("BTC", 100.0, T0)
    first = await broker.submit(request())
    count = len(sink.events)
    second = await broker.submit(request())
    assert second == first and len(sink.events) == count and len(broker.orders()) == 1


async def test_cancel(broker: PaperBroker, sink: Sink) -> None:
    """A working order cancels once; cancelling it again or an unknown id is a BrokerError."""
    order = await broker.submit(request(action="PLACE_LIMIT_ORDER", openPrice=90.0))
    canceled = await broker.cancel(order.client_order_id)
    assert canceled.status == "CANCELED" and sink.topics()[-1] == "order.canceled"
    with pytest.raises(BrokerError, match="CANCELED"):
        await broker.cancel(order.client_order_id)
    with pytest.raises(BrokerError, match="unknown"):
        await broker.cancel("nope")


async def test_state_survives_restart(tmp_path: Path, sink: Sink) -> None:
    """Positions, working brackets and marks are reloaded, and brackets still fire."""
    b1 = PaperBroker(tmp_path, sink)
    await b1.on_tick("BTC", 100.0, T0)
    entry = await b1.submit(request(stopLoss=95.0, takeProfit=110.0))
    b1.close()
    b2 = PaperBroker(tmp_path, sink)
    try:
        assert b2.positions("agent")["BTC"].quantity == 2.0 and b2.last_price("BTC") == 100.0
        assert {o.role for o in b2.view("agent").open_orders} == {"stop_loss", "take_profit"}
        await b2.on_tick("BTC", 111.0, T0 + 5)
        assert b2.get_order(entry.client_order_id + ":tp").status == "FILLED"  # type: ignore[union-attr]
        assert b2.realized_pnl("agent") == pytest.approx(20.0)
    finally:
        b2.close()


def _event(topic: str, payload: dict[str, Any], ts: int) -> FeedEvent:
    return FeedEvent(
        event_id=f"x:{ts}",
        ts=ev.iso_ms(ts),
        source="test",
        topic=topic,
        payload=payload,
        symbol="BTC",
    )


async def test_market_events_drive_the_broker(broker: PaperBroker) -> None:
    """Tick and closed-candle FeedEvents update marks and fills; malformed ones are counted."""
    await broker.on_market_event(_event(ev.MARKET_PRICE_TICK, {"price": 100.5}, T0))
    assert broker.last_price("BTC") == 100.5 and broker.now_ms() == T0
    order = await broker.submit(request(action="PLACE_LIMIT_ORDER", openPrice=99.0))
    candle = bar(100, 101, 98.5, 100, T0 + MIN).payload()
    await broker.on_market_event(_event(ev.MARKET_CANDLE_CLOSED, candle, T0 + MIN))
    assert broker.get_order(order.client_order_id).status == "FILLED"  # type: ignore[union-attr]
    for n, price in enumerate([True, "100.5", -1.0, float("nan")]):
        tick = _event(ev.MARKET_PRICE_TICK, {"price": price}, T0 + MIN + 1 + n)
        await broker.on_market_event(tick)
    inverted = bar(1, 0.5, 1, 1, T0 + 2 * MIN).payload()  # high below low
    no_time = {"open": 1, "high": 2, "low": 0.5, "close": 1, "volume": 0}
    for n, payload in enumerate([inverted, no_time]):
        await broker.on_market_event(_event(ev.MARKET_CANDLE_CLOSED, payload, T0 + (2 + n) * MIN))
    await broker.on_market_event(_event(ev.NEWS_HEADLINE, {}, T0))
    assert broker.ignored_events == 6 and broker.last_price("BTC") == 100


async def test_each_market_event_is_applied_once_in_order(broker: PaperBroker) -> None:
    """Agents hand the broker the same events at their own pace: a repeat or an older
    event of a partition is skipped, so marks never go back."""
    await broker.on_market_event(_event(ev.MARKET_PRICE_TICK, {"price": 101.0}, T0 + MIN))
    await broker.on_market_event(_event(ev.MARKET_PRICE_TICK, {"price": 100.0}, T0))  # older
    await broker.on_market_event(_event(ev.MARKET_PRICE_TICK, {"price": 101.0}, T0 + MIN))
    assert broker.last_price("BTC") == 101.0 and broker.now_ms() == T0 + MIN


async def test_cheap_accessors_match_the_view(broker: PaperBroker) -> None:
    """positions() and open_orders() (used for every hook's state) agree with view()."""
    await broker.on_tick("BTC", 100.0, T0)
    await broker.submit(
        request("lim", action="PLACE_LIMIT_ORDER", openPrice=90.0, stopLoss=80.0, takeProfit=120.0)
    )
    await broker.submit(request("mkt"))
    view = broker.view("agent")
    assert broker.positions("agent") == view.positions and "BTC" in broker.positions("agent")
    assert broker.open_orders("agent") == view.open_orders
    assert any(o.order_type == "limit" for o in broker.open_orders("agent"))


async def test_a_mover_marks_the_price_without_filling_or_going_back(broker: PaperBroker) -> None:
    """A scanner trades products no feed follows: the mover's price is a mark (so risk
    can size and band-check), never a trade, and never replaces a newer tick."""
    mover = {
        "productId": "BTC", "price": 120.0, "percentChange24h": 9.5, "volume24h": 10.0,
        "direction": "up", "thresholdPct": 5.0,
    }  # fmt: skip
    order = await broker.submit(request(action="PLACE_LIMIT_ORDER", openPrice=125.0))
    await broker.on_market_event(_event(ev.MARKET_MOVERS_DETECTED, mover, T0))
    assert broker.last_price("BTC") == 120.0
    assert broker.get_order(order.client_order_id).status == "OPEN"  # type: ignore[union-attr]
    await broker.on_market_event(_event(ev.MARKET_PRICE_TICK, {"price": 130.0}, T0 + 2 * MIN))
    late = FeedEvent(
        event_id="movers:late", ts=ev.iso_ms(T0 + MIN), source="movers",
        topic=ev.MARKET_MOVERS_DETECTED, payload=mover | {"price": 90.0}, symbol="BTC",
    )  # fmt: skip
    await broker.on_market_event(late)
    await broker.on_market_event(_event(ev.MARKET_MOVERS_DETECTED, {"price": 1}, T0 + 3 * MIN))
    assert broker.last_price("BTC") == 130.0 and broker.ignored_events == 1


async def test_an_account_with_its_own_cursor_trades_on_its_own_events(
    broker: PaperBroker,
) -> None:
    """Event time: account "a" steps with its agents (cursor "a"); the shared cursor's
    events fill every other account but never "a"'s orders, and each has its own clock
    and marks."""
    await broker.on_market_event(_event(ev.MARKET_PRICE_TICK, {"price": 100.0}, T0))
    broker.open_cursor("a")
    limit = {"action": "PLACE_LIMIT_ORDER", "openPrice": 98.0}
    mine = request("a1", **limit)
    mine = OrderRequest(**{**msgspec.structs.asdict(mine), "account_id": "a"})
    theirs = await broker.submit(request("b1", **limit))
    mine_order = await broker.submit(mine)
    dip = {"price": 97.0}
    await broker.on_market_event(_event(ev.MARKET_PRICE_TICK, dip, T0 + MIN))  # shared
    assert broker.get_order(theirs.client_order_id).status == "FILLED"  # type: ignore[union-attr]
    assert broker.get_order(mine_order.client_order_id).status == "OPEN"  # type: ignore[union-attr]
    assert broker.last_price("BTC", "a") == 100.0 and broker.last_price("BTC") == 97.0
    assert broker.now_ms("a") == T0 and broker.now_ms() == T0 + MIN
    await broker.on_market_event(_event(ev.MARKET_PRICE_TICK, dip, T0 + MIN), cursor="a")
    assert broker.get_order(mine_order.client_order_id).status == "FILLED"  # type: ignore[union-attr]
    assert broker.now_ms("a") == T0 + MIN


async def test_one_fill_keeps_its_price_to_the_last_digit(tmp_path: Path) -> None:
    """A whole fill at 1696.81 of 0.61881 is at 1696.81, not (p * v) / v =
    1696.8100000000002, in the order and in the position it opens."""
    broker = PaperBroker(tmp_path, Sink())
    try:
        await broker.on_tick("BTC", 1696.81, T0)
        await broker.submit(request("odd", volume=0.61881, stopLoss=1500.0))
        order = broker.get_order(client_order_id("agent", "odd"))
        pos = broker.positions("agent")["BTC"]
    finally:
        broker.close()
    assert order is not None and order.fill_price == 1696.81
    assert pos.avg_price == 1696.81


async def test_an_order_placed_after_the_outbox_closed_is_audited_whole(tmp_path: Path) -> None:
    """After a cut drain the outbox is closed while an agent task may still place an
    order: every event of it is audited (placed, filled) and the broker does not
    raise. A raise stopped its emitting after `placed`: the stored fill was never in
    the audit log (a rare failure of the stop/restart account test)."""
    import anyio

    from daemon.agents.pipeline import _post
    from daemon.trading.desk import audited_publish
    from tests.trading.conftest import Audit

    send, receive = anyio.create_memory_object_stream[FeedEvent](4)
    send.close()
    receive.close()
    audit = Audit()
    broker = PaperBroker(tmp_path, audited_publish(lambda e: _post(send, e), audit))
    try:
        await broker.on_tick("BTC", 100.0, T0)
        order = await broker.submit(request())
    finally:
        broker.close()
    assert order.status == "FILLED"
    assert [getattr(r, "status", None) for r in audit] == ["OPEN", "FILLED"]


def good_till(seconds: float, key: str = "k1") -> OrderRequest:
    return request(key, action="PLACE_LIMIT_ORDER", openPrice=98.0, expiresInSeconds=seconds)


async def test_a_limit_good_till_a_time_is_canceled_at_the_first_price_after(
    broker: PaperBroker, sink: Sink
) -> None:
    """Ticks: a tick before the expiry can fill it, one at or after it finds it canceled."""
    await broker.on_tick("BTC", 100.0, T0)
    order = await broker.submit(good_till(60))
    assert order.expires_ms == T0 + 60_000
    await broker.on_tick("BTC", 99.0, T0 + 30_000)
    assert broker.get_order(order.client_order_id).status == "OPEN"  # type: ignore[union-attr]
    await broker.on_tick("BTC", 97.0, T0 + 60_000)  # would have filled it
    gone = broker.get_order(order.client_order_id)
    assert gone is not None and (gone.status, gone.fill_price) == ("CANCELED", None)
    assert gone.reason == "expired: good till 2023-11-14T22:14:20.000Z"
    assert sink.topics()[-1] == "order.canceled" and not broker.positions("agent")


@pytest.mark.parametrize(
    ("seconds", "open_ms", "status"),
    [
        (90, T0 + MIN, "FILLED"),  # expires inside the candle: it may have traded in it
        (30, T0, "CANCELED"),  # expires inside a candle that does not reach it
        (30, T0 + 5 * MIN, "CANCELED"),  # expired in a gap before the candle opened
    ],
)
async def test_candles_fill_a_good_till_limit_only_while_it_lives(
    broker: PaperBroker, seconds: float, open_ms: int, status: str
) -> None:
    await broker.on_tick("BTC", 100.0, T0)
    order = await broker.submit(good_till(seconds))
    if open_ms == T0:
        candle = bar(100, 101, 99, 100, T0 + MIN)  # never down to 98
    else:
        candle = Candle(open=100, high=101, low=97, close=99, volume=0.0,
                        open_time_ms=open_ms, close_time_ms=open_ms + MIN)  # fmt: skip
    await broker.on_candle("BTC", candle)
    got = broker.get_order(order.client_order_id)
    assert got is not None and got.status == status
    assert (got.fill_price == 98.0) == (status == "FILLED")


async def test_a_good_till_limit_expires_after_a_restart(tmp_path: Path, sink: Sink) -> None:
    b1 = PaperBroker(tmp_path, sink)
    await b1.on_tick("BTC", 100.0, T0)
    order = await b1.submit(good_till(60))
    b1.close()
    b2 = PaperBroker(tmp_path, sink)
    try:
        await b2.on_tick("BTC", 99.0, T0 + 61_000)
        assert b2.get_order(order.client_order_id).status == "CANCELED"  # type: ignore[union-attr]
    finally:
        b2.close()


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"expiresInSeconds": 60}, "only for PLACE_LIMIT_ORDER, not PLACE_MARKET_ORDER"),
        (
            {
                "action": "CANCEL_ORDER",
                "orderId": "x",
                "side": None,
                "volume": None,
                "expiresInSeconds": 60,
            },
            "only for PLACE_LIMIT_ORDER, not CANCEL_ORDER",
        ),
        ({"action": "PLACE_LIMIT_ORDER", "openPrice": 9.0, "expiresInSeconds": 0}, "> 0"),
        ({"action": "PLACE_LIMIT_ORDER", "openPrice": 9.0, "expiresInSeconds": 4e7}, "<= 3"),
        ({"action": "PLACE_LIMIT_ORDER", "openPrice": 9.0, "expiresInSeconds": math.nan}, "> 0"),
        ({"action": "PLACE_LIMIT_ORDER", "openPrice": 9.0, "expiresInSeconds": math.inf}, "<= 3"),
    ],
)
def test_expires_in_seconds_is_for_limit_orders_and_bounded(
    fields: dict[str, Any], error: str
) -> None:
    with pytest.raises(Exception, match=error):
        request(**fields)


async def test_an_order_recorded_before_a_crash_and_expired_since_is_not_opened(
    tmp_path: Path, sink: Sink
) -> None:
    """Recorded (PENDING_SUBMIT), then the process died before opening it; by the
    restart's recovery its time is up: it is canceled, never filled at the mark."""
    now = [T0]
    b1 = PaperBroker(tmp_path, sink, clock=lambda: now[0])
    await b1.on_tick("BTC", 97.0, T0)  # marketable for a buy limit at 98
    pending = b1._record(good_till(60))
    b1.close()
    now[0] = T0 + 61_000
    b2 = PaperBroker(tmp_path, sink, clock=lambda: now[0])
    try:
        [recovered] = await b2.recover()
        assert recovered.client_order_id == pending.client_order_id
        assert (recovered.status, recovered.fill_price) == ("CANCELED", None)
        assert recovered.reason.startswith("expired: good till") and not b2.positions("agent")
    finally:
        b2.close()


async def test_marks_a_full_disk_cannot_take_are_logged_and_the_stop_goes_on(
    tmp_path: Path, sink: Sink
) -> None:
    """The marks are a price cache: failing to save them at the stop (a full disk; here
    SQLite's query_only) is one error line, not an exception that ends the run with
    exit 1; the file is released either way."""
    b = PaperBroker(tmp_path, sink)
    await b.on_tick("BTC", 100.0, T0)
    b._store._db.execute("PRAGMA query_only=1")
    with structlog.testing.capture_logs() as logs:
        b.close()
    assert [(e["log_level"], e["event"]) for e in logs] == [
        ("error", "paper marks not saved at the stop")
    ]
    again = PaperBroker(tmp_path, sink)
    try:
        assert again.last_price("BTC") is None  # nothing was saved, nothing is locked
    finally:
        again.close()
