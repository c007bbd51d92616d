"""The trade path's audit rows: a risk verdict, and each order state change.

They are built here, beside the types they read (verdicts, intents, orders),
so the audit package never imports the trading package.
"""

from __future__ import annotations

import msgspec

from daemon.audit.records import OrderRecord, RiskRecord, now_ts
from daemon.events import (
    ACCOUNT_ORDER_CANCELED,
    ACCOUNT_ORDER_FILLED,
    ACCOUNT_ORDER_MODIFIED,
    ACCOUNT_ORDER_PLACED,
    FeedEvent,
)
from daemon.trading.intents import TradeIntent
from daemon.trading.portfolio import Order
from daemon.trading.risk import Verdict


def risk_record(
    verdict: Verdict,
    intent: TradeIntent,
    *,
    agent_id: str,
    trace_id: str | None,
    hook_id: str | None = None,
    event_id: str | None = None,
    client_order_id: str | None = None,
    event_ts: str | None = None,
) -> RiskRecord:
    """The audit record of one risk verdict on ``intent`` (``event_ts``: the broker's
    time of it)."""
    return RiskRecord(
        ts=now_ts(),
        agent_id=agent_id,
        trace_id=trace_id,
        hook_id=hook_id,
        event_id=event_id,
        symbol=intent.symbol,
        approved=verdict.approved,
        reasons=[{"code": r.code, "message": r.message} for r in verdict.reasons],
        intent=msgspec.to_builtins(intent),
        client_order_id=client_order_id,
        event_ts=event_ts,
    )


def order_record(
    order: Order, broker: str, *, part: bool = False, event_ts: str | None = None
) -> OrderRecord:
    """The audit record of ``order``'s current state at ``broker``; ``part``: a fill
    of part of it (the rest still working); ``event_ts``: the broker's time of it."""
    return OrderRecord(
        ts=now_ts(),
        agent_id=order.agent_id,
        trace_id=order.trace_id,
        broker=broker,
        client_order_id=order.client_order_id,
        symbol=order.symbol,
        side=order.side,
        order_type=order.order_type,
        role=order.role,
        volume=order.volume,
        status="PARTIALLY_FILLED" if part else order.status,
        price=order.fill_price or order.limit_price or order.stop_price,
        reason=order.reason,
        filled=order.filled_volume if part else None,
        event_ts=event_ts,
    )


_ORDER_TOPICS = frozenset(
    {ACCOUNT_ORDER_PLACED, ACCOUNT_ORDER_FILLED, ACCOUNT_ORDER_CANCELED, ACCOUNT_ORDER_MODIFIED}
)


def order_record_from_event(event: FeedEvent) -> OrderRecord | None:
    """The audit record of an ``account.order.*`` event from a broker (None otherwise).

    Fills triggered later by ticks and candles reach the audit log this way.
    """
    if event.topic not in _ORDER_TOPICS:
        return None
    try:
        order = msgspec.convert(event.payload, Order)
    except msgspec.ValidationError:
        return None
    part = event.topic == ACCOUNT_ORDER_FILLED and order.status != "FILLED"
    return order_record(order, event.source, part=part, event_ts=event.ts)
