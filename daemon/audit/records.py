"""The audit record types, tagged by ``type`` and camelCase on the wire.

Every field is always written (nulls included), so every line of a type has
the same keys and ``jq`` filters never trip on a missing one. ``ts`` is when
marketwake did the thing (wall clock, RFC 3339 UTC with milliseconds); the
event's own time is in the event. :class:`HookRecord` carries the fields of
design.md's audit contract plus ``type`` and ``daemonRun`` (the id of the
daemon run that wrote the row, so a restarted replay's rows are told apart).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from daemon.events import (
    ACCOUNT_ORDER_CANCELED,
    ACCOUNT_ORDER_FILLED,
    ACCOUNT_ORDER_MODIFIED,
    ACCOUNT_ORDER_PLACED,
    FeedEvent,
    iso_ms,
    now_ms,
)
from daemon.trading.intents import TradeIntent
from daemon.trading.portfolio import Order
from daemon.trading.risk import Verdict

# "shutdown": a wake still waiting for its run when the daemon stopped.
SuppressedBy = Literal["dedupe", "cooldown", "budget", "paused", "shutdown", "none"]


def now_ts() -> str:
    """The current time in the audit ``ts`` format."""
    return iso_ms(now_ms())


class _Record(msgspec.Struct, frozen=True, kw_only=True, rename="camel", tag_field="type"):
    ts: str
    agent_id: str
    trace_id: str | None = None
    # Which daemon run wrote it (stamped by the writer): tells a restart's rows apart.
    daemon_run: str | None = None


class HookRecord(_Record, frozen=True, kw_only=True, tag="hook"):
    """One hook evaluation, IGNOREs and suppressed decisions included.

    ``decision`` is None when the hook failed (``error`` says why);
    ``suppressedBy`` says what stopped a WAKE / TRADE_INTENT from acting.
    """

    hook_id: str
    revision: str
    kind: str
    event_id: str
    topic: str
    symbol: str | None = None
    decision: str | None = None
    reason: str = ""
    dedupe_key: str | None = None
    suppressed_by: SuppressedBy = "none"
    runtime_ms: float = 0.0
    error: str | None = None


class WakeRecord(_Record, frozen=True, kw_only=True, tag="wake"):
    """What the wake scheduler did with WAKE decisions.

    ``outcome``: ``woke`` (a run started), ``queued`` (collect mode: merged
    into a pending follow-up run), ``suppressed`` (``suppressedBy`` says why).
    """

    event_id: str | None = None
    outcome: Literal["woke", "queued", "suppressed"]
    suppressed_by: SuppressedBy = "none"
    hook_ids: list[str] = msgspec.field(default_factory=list)
    reasons: list[str] = msgspec.field(default_factory=list)
    run_id: str | None = None


class RunRecord(_Record, frozen=True, kw_only=True, tag="run"):
    """An agent run (LLM or runner) starting or ending."""

    run_id: str
    runner: str
    status: Literal["started", "finished", "failed", "timeout"]
    event_ids: list[str] = msgspec.field(default_factory=list)
    # Every merged wake's trace (``traceId`` holds the first), so ``why`` finds the run
    # from any of them.
    trace_ids: list[str] = msgspec.field(default_factory=list)
    duration_ms: float | None = None
    error: str | None = None
    summary: str = ""


class RiskRecord(_Record, frozen=True, kw_only=True, tag="risk"):
    """The risk engine's verdict on one intent; ``reasons`` hold ``{code, message}``."""

    hook_id: str | None = None
    event_id: str | None = None
    symbol: str | None = None
    approved: bool
    reasons: list[dict[str, str]] = msgspec.field(default_factory=list)
    intent: dict[str, Any] = msgspec.field(default_factory=dict)
    client_order_id: str | None = None


class OrderRecord(_Record, frozen=True, kw_only=True, tag="order"):
    """An order state change at the broker (placed, filled, canceled, rejected)."""

    broker: str
    client_order_id: str
    symbol: str
    side: str
    order_type: str
    role: str = "entry"
    volume: float
    status: str
    price: float | None = None
    reason: str = ""


AuditRecord = HookRecord | WakeRecord | RunRecord | RiskRecord | OrderRecord

_encoder = msgspec.json.Encoder()


def encode_line(record: AuditRecord) -> bytes:
    """One record as a JSON line (with the trailing newline)."""
    return _encoder.encode(record) + b"\n"


def risk_record(
    verdict: Verdict,
    intent: TradeIntent,
    *,
    agent_id: str,
    trace_id: str | None,
    hook_id: str | None = None,
    event_id: str | None = None,
    client_order_id: str | None = None,
) -> RiskRecord:
    """The audit record of one risk verdict on ``intent``."""
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
    )


def order_record(order: Order, broker: str) -> OrderRecord:
    """The audit record of ``order``'s current state at ``broker``."""
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
        status=order.status,
        price=order.fill_price or order.limit_price or order.stop_price,
        reason=order.reason,
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
    return order_record(order, event.source)
