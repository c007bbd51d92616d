"""Trade intents a stop cut short, at an agent's next start.

An intent is cut short when its hook row reached the audit log and its risk row
did not (the daemon stopped, or was killed, in between; see
:func:`daemon.audit.reader.recent_evaluations`). At the next start each is kept
for its event, which a replay delivers again (the dispatcher acts on it then,
on the market as of that event); placed already, if the broker has its order
(the rows the kill took are written now); or refused, with an alert, when its
moment has passed (live: the market moved on). Nothing here awaits: the
dispatcher owns the acting.
"""

from __future__ import annotations

import msgspec
import structlog

from daemon.alerts import Alert
from daemon.audit.reader import CutIntent, Unplaced
from daemon.errors import HookResultInvalid
from daemon.events import COPYTRADE_SIGNALS, trace_id_for
from daemon.trading.broker import client_order_id
from daemon.trading.desk import IntentOf, TradeDesk
from daemon.trading.intents import ORDER_ACTIONS, TradeIntent
from daemon.trading.risk import CUT_SHORT
from hooks_runtime.decisions import Trade, to_decision

log = structlog.get_logger("dispatcher")


class CutIntents:
    """What an agent's start does with the intents the last stop cut short."""

    def __init__(self, desk: TradeDesk) -> None:
        self.desk = desk

    def hold(
        self,
        agent_id: str,
        held: dict[str, list[CutIntent]],
        cut: list[CutIntent],
        unplaced: list[Unplaced],
        replayed: bool,
        checked: set[str],
    ) -> list[Alert]:
        """Keep in ``held`` (by event id) the intents a stop cut short for their event,
        which comes again on event time (``replayed``: the replay resumes before it)
        and for a signal (known by id). A live market event does not: its intent is
        refused in the audit log (the market has moved on since the decision), unless
        the broker has its order (the kill came after it was recorded: its rows are
        written instead). An approval with no order row (``unplaced``) gets the rows
        of the order the broker has; without one, a hook's intent is cut short as
        above, and another's (a tool's: its run is gone) is refused. Returns the
        alerts to raise for the refused ones: a trade the agent decided on did not
        happen, which its operator must hear of. An intent for an order that has a
        risk row (``checked``: another hook asked for it first) was not cut."""
        alerts: list[Alert] = []
        for c in cut:
            d = cut_trade(agent_id, c)
            if d is None:
                continue
            key = trade_key(d, c.hook_id, c.event_id, c.topic)
            if d.intent.action not in ORDER_ACTIONS and client_order_id(agent_id, key) in checked:
                continue
            self._hold(agent_id, held, c, d, key, replayed, alerts)
        for u in unplaced:
            self._unplaced(agent_id, held, u, replayed, alerts)
        return alerts

    def _hold(
        self,
        agent_id: str,
        held: dict[str, list[CutIntent]],
        c: CutIntent,
        d: Trade,
        key: str,
        replayed: bool,
        alerts: list[Alert],
    ) -> None:
        """One cut-short intent (see :meth:`hold`)."""
        if replayed or c.topic.startswith(COPYTRADE_SIGNALS):
            held.setdefault(c.event_id, []).append(c)
            return
        new_order = d.intent.action not in ORDER_ACTIONS
        if new_order and self.restore_rows(agent_id, c, d, key, c.trace_id) >= 0:
            return  # the kill came after the order was recorded: not cut
        if self.desk.refuse_cut(d.intent, _intent_of(agent_id, c, key, c.trace_id)):
            log.warning(
                "trade intent cut short by the stop: not placed (live: the market moved on)",
                agent=agent_id,
                hook=c.hook_id,
                event_id=c.event_id,
            )
            why = f"{CUT_SHORT}: not placed after the restart ({d.reason})"
            alerts.append(
                _cut_alert(agent_id, c.hook_id, c.event_id, c.trace_id, d.intent, why, c.topic)
            )

    def _unplaced(
        self,
        agent_id: str,
        held: dict[str, list[CutIntent]],
        u: Unplaced,
        replayed: bool,
        alerts: list[Alert],
    ) -> None:
        """One approval the audit shows no order row for (see :meth:`hold`)."""
        about = {"agent": agent_id, "by": u.hook_id, "client_order_id": u.client_order_id}
        try:
            intent = msgspec.convert(u.intent, TradeIntent)
        except msgspec.ValidationError as exc:  # a row written by another version
            log.warning("approved intent unreadable", error=str(exc), **about)
            return
        if intent.action in ORDER_ACTIONS:
            return  # a change or cancel: its rows are the order's own
        of = IntentOf(
            agent_id=agent_id, dedupe_key="", trace_id=u.trace_id, hook_id=u.hook_id,
            event_id=u.event_id, client_order_id=u.client_order_id,
        )  # fmt: skip
        rows = self.desk.restore_rows(intent, of, approval=False)
        if rows >= 0:
            if rows:
                log.info(
                    "order placed just before the stop: its rows written now", rows=rows, **about
                )
            return
        d = cut_trade(agent_id, u.cut) if u.cut is not None else None
        if u.cut is not None and d is not None:
            key = trade_key(d, u.cut.hook_id, u.cut.event_id, u.cut.topic)
            self._hold(agent_id, held, u.cut, d, key, replayed, alerts)
            return
        gone = (
            "the daemon stopped between this approval and its order; the run that "
            "asked for it is gone, so it is not placed after the restart"
        )
        if self.desk.refuse_cut(intent, of, gone):
            log.warning("approved order cut short by the stop: not placed", **about)
            why = f"{CUT_SHORT}: approved, then not placed: the daemon stopped in between"
            alerts.append(
                _cut_alert(agent_id, u.hook_id, u.event_id, u.trace_id, intent, why, None)
            )

    def restore_rows(
        self, agent_id: str, c: CutIntent, d: Trade, key: str, trace: str | None
    ) -> int:
        """The rows a kill took of a cut intent whose order the broker has (see
        :meth:`TradeDesk.restore_rows`); -1 when it has none."""
        return self.desk.restore_rows(d.intent, _intent_of(agent_id, c, key, trace))


def cut_trade(agent_id: str, c: CutIntent) -> Trade | None:
    """The decision of a cut-short intent's row (None, logged: not one we can read)."""
    try:
        d = to_decision(c.output, "autotrade")
    except HookResultInvalid as exc:  # a row written by another version
        log.warning("cut-short intent unreadable", agent=agent_id, error=str(exc))
        return None
    return d if isinstance(d, Trade) else None


def trade_key(d: Trade, hook_id: str, event_id: str, topic: str) -> str:
    """The key of an intent's client order id: stable across redeliveries."""
    if topic.startswith(COPYTRADE_SIGNALS):
        # One follower order per leader signal, whichever hook asks and
        # however often the signal comes (a redelivery, a restart).
        return event_id
    return d.dedupe_key or f"{hook_id}:{event_id}"


def _intent_of(agent_id: str, c: CutIntent, key: str, trace: str | None) -> IntentOf:
    return IntentOf(
        agent_id=agent_id, dedupe_key=key, trace_id=trace, hook_id=c.hook_id,
        event_id=c.event_id,
    )  # fmt: skip


def _cut_alert(
    agent_id: str,
    hook_id: str | None,
    event_id: str | None,
    trace_id: str | None,
    intent: TradeIntent,
    why: str,
    topic: str | None,
) -> Alert:
    """The alert for an intent a stop cut short and that is not placed."""
    return Alert(
        agent_id=agent_id, hook_id=hook_id or "", reason=why, event_id=event_id or "",
        trace_id=trace_id or (trace_id_for(event_id) if event_id else ""),
        symbol=intent.symbol, topic=topic,
    )  # fmt: skip
