"""MODIFY_ORDER and CANCEL_ORDER: through the risk engine, on the agent's own orders only."""

from __future__ import annotations

from daemon.audit.records import OrderRecord, RiskRecord
from daemon.events import ACCOUNT_ORDER_MODIFIED, FeedEvent
from daemon.trading.desk import IntentOf, TradeDesk
from daemon.trading.intents import RiskLimits, TradeIntent, TradingState, parse_intent
from daemon.trading.paper import PaperBroker
from tests.trading.conftest import Audit

LIMIT = {
    "action": "PLACE_LIMIT_ORDER",
    "symbol": "BTC",
    "side": "buy",
    "volume": 1.0,
    "openPrice": 98.0,
    "stopLoss": 90.0,
    "takeProfit": 110.0,
}


async def _resting(desk: TradeDesk, broker: PaperBroker, agent: str = "a") -> str:
    await broker.on_tick("BTC", 100.0, 1_000)
    out = await desk.handle(parse_intent(LIMIT), agent_id=agent, dedupe_key="k", trace_id="t")
    assert out.order is not None and out.order.status == "OPEN"
    return out.client_order_id


def _change(order_id: str, **fields: object) -> TradeIntent:
    return parse_intent({"action": "MODIFY_ORDER", "symbol": "BTC", "orderId": order_id, **fields})


async def test_modify_moves_a_resting_limit_and_audits_it(
    broker: PaperBroker, audit: Audit, events: list[FeedEvent]
) -> None:
    """A changed entry is risk-checked, saved, published as account.order.modified,
    and fills at its new price when the market gets there."""
    desk = TradeDesk(broker, audit)
    coid = await _resting(desk, broker)
    out = await desk.handle(
        _change(coid, openPrice=99.0, stopLoss=95.0),
        agent_id="a",
        dedupe_key="m1",
        trace_id="t2",
    )
    assert out.verdict is not None and out.verdict.approved, out.verdict
    order = broker.get_order(coid)
    assert order is not None and (order.limit_price, order.stop_loss, order.volume) == (
        99.0,
        95.0,
        1.0,
    )
    assert events[-1].topic == ACCOUNT_ORDER_MODIFIED
    assert isinstance(audit[-1], OrderRecord) and audit[-1].price == 99.0
    await broker.on_tick("BTC", 98.5, 2_000)  # through 99 but not the old 98
    filled = broker.get_order(coid)
    assert filled is not None and filled.status == "FILLED" and filled.fill_price == 99.0
    stop = broker.get_order(f"{coid}:sl")
    assert stop is not None and stop.stop_price == 95.0


async def test_a_change_is_checked_like_a_new_order(broker: PaperBroker, audit: Audit) -> None:
    """A bigger size over the notional cap, a limit outside the band or a stop on the
    wrong side is rejected with the usual codes, and the order is unchanged."""
    desk = TradeDesk(broker, audit)
    desk.set_limits("a", RiskLimits(max_order_notional=150.0))
    coid = await _resting(desk, broker)
    for fields, code in [
        ({"volume": 2.0}, "ORDER_NOTIONAL"),
        ({"openPrice": 80.0}, "PRICE_BAND"),
        ({"stopLoss": 99.5}, "BRACKET_WRONG_SIDE"),
    ]:
        out = await desk.handle(_change(coid, **fields), agent_id="a", dedupe_key="m", trace_id="t")
        assert out.verdict is not None and code in out.verdict.codes, (fields, out.verdict)
        assert isinstance(audit[-1], RiskRecord) and not audit[-1].approved
    order = broker.get_order(coid)
    assert order is not None and (order.limit_price, order.volume, order.stop_loss) == (
        98.0,
        1.0,
        90.0,
    )


async def test_the_stop_of_a_position_can_be_trailed(broker: PaperBroker, audit: Audit) -> None:
    """Once filled, the bracket's stop is its own order: it can move up under the
    price, not above it (that would stop out at once), and only its trigger changes."""
    desk = TradeDesk(broker, audit)
    coid = await _resting(desk, broker)
    await broker.on_tick("BTC", 97.0, 2_000)
    sl = f"{coid}:sl"
    ok = await desk.handle(_change(sl, stopLoss=96.0), agent_id="a", dedupe_key="s1", trace_id="t")
    assert ok.order is not None and ok.order.stop_price == 96.0
    above = await desk.handle(
        _change(sl, stopLoss=97.5), agent_id="a", dedupe_key="s2", trace_id="t"
    )
    assert above.verdict is not None and above.verdict.codes == ["BRACKET_WRONG_SIDE"]
    size = await desk.handle(_change(sl, volume=3.0), agent_id="a", dedupe_key="s3", trace_id="t")
    assert size.verdict is not None and size.verdict.codes == ["ORDER_CHANGE"]
    await broker.on_tick("BTC", 95.9, 3_000)
    assert broker.positions(desk.account_of("a")) == {}


async def test_cancel_only_touches_the_agents_own_working_orders(
    broker: PaperBroker, audit: Audit
) -> None:
    """Another agent's order is 'unknown' to this one; a cancel works even when
    HALTED (it only removes risk) and a second cancel of the same order is a no-op."""
    desk = TradeDesk(broker, audit)
    coid = await _resting(desk, broker, agent="owner")
    cancel = parse_intent({"action": "CANCEL_ORDER", "symbol": "BTC", "orderId": coid})
    other = await desk.handle(cancel, agent_id="intruder", dedupe_key="c", trace_id="t")
    assert other.verdict is not None and other.verdict.codes == ["ORDER_NOT_FOUND"]
    assert "unknown in account intruder" in other.verdict.reasons[0].message
    desk.set_state(TradingState.HALTED)
    done = await desk.handle(cancel, agent_id="owner", dedupe_key="c", trace_id="t")
    assert done.order is not None and done.order.status == "CANCELED"
    again = await desk.handle(cancel, agent_id="owner", dedupe_key="c", trace_id="t")
    assert again.verdict is not None and again.verdict.codes == ["ORDER_NOT_FOUND"]
    assert "is CANCELED" in again.verdict.reasons[0].message
    wrong = parse_intent({"action": "CANCEL_ORDER", "symbol": "ETH", "orderId": coid})
    mis = await desk.handle(wrong, agent_id="owner", dedupe_key="c", trace_id="t")
    assert mis.verdict is not None and mis.verdict.codes == ["ORDER_NOT_FOUND"]


async def test_a_cut_short_intent_is_refused_unless_the_broker_shows_it_done(
    broker: PaperBroker, audit: Audit
) -> None:
    """At a wall-clock restart: an order the broker has, or a cancel of an order no
    longer working, is done (nothing written); anything else gets a CUT_SHORT row."""
    desk = TradeDesk(broker, audit)
    coid = await _resting(desk, broker)

    def of(key: str) -> IntentOf:
        return IntentOf(agent_id="a", dedupe_key=key, trace_id="t", hook_id="autotrade_x",
                        event_id="e1")  # fmt: skip

    written = len(audit)
    assert not desk.refuse_cut(parse_intent(LIMIT), of("k"))  # placed
    assert len(audit) == written
    assert desk.refuse_cut(parse_intent(LIMIT), of("other"))
    cancel = parse_intent({"action": "CANCEL_ORDER", "symbol": "BTC", "orderId": coid})
    assert desk.refuse_cut(cancel, of("-"))  # still working
    rows = audit[written:]
    assert [(r.approved, r.reasons[0]["code"]) for r in rows if isinstance(r, RiskRecord)] == [
        (False, "CUT_SHORT"),
        (False, "CUT_SHORT"),
    ]
    assert broker.get_order(coid) is not None
    await desk.handle(cancel, agent_id="a", dedupe_key="c", trace_id="t")
    assert not desk.refuse_cut(cancel, of("-"))  # canceled since
    gone = parse_intent({"action": "CANCEL_ORDER", "symbol": "BTC", "orderId": "mw-unknown"})
    assert not desk.refuse_cut(gone, of("-"))
