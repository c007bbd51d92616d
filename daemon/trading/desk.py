"""TradeDesk: the one call the dispatcher makes for a TRADE_INTENT.

It runs the agent's risk engine against the broker's view, audits the verdict
and submits an approved order under the client order id derived from the
dedupeKey. Order records come from the broker's own ``account.order.*``
events (placed, filled later by a tick, canceled by one-cancels-other...):
give the broker a publish wrapped by :func:`audited_publish` so each state
change is audited exactly once, whoever caused it. An intent whose client order id the broker
already knows (a retry, a replay, a restart) is not risk-checked again: the
broker returns the order it has, finishing it if a crash interrupted it.
"""

from __future__ import annotations

from typing import Protocol

import msgspec

from daemon.audit.records import AuditRecord, order_record_from_event, risk_record
from daemon.events import FeedEvent
from daemon.trading.broker import Broker, OrderRequest, client_order_id
from daemon.trading.intents import RiskLimits, TradeIntent, TradingState
from daemon.trading.portfolio import Order
from daemon.trading.risk import RiskEngine, Verdict
from feeds.base import Publish


class AuditSink(Protocol):
    """Anything with ``write(record)``: the AuditWriter, or a list in tests."""

    def write(self, record: AuditRecord) -> None:
        """Record one audit line."""
        ...


def audited_publish(publish: Publish, audit: AuditSink) -> Publish:
    """``publish`` that first audits every ``account.order.*`` event it forwards."""

    async def wrapped(event: FeedEvent) -> None:
        record = order_record_from_event(event)
        if record is not None:
            audit.write(record)
        await publish(event)

    return wrapped


class TradeOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """What happened to one intent. ``verdict`` is None for a known duplicate."""

    client_order_id: str
    verdict: Verdict | None
    order: Order | None
    duplicate: bool = False


class TradeDesk:
    """Risk engines per agent in front of one broker, with every step audited.

    Each agent trades in its account (its own id unless ``agent.toml`` shares
    one); its risk engine checks that account's positions, orders and PnL."""

    def __init__(self, broker: Broker, audit: AuditSink | None = None) -> None:
        self.broker = broker
        self.audit = audit
        self._engines: dict[str, RiskEngine] = {}
        self._accounts: dict[str, str] = {}
        self._state = TradingState.ACTIVE

    def set_limits(self, agent_id: str, limits: RiskLimits, account: str = "") -> None:
        """Install (or hot-reload) an agent's limits and account (empty: its own)."""
        self._engines[agent_id] = RiskEngine(limits, self._state)
        self._accounts[agent_id] = account or agent_id

    def account_of(self, agent_id: str) -> str:
        """The account ``agent_id`` trades in."""
        return self._accounts.get(agent_id, agent_id)

    def set_state(self, state: TradingState) -> None:
        """Switch every agent to ACTIVE / REDUCING / HALTED."""
        self._state = state
        for engine in self._engines.values():
            engine.state = state

    def engine(self, agent_id: str) -> RiskEngine:
        """The agent's engine; default limits when none were installed."""
        if agent_id not in self._engines:
            self.set_limits(agent_id, RiskLimits())
        return self._engines[agent_id]

    async def handle(
        self,
        intent: TradeIntent,
        *,
        agent_id: str,
        dedupe_key: str,
        trace_id: str | None,
        hook_id: str | None = None,
        event_id: str | None = None,
    ) -> TradeOutcome:
        """Check, audit the verdict, submit. ``dedupe_key`` must be stable across retries."""
        coid = client_order_id(agent_id, dedupe_key)
        account = self.account_of(agent_id)
        if self.broker.get_order(coid) is not None:
            request = OrderRequest(
                client_order_id=coid,
                agent_id=agent_id,
                account_id=account,
                intent=intent,
                trace_id=trace_id,
            )
            order = await self.broker.submit(request)
            return TradeOutcome(client_order_id=coid, verdict=None, order=order, duplicate=True)
        broker = self.broker
        verdict = self.engine(agent_id).check(
            intent, broker.view(account), broker.last_price(intent.symbol), broker.now_ms()
        )
        self._write(
            risk_record(
                verdict,
                intent,
                agent_id=agent_id,
                trace_id=trace_id,
                hook_id=hook_id,
                event_id=event_id,
                client_order_id=coid,
            )
        )
        if not verdict.approved or verdict.order is None:
            return TradeOutcome(client_order_id=coid, verdict=verdict, order=None)
        request = OrderRequest(
            client_order_id=coid,
            agent_id=agent_id,
            account_id=account,
            intent=verdict.order,
            trace_id=trace_id,
        )
        order = await broker.submit(request)
        return TradeOutcome(client_order_id=coid, verdict=verdict, order=order)

    def _write(self, record: AuditRecord) -> None:
        if self.audit is not None:
            self.audit.write(record)
