"""TradeDesk: intent -> risk -> broker with audit, and duplicates never re-checked."""

from __future__ import annotations

from daemon.audit.records import OrderRecord, RiskRecord
from daemon.events import FeedEvent
from daemon.trading.desk import TradeDesk
from daemon.trading.intents import RiskLimits, TradingState, parse_intent
from daemon.trading.paper import PaperBroker
from daemon.trading.records import order_record_from_event
from tests.trading.conftest import Audit

INTENT = parse_intent(
    {
        "action": "PLACE_MARKET_ORDER",
        "symbol": "BTC",
        "side": "buy",
        "volume": 1.0,
        "stopLoss": 90.0,
    }
)


async def test_approved_intent_is_traded_and_audited(broker: PaperBroker, audit: Audit) -> None:
    """An approved intent becomes a filled order; risk and each order state share the trace."""
    desk = TradeDesk(broker, audit)
    await broker.on_tick("BTC", 100.0, 1)
    out = await desk.handle(INTENT, agent_id="a", dedupe_key="k", trace_id="t", hook_id="h")
    assert out.order is not None and out.order.status == "FILLED" and not out.duplicate
    risk, *orders = audit
    assert isinstance(risk, RiskRecord) and risk.approved
    assert risk.client_order_id == out.client_order_id
    states = [(o.role, o.status, o.trace_id) for o in orders if isinstance(o, OrderRecord)]
    assert states == [("entry", "OPEN", "t"), ("entry", "FILLED", "t"), ("stop_loss", "OPEN", "t")]


async def test_rejected_intent_places_nothing(broker: PaperBroker, audit: Audit) -> None:
    """A rejection is audited with its codes and no order reaches the broker."""
    desk = TradeDesk(broker, audit)
    desk.set_limits("a", RiskLimits(allowed_symbols=("ETH",)))
    await broker.on_tick("BTC", 100.0, 1)
    out = await desk.handle(INTENT, agent_id="a", dedupe_key="k", trace_id="t")
    assert out.order is None and out.verdict is not None
    assert out.verdict.codes == ["SYMBOL_NOT_ALLOWED"]
    assert [type(r) for r in audit] == [RiskRecord] and broker.orders() == []


async def test_duplicate_is_not_rechecked(broker: PaperBroker, audit: Audit) -> None:
    """The same dedupeKey returns the first order even after the state turned HALTED."""
    desk = TradeDesk(broker, audit)
    await broker.on_tick("BTC", 100.0, 1)
    first = await desk.handle(INTENT, agent_id="a", dedupe_key="k", trace_id="t")
    desk.set_state(TradingState.HALTED)
    count = len(audit)
    again = await desk.handle(INTENT, agent_id="a", dedupe_key="k", trace_id="t")
    assert again.duplicate and again.order == first.order and len(audit) == count
    halted = await desk.handle(INTENT, agent_id="a", dedupe_key="k2", trace_id="t")
    assert halted.verdict is not None and halted.verdict.codes == ["HALTED"]
    assert [o.role for o in broker.orders()] == ["entry", "stop_loss"]


async def test_broker_events_become_order_records(
    broker: PaperBroker, events: list[FeedEvent]
) -> None:
    """account.order.* events convert to order audit records; other events do not."""
    desk = TradeDesk(broker)
    await broker.on_tick("BTC", 100.0, 1)
    await desk.handle(INTENT, agent_id="a", dedupe_key="k", trace_id="t")
    records = [order_record_from_event(e) for e in events]
    statuses = [(r.role, r.status) for r in records if r is not None]
    assert statuses == [("entry", "OPEN"), ("entry", "FILLED"), ("stop_loss", "OPEN")]
    # the broker's time of each change (the market's, on a replay), not the row's
    assert [r.event_ts for r in records if r is not None] == [
        e.ts for e, r in zip(events, records, strict=True) if r is not None
    ]
    assert records[2] is None  # account.position.opened
