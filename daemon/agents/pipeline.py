"""The hook pipeline as one service component: sandbox pool, audit log, broker, agents.

Entered before the feeds start and left after the bus has closed, so agents
drain every event they already received, the broker applies the market events
on its own route (:mod:`daemon.trading.route`) until the agents are done, and
the audit log is flushed last.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import ExitStack, asynccontextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import anyio
import anyio.lowlevel
import msgspec
import structlog
from anyio.streams.memory import MemoryObjectSendStream

from daemon.agents.budget import CpuBudget
from daemon.agents.checkpoints import Checkpoints
from daemon.agents.dispatcher import Dispatcher
from daemon.agents.manager import AgentManager
from daemon.agents.reconcile import Reconciler
from daemon.agents.revisions import RevisionStore
from daemon.agents.store import HookStore
from daemon.alert_outbox import FILE_NAME as ALERT_OUTBOX_FILE
from daemon.alert_outbox import AlertOutbox
from daemon.alerts import AlertQueue, WebhookNotifier
from daemon.audit.reader import Recent, recent_evaluations
from daemon.audit.records import SignalRecord, now_ts
from daemon.audit.writer import open_audit
from daemon.backlog import open_backlog
from daemon.bus import Bus, Subscription
from daemon.config import Config, CopytradeSection
from daemon.copytrade.follow import FollowSettings
from daemon.copytrade.relay import LEADER_STATS_FILE, MAX_LEADER_STATS_BYTES, LeaderRelay
from daemon.errors import NOT_JSON, StoreError, WorkspaceFileError
from daemon.events import MARKETPLACE_STRATEGY_UPDATED, FeedEvent, signal_of
from daemon.state import StateCache, write_snapshot
from daemon.status import AccountStatus
from daemon.trading.account_status import account_status
from daemon.trading.desk import TradeDesk, audited_publish
from daemon.trading.intents import TradingState
from daemon.trading.matching import FillCosts
from daemon.trading.paper import PaperBroker
from daemon.trading.route import MarketRoutes
from daemon.wake.store import RunStore
from hooks_runtime.pool import open_worker_pool
from hooks_runtime.safe_read import read_regular

if TYPE_CHECKING:
    from daemon.service import Service

log = structlog.get_logger("pipeline")

SETTLE_LIMIT_SECONDS = 30.0
OUTBOX_SIZE = 10_000


@asynccontextmanager
async def open_agents(service: Service) -> AsyncIterator[AgentManager]:
    """Run the hook pipeline for ``service`` while the context is open."""
    cfg = service.config
    state_dir = Path(cfg.daemon.state_dir)
    # The broker publishes account events through an outbox task, so an agent
    # task that places an order never waits on its own full subscription.
    send, receive = anyio.create_memory_object_stream[FeedEvent](OUTBOX_SIZE)
    # The stores close once every task has ended: after a cut drain an agent task
    # can still be in a shielded step that goes on to its store.
    closing = ExitStack()
    with closing:
        async with (
            open_audit(
                cfg.audit_dir,
                flush_interval=cfg.audit.flush_interval_seconds,
                max_total_bytes=cfg.audit.max_total_mb * 1024 * 1024,
                max_days=cfg.audit.max_days,
                run_id=service.run_id,
                # A backtest's scratch log is read by its report, and its `why` reads
                # parts whole: no index built while the run holds the GIL.
                index_ids=cfg.daemon.durable,
            ) as audit,
            open_worker_pool(cfg.hooks.sandbox) as pool,
            anyio.create_task_group() as tg,
        ):
            # Not durable (a backtest's scratch dir): no store waits for the disk.
            light: Literal["OFF", "NORMAL"] = "NORMAL" if cfg.daemon.durable else "OFF"
            broker = PaperBroker(
                state_dir,
                audited_publish(partial(_post, send), audit),
                # Durable: NORMAL, synced off the loop before its events leave.
                synchronous="NORMAL" if cfg.daemon.durable else "OFF",
                sync_before_emit=cfg.daemon.durable,
                max_participation=cfg.trading.paper_max_participation,
                costs=FillCosts(
                    maker_fee_bps=cfg.trading.paper_maker_fee_bps,
                    taker_fee_bps=cfg.trading.paper_taker_fee_bps,
                    slippage_bps=cfg.trading.paper_slippage_bps,
                ),
            )
            closing.callback(broker.close)
            hook_store = HookStore(
                state_dir / "hooks.sqlite3",
                dedupe_max_keys=cfg.hooks.dedupe_max_keys,
                synchronous=light,
            )
            closing.callback(hook_store.close)
            outbox = alert_outbox(cfg, state_dir)
            if outbox is not None:
                closing.callback(outbox.close)
            alerts = AlertQueue(alert_webhook(cfg), outbox=outbox, sink=audit.write)
            run_store = RunStore.in_dir(state_dir, light)
            closing.callback(run_store.close)
            desk = TradeDesk(broker, audit)
            if cfg.daemon.durable:  # (a scratch dir is never restarted)
                desk.write_ahead = audit.write_ahead
            service.audit = audit.write
            if service.tools is not None:  # the trading tools of LLM runs act through it
                service.tools.ctx.desk = desk
            checkpoints = Checkpoints(hook_store, audit)
            backlog_dir = state_dir / "backlog"
            if service.from_start or cfg.event_time:
                # On event time the replay re-publishes everything after the agents'
                # marks: what waited on disk at the stop is delivered again from there.
                shutil.rmtree(backlog_dir, ignore_errors=True)
            if service.from_start:
                checkpoints.reset()
                run_store.clear_pending()
                seen = Recent({}, {})
            else:
                seen = await anyio.to_thread.run_sync(recent_evaluations, cfg.audit_dir)
            backlog_bytes = cfg.bus.agent_backlog_mb * 1024 * 1024
            desk.set_state(TradingState(cfg.trading.state))
            io = _Tasks(tg)  # the tasks that finish on their own once their inputs close
            # Created before any agent subscribes, so the broker sees every market event
            # they see; on event time each account steps with its own agents.
            route = MarketRoutes(
                service.bus,
                broker.on_market_event,
                broker.open_cursor,
                lockstep=cfg.event_time,
                start=io.start,
                overflow=lambda account: open_backlog(
                    backlog_dir / "broker" / f"{account}.jsonl", backlog_bytes, f"account {account}"
                ),
            )
            dispatcher = Dispatcher(
                pool=pool,
                store=hook_store,
                audit=audit,
                desk=desk,
                alerts=alerts,
                route=route,
                checkpoints=checkpoints,
                lookahead=cfg.hooks.lookahead_events if cfg.event_time else 0,
                # A scratch dir is never restarted: nothing to hand to the OS first.
                write_ahead=audit.write_ahead if cfg.daemon.durable else None,
                cpu=None
                if cfg.event_time or not cfg.hooks.cpu_budget_share
                else CpuBudget(cfg.hooks.cpu_budget_share, cfg.hooks.cpu_budget_window_seconds),
            )
            manager = AgentManager(
                agents_dir=Path(cfg.hooks.agents_dir),
                bus=service.bus,
                dispatcher=dispatcher,
                run_store=run_store,
                state_factory=lambda: _copy_state(service.state),
                max_source_bytes=cfg.hooks.sandbox.max_source_bytes,
                max_agent_source_bytes=cfg.hooks.sandbox.max_agent_source_bytes,
                reload_seconds=cfg.hooks.reload_seconds,
                event_time=cfg.event_time,
                recently_evaluated=seen,
                tools=service.tools,
                backlog_dir=backlog_dir,
                backlog_max_bytes=backlog_bytes,
                run_agents=cfg.hooks.run_agents,
                include_disabled=cfg.hooks.include_disabled,
                stop_after_failed_runs=cfg.hooks.stop_after_failed_runs,
                on_runs_failing=service.request_stop,
                revisions=RevisionStore(state_dir / "revisions"),
            )
            service.on_interrupt.append(manager.spare_runs)
            if service.tools is not None:  # and over MCP, for the agent [mcp] names
                service.tools.ctx.agent_call = manager.agent_call
                if cfg.event_time:  # runs' tools answer at the agent's time, not today
                    service.tools.ctx.agent_view = manager.agent_view
            io.start(_forward, receive, service)
            io.start(alerts.run)
            desk.known_rows(seen.orders, await broker.recover(as_recorded=cfg.event_time))
            caught_up = desk.catch_up_rows()
            if caught_up:
                log.info("order changes a stop kept from the audit written now", rows=caught_up)
            tg.start_soon(checkpoints.run, cfg.audit.flush_interval_seconds)
            tg.start_soon(manager.run)
            await manager.wait_loaded()
            _free_route(cfg, route, broker)
            service.status_providers["hooks"] = manager.statistics
            service.status_providers["accounts"] = partial(_accounts, desk, manager)
            service.status_providers["broker"] = route.statistics
            service.status_providers["delivery"] = checkpoints.statistics
            service.status_providers["alerts"] = alerts.statistics
            service.resume_points = lambda: checkpoints.resume_points(list(manager.runtimes))
            layers = ", ".join(pool.ready.active) if pool.ready is not None else "no worker yet"
            log.info("agents loaded", agents=sorted(manager.runtimes), sandbox_layers=layers)
            relayed = _leader_relay(cfg.copytrade.leader_agents, desk, manager, service)
            if relayed is not None:
                io.start(_relay, *relayed, send, state_dir / LEADER_STATS_FILE, audit.write)
                if cfg.event_time:
                    # A replay with leaders: what a candle causes (the leader's fills, their
                    # signals, the followers' copies) is handled before the next candle.
                    service.settle = partial(_settled, service.bus, send)
            reconciler = Reconciler(desk, alerts)
            service.status_providers["copytrade"] = reconciler.statistics
            reconciling = anyio.CancelScope()
            if not cfg.event_time:  # wall-clock rounds would make a replay differ run to run
                tg.start_soon(
                    _reconcile, reconciling, reconciler, manager, service.ready, cfg.copytrade
                )
            try:
                yield manager
            finally:
                # Drain in data-path order: agents finish their queued events, the broker
                # sees the last market events, its account events reach the (still open)
                # bus, queued alerts are delivered; then the stores close. A drain that
                # cannot finish within [daemon] stop_timeout_seconds is cut: what the agents
                # did not finish is re-delivered after the restart (see checkpoints).
                limit = cfg.daemon.stop_timeout_seconds
                with anyio.move_on_after(limit, shield=True) as drain:
                    reconciling.cancel()  # no corrective order while the agents drain
                    manager.stop_reloading()
                    manager.drain_wakes = service.ran_out()
                    manager.close_subscriptions()
                    await manager.wait_drained()
                    route.close()  # the broker applies what it holds, then its tasks end
                    if relayed is not None:
                        relayed[0].close()
                    send.close()
                    alerts.close()
                    await io.idle.wait()
                manager.release_backlogs()
                route.release()
                send.close()  # a cut drain did not get there (both idempotent)
                alerts.close()
                with anyio.CancelScope(shield=True):
                    await checkpoints.close()  # what was finished is known, even after a cut
                if drain.cancelled_caught:
                    left = sum(rt.sub.statistics().depth for rt in manager.runtimes.values())
                    log.warning(
                        "stop timeout: drain cut; unfinished events are re-delivered at restart",
                        seconds=limit,
                        queued=left,
                    )
                service.audit = None
                tg.cancel_scope.cancel()
                # The final status is written after this: it reports the agents as they
                # were at the stop, without asking the stores closed below.
                final = manager.statistics()
                service.status_providers["hooks"] = lambda: final
                books = _accounts(desk, manager)
                service.status_providers["accounts"] = lambda: books
                kept = alerts.statistics()  # (the outbox closes below)
                service.status_providers["alerts"] = lambda: kept


def _accounts(desk: TradeDesk, manager: AgentManager) -> dict[str, AccountStatus]:
    """Every loaded agent's account, and any other account holding a position or a
    working order; empty (logged) if the broker's store cannot be read."""
    traders: dict[str, list[str]] = {}
    for agent_id, rt in manager.runtimes.items():
        if not rt.removed:
            traders.setdefault(desk.account_of(agent_id), []).append(agent_id)
    try:
        for account in desk.broker.accounts():
            traders.setdefault(account, [])
        return {a: account_status(desk.broker, a, agents) for a, agents in sorted(traders.items())}
    except StoreError as exc:
        log.error("accounts left out of the status", error=str(exc))
        return {}


def _free_route(cfg: Config, route: MarketRoutes, broker: PaperBroker) -> None:
    """On event time, start the shared (free) route unless no account can be without
    an agent for the whole run: the agents are loaded once (no hot reload, so none
    leaves or joins), MCP cannot trade, and every account with an order or a
    position is an agent's."""
    orphans = route.without_route(broker.accounts())
    if cfg.hooks.reload_seconds > 0 or cfg.mcp.enabled or orphans:
        route.free()
    else:
        log.info("every account is an agent's: no shared broker route")


class _Tasks:
    """Tasks in a group that we can wait for without cancelling them."""

    def __init__(self, tg: anyio.abc.TaskGroup) -> None:
        self.tg = tg
        self.pending = 0
        self.idle = anyio.Event()

    def start(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        self.pending += 1

        async def run() -> None:
            try:
                await fn(*args)
            finally:
                self.pending -= 1
                if not self.pending:
                    self.idle.set()

        self.tg.start_soon(run)


def _leader_relay(
    leaders: list[str], desk: TradeDesk, manager: AgentManager, service: Service
) -> tuple[Subscription, LeaderRelay] | None:
    """``[copytrade] leader_agents``: their accounts' events become signals, with
    the leader's equity (its ``[copytrade] capital`` plus its account's PnL)."""
    if not leaders:
        return None
    broker = desk.broker
    capital: dict[str, float] = {}
    for agent in leaders:
        rt = manager.runtimes.get(agent)
        capital[desk.account_of(agent)] = (
            rt.agent.config.copytrade.capital if rt is not None else FollowSettings().capital
        )
    relay = LeaderRelay(
        {desk.account_of(agent): agent for agent in leaders},
        equity=lambda account: capital[account] + broker.pnl(account),
    )
    for account in relay.leaders:
        for symbol, position in broker.positions(account).items():
            relay.seed(account, symbol, position.quantity, position.opened_ms)
    load_leader_stats(relay, service.state_dir / LEADER_STATS_FILE)
    log.info("copy-trade leaders", agents=leaders)
    return service.bus.subscribe("account.>", name="copytrade-leader"), relay


def load_leader_stats(relay: LeaderRelay, path: Path) -> None:
    """Continue the records kept at ``path``; a missing file starts from zero, and so
    does one that is not a small regular file (a link, a FIFO: never waited on) or
    does not decode, with a warning."""
    if not os.path.lexists(path):
        return
    try:
        relay.load_stats(read_regular(path, MAX_LEADER_STATS_BYTES, "the leader records"))
    except (WorkspaceFileError, *NOT_JSON, msgspec.ValidationError) as exc:
        log.warning("leader records unreadable; counting from zero", path=str(path), error=str(exc))


async def _relay(
    sub: Subscription,
    relay: LeaderRelay,
    send: anyio.abc.ObjectSendStream[FeedEvent],
    stats_path: Path,
    audit: Callable[[SignalRecord], None],
) -> None:
    """Publish the signals the leaders' account events make (until the drain closes
    ``sub``; what comes after the outbox closed is dropped with the daemon), each in
    the audit log as the doors' are; keep the leaders' records after each close,
    and their signal counts at most a second late (and at the end)."""
    kept_at, unkept = anyio.current_time(), False

    async def keep() -> None:
        nonlocal kept_at, unkept
        kept_at, unkept = anyio.current_time(), False
        try:
            await anyio.to_thread.run_sync(write_snapshot, stats_path, relay.dump_stats())
        except StoreError as exc:
            log.warning("leader records not kept", error=str(exc))

    try:
        async for event in sub:
            try:
                signals = relay.on_event(event)
            except (KeyError, TypeError, ValueError):  # an account event of another shape
                log.exception("copy-trade relay skipped an event", event_id=event.event_id)
                continue
            unkept = unkept or bool(signals)
            closed = any(out.topic == MARKETPLACE_STRATEGY_UPDATED for out in signals)
            if closed or (unkept and anyio.current_time() - kept_at >= 1.0):
                await keep()
            for out in signals:
                try:
                    await send.send(out)
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    return
                if out.topic != MARKETPLACE_STRATEGY_UPDATED:  # "accepted": published
                    audit(_signal_record(out))
    finally:
        if unkept:
            with anyio.CancelScope(shield=True):
                await keep()


def _signal_record(event: FeedEvent) -> SignalRecord:
    """The audit row of a leader agent's signal, as published."""
    signal = signal_of(event.payload)
    return SignalRecord(
        ts=now_ts(),
        agent_id="-",
        trace_id=event.trace_id,
        event_ts=event.ts,
        source=event.source,
        leader=signal.leader if signal is not None else "?",
        signal_id=signal.signal_id if signal is not None else None,
        event_id=event.event_id,
        status="accepted",
    )


async def _settled(bus: Bus, outbox: MemoryObjectSendStream[FeedEvent]) -> None:
    """Until every subscriber has finished what was published and the broker's
    outbox is empty (polled: a replay with leader agents pays a loop turn or two per
    event for causal order); gives up after ``SETTLE_LIMIT_SECONDS`` with a warning."""
    waited = 0.0
    for turn in range(1_000_000):
        stats = outbox.statistics()
        if bus.idle() and not stats.current_buffer_used and stats.tasks_waiting_receive:
            return
        if turn < 20:
            await anyio.lowlevel.checkpoint()
            continue
        await anyio.sleep(0.001)
        waited += 0.001
        if waited >= SETTLE_LIMIT_SECONDS:
            log.warning("replay did not settle; publishing on", seconds=SETTLE_LIMIT_SECONDS)
            return


async def _reconcile(
    scope: anyio.CancelScope,
    reconciler: Reconciler,
    manager: AgentManager,
    ready: anyio.Event,
    cfg: CopytradeSection,
) -> None:
    """Copy-trade reconciliation from READY (signals re-delivered at start are on the
    bus) until the drain starts (``scope`` cancelled)."""
    with scope:
        await ready.wait()
        await reconciler.run(lambda: manager.runtimes, cfg.reconcile_seconds)


def _copy_state(state: StateCache) -> StateCache:
    """A private cache for one agent, warm-started from the service's cache."""
    copy = StateCache(state.max_candles)
    copy.load(state.dump())
    return copy


async def _post(outbox: MemoryObjectSendStream[FeedEvent], event: FeedEvent) -> None:
    """Put a broker event in the outbox; wait only when it is full. anyio's ``send``
    gives the loop a turn before every item, one per order event in a backtest.

    After a cut drain the outbox is closed while an agent task may still be placing
    an order in a shielded step: its events are dropped with the bus, not raised. A
    raise stopped the broker's emitting half way, so the fill it had stored never
    reached the audit log (the audit row is written before this call)."""
    try:
        try:
            outbox.send_nowait(event)
        except anyio.WouldBlock:
            await outbox.send(event)
    except (anyio.ClosedResourceError, anyio.BrokenResourceError):
        log.debug("account event after the outbox closed", event_id=event.event_id)


async def _forward(receive: anyio.abc.ObjectReceiveStream[FeedEvent], service: Service) -> None:
    async with receive:
        async for event in receive:
            await service.bus.publish(event)


def alert_webhook(cfg: Config) -> WebhookNotifier | None:
    """The webhook for live alerts, if one is set. On event time (a replay) alerts are
    about the past: they are logged and audited, never posted, so trying an agent on a
    year of history does not page anyone with a year of alerts (``clock = "wall"``
    posts them)."""
    if not cfg.hooks.alert_webhook:
        return None
    if cfg.event_time:
        log.info("replay on event time: ALERTs are logged and audited, not sent to alert_webhook")
        return None
    return WebhookNotifier(cfg.hooks.alert_webhook)


def alert_outbox(cfg: Config, state_dir: Path) -> AlertOutbox | None:
    """Where live alerts wait for the webhook over a restart or an outage: a durable
    state dir's ``alerts.sqlite3``, unless ``alert_webhook_keep_seconds`` is 0."""
    keep = cfg.hooks.alert_webhook_keep_seconds
    if not cfg.hooks.alert_webhook or cfg.event_time or not cfg.daemon.durable or keep <= 0:
        return None
    try:
        return AlertOutbox(state_dir / ALERT_OUTBOX_FILE, keep_seconds=keep)
    except StoreError as exc:  # costs the redelivery only: alerts still go out as raised
        log.error("alert outbox not opened: alerts are posted, not kept", error=str(exc))
        return None
