"""Copy-trade reconciliation: at READY and every ``[copytrade] reconcile_seconds``
(live only: wall-clock rounds would make a replay differ run to run), each
follower's mirrored positions are compared with their targets.

A follower is an agent whose hooks listen to ``copytrade.signal.*`` and whose
``[copytrade] reconcile`` is not ``off``. Only positions it follows (its
``leaders`` / ``symbols`` / ``directions``) with a computable target and no
order still working are compared. A drift beyond ``tolerance``
(:func:`daemon.copytrade.follow.drift`) is, as configured:

* ``alert``: one ALERT per drift, until it is back within tolerance;
* ``correct``: a corrective order through the agent's risk engine (a market
  order with the leader's stop-loss and take-profit to add, a CLOSE_POSITION of
  the excess to reduce), keyed by the position and its rank, so a restart or a
  second round never places it twice; a refusal is one ALERT, and the next round
  tries again.

It runs between the agent's events (``AgentRuntime.busy``), from the agent's own
book: a signal the agent has not evaluated yet is not a drift.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

import anyio
import msgspec
import structlog

from daemon.agents.dispatcher import AgentRuntime
from daemon.alerts import Alert, AlertNotifier
from daemon.copytrade.follow import DUST, Drift, stop_loss
from daemon.copytrade.mirror import MAX_CORRECTIONS, correction_key
from daemon.copytrade.view import checks
from daemon.events import COPYTRADE_SIGNALS, iso_ms, trace_id_for
from daemon.trading.desk import TradeDesk
from daemon.trading.intents import TradeIntent

log = structlog.get_logger("copytrade")

HOOK_ID: Final = "reconcile"  # what corrective orders and drift alerts name as their hook
TOPIC: Final = "copytrade.reconcile"
SETTLE_SECONDS: Final = 5.0  # how long a round waits for an agent's queue to empty


def is_follower(rt: AgentRuntime) -> bool:
    """Whether reconciliation looks at this agent."""
    return rt.agent.config.copytrade.reconcile != "off" and rt.listens_to(
        COPYTRADE_SIGNALS + "opened"
    )


class Reconciler:
    """Compares followers with their leaders; acts on drift as each agent says."""

    def __init__(self, desk: TradeDesk, alerts: AlertNotifier) -> None:
        self.desk = desk
        self.alerts = alerts
        self.rounds = 0
        self.corrections = 0
        self.alerted = 0
        # agent -> its drifts of the last round, by (leader, positionId)
        self.drifts: dict[str, dict[tuple[str, str], Drift]] = {}

    async def run(self, runtimes: Callable[[], Mapping[str, AgentRuntime]], every: float) -> None:
        """A round now, then one every ``every`` seconds (0: only the first)."""
        while True:
            for rt in list(runtimes().values()):
                if not is_follower(rt) or rt.removed:
                    continue
                await _settled(rt)
                async with rt.busy:
                    try:
                        await self.reconcile(rt)
                    except Exception:  # one agent's round never ends the others'
                        log.exception("reconciliation failed", agent=rt.agent_id)
            self.rounds += 1
            if every <= 0:
                return
            await anyio.sleep(every)

    async def reconcile(self, rt: AgentRuntime) -> list[Drift]:
        """One round for one follower: its drifts, acted on."""
        settings = rt.agent.config.copytrade
        account = self.desk.account_of(rt.agent_id)
        before = self.drifts.get(rt.agent_id, {})
        now: dict[tuple[str, str], Drift] = {}
        broker = self.desk.broker
        for p, row, d, pending in checks(
            rt.agent_id, account, settings, rt.state.copytrade, broker
        ):
            key = (p.leader, p.position_id)
            if pending and key in before:
                now[key] = before[key]  # an order of it is still working: next round
            if d is None:
                continue
            now[key] = d
            corrections = row["mirrored"]["corrections"]
            if settings.reconcile == "correct" and corrections < MAX_CORRECTIONS:
                if await self._correct(rt, d, row, corrections + 1) or key in before:
                    continue
                why = "corrective order refused by the risk engine"
            elif key in before:
                continue  # alerted when it was found
            else:
                why = "drift"
            await self._alert(rt, d, why)
        for key in before.keys() - now.keys():
            log.info("copy back on target", agent=rt.agent_id, leader=key[0], position=key[1])
        self.drifts[rt.agent_id] = now
        return list(now.values())

    async def _correct(self, rt: AgentRuntime, d: Drift, row: dict[str, Any], rank: int) -> bool:
        """Place the ``rank``-th corrective order; whether it was accepted."""
        volume = round(abs(d.delta), 8)
        if volume < DUST:
            return True
        intent = (
            TradeIntent(
                action="PLACE_MARKET_ORDER",
                symbol=d.symbol,
                side="buy" if d.side == "long" else "sell",
                volume=volume,
                stop_loss=stop_loss(
                    rt.agent.config.copytrade,
                    d.side,
                    row.get("stopLoss"),
                    self.desk.broker.last_price(d.symbol, self.desk.account_of(rt.agent_id)),
                ),
                take_profit=row.get("takeProfit"),
            )
            if d.delta > 0
            else TradeIntent(action="CLOSE_POSITION", symbol=d.symbol, volume=volume)
        )
        key = correction_key(d.leader, d.position_id, rank)
        outcome = await self.desk.handle(
            intent,
            agent_id=rt.agent_id,
            dedupe_key=key,
            trace_id=trace_id_for(key),
            hook_id=HOOK_ID,
            event_id=key,
            ahead=True,
        )
        if outcome.verdict is not None and not outcome.verdict.approved:
            return False
        self.corrections += 1
        log.warning(
            "copy corrected",
            agent=rt.agent_id,
            leader=d.leader,
            position=d.position_id,
            held=d.held,
            target=d.target,
            order=outcome.client_order_id,
        )
        return True

    async def _alert(self, rt: AgentRuntime, d: Drift, why: str) -> None:
        self.alerted += 1
        reason = (
            f"copy {why}: holds {d.held:g} of {d.leader}/{d.position_id} "
            f"({d.side} {d.symbol}), target {d.target:g}"
        )
        log.warning("copy drift", agent=rt.agent_id, reason=reason)
        event_id = f"{TOPIC}:{d.leader}:{d.position_id}"
        await self.alerts.send(
            Alert(
                agent_id=rt.agent_id,
                hook_id=HOOK_ID,
                reason=reason,
                event_id=event_id,
                trace_id=trace_id_for(event_id),
                symbol=d.symbol,
                topic=TOPIC,
                ts=iso_ms(self.desk.broker.now_ms(self.desk.account_of(rt.agent_id))),
            )
        )

    def statistics(self) -> dict[str, Any]:
        """For status: rounds, corrective orders placed, alerts, and the open drifts."""
        return {
            "rounds": self.rounds,
            "corrections": self.corrections,
            "alerts": self.alerted,
            "drift": {
                agent: [msgspec.to_builtins(d) for d in drifts.values()]
                for agent, drifts in self.drifts.items()
                if drifts
            },
        }


async def _settled(rt: AgentRuntime) -> None:
    """Wait (a while) for the agent's queued events: a round right after a start
    should see the signals being re-delivered, not race them."""
    step = 0.05
    for _ in range(int(SETTLE_SECONDS / step)):  # polled: the queue has no "empty" event
        if not (rt.sub.statistics().depth or rt.sub.backlog):
            return
        await anyio.sleep(step)
