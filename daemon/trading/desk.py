"""TradeDesk: the one call the dispatcher makes for a TRADE_INTENT.

It runs the agent's risk engine against the broker's view, audits the verdict
and submits an approved order under the client order id derived from the
dedupeKey. Order records come from the broker's own ``account.order.*``
events (placed, filled later by a tick, canceled by one-cancels-other...):
give the broker a publish wrapped by :func:`audited_publish` so each state
change is audited exactly once, whoever caused it. An intent whose client order id the broker
already knows (a retry, a replay, a restart) is not risk-checked again: the
broker returns the order it has, finishing it if a crash interrupted it.
MODIFY_ORDER and CANCEL_ORDER act on a working order of the agent's own
account, named by its ``orderId`` (the order's ``clientOrderId``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Final, Protocol

import msgspec

from daemon.audit.reader import AuditedOrder
from daemon.audit.records import AuditRecord
from daemon.events import FeedEvent, Publish, iso_ms
from daemon.trading.broker import Broker, OrderRequest, child_order_id, client_order_id
from daemon.trading.intents import ORDER_ACTIONS, RiskLimits, TradeIntent, TradingState
from daemon.trading.portfolio import WORKING, Order
from daemon.trading.records import order_record, order_record_from_event, risk_record
from daemon.trading.risk import CUT_SHORT, ORDER_NOT_FOUND, Reason, RiskEngine, Verdict

#: Order rows of an order still working (the paper broker's rows use these).
WORKING_ROWS: Final = frozenset({*WORKING, "PARTIALLY_FILLED"})


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


class IntentOf(msgspec.Struct, frozen=True, kw_only=True):
    """Whose an intent is and where it came from: what its audit rows name, and the
    key of its client order id."""

    agent_id: str
    dedupe_key: str
    trace_id: str | None
    hook_id: str | None
    event_id: str | None
    client_order_id: str = ""  # when known (else derived from the key)

    @property
    def coid(self) -> str:
        """The intent's client order id."""
        return self.client_order_id or client_order_id(self.agent_id, self.dedupe_key)


class TradeDesk:
    """Risk engines per agent in front of one broker, with every step audited.

    Each agent trades in its account (its own id unless ``agent.toml`` shares
    one); its risk engine checks that account's positions, orders and PnL."""

    def __init__(self, broker: Broker, audit: AuditSink | None = None) -> None:
        self.broker = broker
        self.audit = audit
        # Hands the queued audit rows to the OS (AuditWriter.write_ahead); None when
        # nothing is restarted (a backtest). Used by ``handle(ahead=True)``.
        self.write_ahead: Callable[[], None] | None = None
        # By client order id, what the audit holds of each order (see known_rows).
        self.audited: dict[str, AuditedOrder] = {}
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
        ahead: bool = False,
    ) -> TradeOutcome:
        """Check, audit the verdict, submit. ``dedupe_key`` must be stable across retries.

        ``ahead``: for an intent no hook row announced (a tool's, a correction's),
        an approval's row reaches the OS before its order is recorded and the
        order's rows as soon as it is, so a restart finds an order a kill cut
        off from its rows (``recent_evaluations``' unplaced approvals)."""
        if intent.action in ORDER_ACTIONS:
            return await self._amend(
                intent, agent_id=agent_id, trace_id=trace_id, hook_id=hook_id, event_id=event_id
            )
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
            intent,
            broker.view(account),
            broker.last_price(intent.symbol, account),
            broker.now_ms(account),
        )
        self._write_verdict(verdict, intent, agent_id, trace_id, hook_id, event_id, coid, account)
        if not verdict.approved or verdict.order is None:
            return TradeOutcome(client_order_id=coid, verdict=verdict, order=None)
        write_ahead = self.write_ahead if ahead else None
        if write_ahead is not None:
            write_ahead()
        request = OrderRequest(
            client_order_id=coid,
            agent_id=agent_id,
            account_id=account,
            intent=verdict.order,
            trace_id=trace_id,
            role="close" if intent.action == "CLOSE_POSITION" else "entry",
        )
        order = await broker.submit(request)
        if write_ahead is not None:
            write_ahead()
        return TradeOutcome(client_order_id=coid, verdict=verdict, order=order)

    async def _amend(
        self,
        intent: TradeIntent,
        *,
        agent_id: str,
        trace_id: str | None,
        hook_id: str | None,
        event_id: str | None,
    ) -> TradeOutcome:
        """MODIFY_ORDER / CANCEL_ORDER on one of the account's working orders.

        A cancel only takes risk away, so no rule but "it is yours and working"
        applies; a change is checked by :meth:`RiskEngine.check_change`. Both are
        idempotent: re-delivered, a change sets the same values again and a
        cancel finds the order gone (rejected, nothing happens twice).
        """
        assert intent.order_id is not None  # TradeIntent guarantees it for these actions
        coid, broker = intent.order_id, self.broker
        account = self.account_of(agent_id)
        order = broker.get_order(coid)
        if order is None or order.account_id != account or order.status != "OPEN":
            state = "unknown" if order is None or order.account_id != account else order.status
            why = f"order {coid} is {state} in account {account}; only OPEN orders can change"
            verdict = Verdict(approved=False, reasons=(Reason(ORDER_NOT_FOUND, why),))
        elif order.symbol != intent.symbol:
            why = f"order {coid} trades {order.symbol}, not {intent.symbol}"
            verdict = Verdict(approved=False, reasons=(Reason(ORDER_NOT_FOUND, why),))
        elif intent.action == "CANCEL_ORDER":
            verdict = Verdict(approved=True, order=intent, reducing=True)
        else:
            verdict = self.engine(agent_id).check_change(
                intent,
                order,
                broker.view(account),
                broker.last_price(order.symbol, account),
                broker.now_ms(account),
            )
        self._write_verdict(verdict, intent, agent_id, trace_id, hook_id, event_id, coid, account)
        if not verdict.approved:
            return TradeOutcome(client_order_id=coid, verdict=verdict, order=None)
        if intent.action == "CANCEL_ORDER":
            done = await broker.cancel(coid)
        else:
            done = await broker.modify(coid, intent)
        return TradeOutcome(client_order_id=coid, verdict=verdict, order=done)

    def refuse_cut(
        self,
        intent: TradeIntent,
        of: IntentOf,
        why: str = (
            "the daemon stopped between this decision and its order; on wall-clock "
            "time it is not acted on after the restart (the market has moved on)"
        ),
    ) -> bool:
        """Audit ``intent``, which a stop cut short and which is not acted on late,
        as refused (``CUT_SHORT``, saying ``why``); False when the broker shows it
        done (the kill came after its order was recorded, or its order is no
        longer working)."""
        if intent.action in ORDER_ACTIONS:
            assert intent.order_id is not None  # TradeIntent guarantees it
            coid = intent.order_id
            order = self.broker.get_order(coid)
            if order is None or order.status != "OPEN":
                return False
        else:
            coid = of.coid
            if self.broker.get_order(coid) is not None:
                return False
        verdict = Verdict(approved=False, reasons=(Reason(CUT_SHORT, why),))
        account = self.account_of(of.agent_id)
        self._write_verdict(
            verdict, intent, of.agent_id, of.trace_id, of.hook_id, of.event_id, coid, account
        )
        return True

    def known_rows(self, audited: Mapping[str, AuditedOrder], written: Iterable[Order]) -> None:
        """What the audit holds of each order at a start: the newest row of each
        (``audited``, read before the start wrote any), and the state of the
        orders whose rows the start wrote (the broker's recovery), with their
        stop-loss and take-profit. Rows restored after a kill are written against
        it, so no restart writes a row the audit already has."""
        self.audited = dict(audited)
        for order in written:
            for o in (order, *self._children(order.client_order_id)):
                self.audited[o.client_order_id] = AuditedOrder(o.status, o.role)

    def restore_rows(self, intent: TradeIntent, of: IntentOf, *, approval: bool = True) -> int:
        """Audit what the broker holds of ``intent``'s order, whose rows a kill took:
        it came after the order was recorded and before the verdict's row and the
        order's were written (they go in that order). The verdict was an approval
        (the order exists), unless ``approval`` is False (its row was written);
        each order (the entry, its stop-loss and take-profit) gets one row of its
        state now, unless the audit has it (:meth:`known_rows`: the broker's
        recovery at this start wrote them, or an earlier restart did).
        Returns the rows written (-1: no such order)."""
        coid = of.coid
        order = self.broker.get_order(coid)
        if order is None:
            return -1
        written = 0
        if approval:
            self._write(
                risk_record(
                    Verdict(approved=True, order=intent), intent, agent_id=of.agent_id,
                    trace_id=of.trace_id, hook_id=of.hook_id, event_id=of.event_id,
                    client_order_id=coid, event_ts=iso_ms(order.created_ms),
                )
            )  # fmt: skip
            written = 1
        return written + sum(self._write_order(o) for o in (order, *self._children(coid)))

    def catch_up_rows(self) -> int:
        """Audit what the broker did to orders after the audit's last rows of them
        (:meth:`known_rows`): at a restart, the changes a kill took (a bracket exit
        filled, its sibling canceled: those rows are batched). An order the audit
        last saw working that the broker has since finished gets a row of its
        final state; a stop-loss or take-profit of an audited entry with no row of
        its own gets one of its state now. Returns the rows written."""
        written = 0
        for coid, seen in list(self.audited.items()):
            order = self.broker.get_order(coid)
            if order is None:
                continue
            if seen.status in WORKING_ROWS and order.status not in WORKING:
                written += self._write_order(order)
            if seen.role == "entry":
                written += sum(self._write_order(child) for child in self._children(coid))
        return written

    def _children(self, coid: str) -> list[Order]:
        """The stop-loss and take-profit orders entry ``coid`` spawned."""
        found = (
            self.broker.get_order(child_order_id(coid, r)) for r in ("stop_loss", "take_profit")
        )
        return [o for o in found if o is not None]

    def _write_order(self, order: Order) -> bool:
        """A row of ``order`` as the broker holds it, at the market time it got there,
        unless the audit's newest row of it already says so."""
        seen = self.audited.get(order.client_order_id)
        if seen is not None and seen.status == order.status:
            return False
        self.audited[order.client_order_id] = AuditedOrder(order.status, order.role)
        when = order.filled_ms if order.status == "FILLED" and order.filled_ms else order.updated_ms
        self._write(order_record(order, self.broker.name, event_ts=iso_ms(when)))
        return True

    def _write_verdict(
        self,
        verdict: Verdict,
        intent: TradeIntent,
        agent_id: str,
        trace_id: str | None,
        hook_id: str | None,
        event_id: str | None,
        coid: str,
        account: str,
    ) -> None:
        """The risk row of ``intent``, at the account's market time."""
        self._write(
            risk_record(
                verdict,
                intent,
                agent_id=agent_id,
                trace_id=trace_id,
                hook_id=hook_id,
                event_id=event_id,
                client_order_id=coid,
                event_ts=iso_ms(self.broker.now_ms(account)),
            )
        )

    def _write(self, record: AuditRecord) -> None:
        if self.audit is not None:
            self.audit.write(record)
