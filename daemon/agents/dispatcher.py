"""The dispatcher: bus events -> each agent's hooks (one sandbox round trip) -> actions.

Per agent, one task reads the agent's subscription in order, builds the
read-only ``state`` and evaluates every current hook revision in one batch.
Each result is audited (IGNOREs and errors too) and then acted on:

* a decision with a ``dedupeKey`` the agent already acted on, or from a hook
  still cooling down for the event's symbol, is suppressed (``dedupe`` /
  ``cooldown``); both are persisted before acting, on event time;
* a paused agent still evaluates (so ``why`` can explain) but acts on nothing;
* WAKE goes to the agent's wake scheduler (which may suppress by budget);
* ALERT goes to the alert notifier;
* TRADE_INTENT (its intent already typed at the sandbox boundary) goes to
  the trade desk (the agent's risk engine, then the broker under a client order id derived from the dedupe
  key, so a retry after a crash cannot place a second order).

Determinism: each agent keeps its *own* state cache, fed from the same
subscription in the same order as its hooks see events (candles and ticks are
always part of an agent's subscription). The ``state`` a hook gets is exactly
"everything before and including this event", live and in replay alike. The
broker gets market data on its own route; an agent waits until the broker has
applied an event before its hooks see it, and reports each event done, which
is what the broker waits for in lockstep (see :mod:`daemon.trading.route`).

Hot reload lives in :mod:`daemon.agents.manager`; this module only acts on
the :class:`AgentRuntime` it is given.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import anyio
import anyio.abc
import msgspec
import structlog

from daemon.agents.budget import CpuBudget
from daemon.agents.checkpoints import Checkpoints, marked
from daemon.agents.cut import CutIntents, cut_trade, trade_key
from daemon.agents.health import HealthTracker
from daemon.agents.lookahead import Lookahead, Pacing, Portfolio, carry, keep, stood_paused
from daemon.agents.store import AGENT_WIDE, HookStore
from daemon.agents.workspace import Agent
from daemon.alerts import Alert, AlertNotifier
from daemon.audit.reader import CutIntent, Unplaced
from daemon.audit.records import HookRecord, now_ts
from daemon.bus import Subscription
from daemon.clock import EventClock
from daemon.copytrade.view import follower_view
from daemon.errors import (
    HookRequestTooLarge,
    HookRequestUnsendable,
    StoreError,
)
from daemon.events import (
    COPYTRADE_SIGNALS,
    FeedEvent,
    parse_iso_ms,
    signal_of,
    to_dict,
    topic_matches,
    trace_id_for,
)
from daemon.logs import Outage
from daemon.state import StateCache
from daemon.trading.desk import AuditSink, TradeDesk, TradeOutcome
from daemon.trading.route import MarketRoutes
from daemon.wake.context import WakeRequest
from daemon.wake.scheduler import WakeScheduler
from hooks_runtime.decisions import Alert as AlertDecision
from hooks_runtime.decisions import Decision, Ignore, Trade, Wake, to_builtins
from hooks_runtime.hookfile import HookSpec
from hooks_runtime.pool import HookResult, WorkerPool
from hooks_runtime.protocol import LAST_OUTPUTS, ErrorKind, Step, encode_state

log = structlog.get_logger("dispatcher")
# Always in an agent's subscription: they feed the agent's own state cache.
STATE_TOPICS = ("market.candle.>", "market.price.tick")
MAX_COOLDOWN_SECONDS = 366 * 86_400  # longer cooldowns are clamped to a year
RECENT_EVENTS = 4096  # per agent: re-emitted events (same eventId) are evaluated once
MAX_TOPICS_CACHED = 1024  # per agent: topics whose listens_to answer is kept


@dataclass
class AgentRuntime:
    """One loaded agent and the live objects that serve it."""

    agent: Agent
    sub: Subscription
    scheduler: WakeScheduler
    state: StateCache
    paused: bool = False
    removed: bool = False  # taken out of the workspace: its queued wakes go too
    last_outputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    recent: OrderedDict[str, None] = field(default_factory=OrderedDict)
    # Intents a stop cut short, by event id: acted on when their event comes again.
    cut: dict[str, list[CutIntent]] = field(default_factory=dict)
    # Hooks whose pause is already persisted (a pause is written once, when it starts).
    paused_hooks: set[str] = field(default_factory=set)
    # Why the agent is behind ("" = it is not): over its CPU budget, or events on disk.
    lagging: str = ""
    over_budget: str = ""
    # Event time: the agent's state cache run ahead, for the market state of events
    # evaluated before their turn (``state`` itself never holds an event before its
    # turn: a wake's context, the tools, everything else reads the past only). When
    # nothing but the hooks reads the state (agents not run), both are one cache: the
    # hooks get an event's market state from its lookahead entry, or, for an event
    # not taken ahead, from this cache when the event is applied to it (queued events
    # are taken ahead in order, so none after it is in yet; later ones may be by the
    # time its hooks run, so its market state is taken then).
    ahead_state: StateCache | None = None
    # Queued events evaluated ahead of their turn (event time), by event id: each is
    # already in ``ahead_state`` (applied in order, right after the events before it).
    ahead: dict[str, Lookahead] = field(default_factory=dict)
    tasks: anyio.abc.TaskGroup | None = None  # while served: runs lookahead requests
    prefetch: anyio.Event | None = None  # set when the lookahead request in flight ends
    pacing: Pacing = field(default_factory=Pacing)
    # listens_to's answers for the topics of ``_topics`` (the patterns they came from)
    _topics: object = None
    _listens: dict[str, bool] = field(default_factory=dict)
    # Held while an event is handled: reconciliation acts between events, never
    # on a signal whose hooks are still deciding. asyncio's own lock: taken once per
    # event, almost always free, where it costs a quarter of anyio's (which asks the
    # loop for the current task on every acquire and release).
    busy: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def agent_id(self) -> str:
        return self.agent.agent_id

    def market(self, cache: StateCache, event: FeedEvent) -> dict[str, Any]:
        """The market part of the hooks' state for ``event``, from ``cache`` (its own
        or the lookahead one) as it is now: ``state_candles`` per series, encoded."""
        return market_state(cache, event, self.agent.config.state_candles, encoded=True)

    def listens_to(self, topic: str) -> bool:
        """Whether the agent's hooks evaluate this topic (not just its state)."""
        patterns = self.agent.config.topics
        if self._topics is not patterns:  # a new agent.toml (hot reload)
            self._topics, self._listens = patterns, {}
        hit = self._listens.get(topic)
        if hit is None:
            hit = any(topic_matches(p, topic) for p in patterns)
            if len(self._listens) < MAX_TOPICS_CACHED:
                self._listens[topic] = hit
        return hit


def market_state(
    cache: StateCache, event: FeedEvent, candles: int, *, encoded: bool = False
) -> dict[str, Any]:
    """The market part of a hook's state for ``event``: the event's symbol (every
    symbol for an event without one), ``candles`` per series (``state_candles``);
    ``encoded``: candles as msgpack, for a sandbox request only."""
    symbols = [event.symbol] if event.symbol else None
    return cache.export(symbols, candles=candles, encoded=encoded)


@dataclass
class Dispatcher:
    """Evaluates hooks for bus events and routes their decisions."""

    pool: WorkerPool
    store: HookStore
    audit: AuditSink
    desk: TradeDesk
    alerts: AlertNotifier
    route: MarketRoutes
    checkpoints: Checkpoints
    # Event time: queued events evaluated ahead in one sandbox request (0 = off).
    lookahead: int = 0
    evaluations: int = 0
    # Lookahead results used, and those that did not hold (evaluated again).
    ahead_used: int = 0
    ahead_missed: int = 0
    suppressed: int = 0
    # Events whose handling raised (not hook failures: those are in ``health``).
    failures: int = 0
    health: HealthTracker = field(default_factory=HealthTracker)
    # Live only: each agent's share of hook time (None: no budget, e.g. event time).
    cpu: CpuBudget | None = None
    # Hands the audit rows queued so far to the OS (AuditWriter.write_ahead); None
    # for a scratch state dir, which no restart reads.
    write_ahead: Callable[[], None] | None = None
    # (agent, signal event id) of copied orders already alerted as refused
    _refused: OrderedDict[tuple[str, str], None] = field(default_factory=OrderedDict)
    # The hook store's failure while it lasts: decisions that would act are suppressed
    # ("store"); logged when it starts and when it ends.
    store_outage: Outage = field(
        default_factory=lambda: Outage(
            log,
            "hook store failing: decisions that would act are suppressed (store)",
            "hook store works again",
        )
    )

    @property
    def cuts(self) -> CutIntents:
        """The intents a stop cut short, settled through this dispatcher's desk."""
        return CutIntents(self.desk)

    # -- the per-agent loop ----------------------------------------------------

    async def serve_agent(self, rt: AgentRuntime) -> None:
        """Consume the agent's subscription in order until it ends.

        One event can never take the agent down: an unexpected error while
        handling it is logged with the event id and counted, and the next
        event is served.
        """
        async with anyio.create_task_group() as tasks:
            rt.tasks = tasks  # for lookahead requests (event time)
            async for event in rt.sub:
                try:
                    async with rt.busy:
                        await self.handle(rt, event)
                    self._note_lag(rt)
                except Exception:
                    # ``event`` is structlog's own first argument: never pass it as a key.
                    self.failures += 1
                    log.exception(
                        "event handling failed", agent=rt.agent_id, event_id=event.event_id
                    )
                finally:
                    self.route.done(rt.agent_id, event)
                    self.checkpoints.finished(rt.agent_id, event)
            rt.tasks = None
            tasks.cancel_scope.cancel()  # a lookahead still in flight: nobody needs it

    @staticmethod
    def lag_reason(rt: AgentRuntime) -> str:
        """Why the agent is behind right now ("" when it is not): over its CPU budget,
        events waiting in its backlog on disk, or its queue at least half full (with
        no backlog, the feed waits for it once the queue is full)."""
        backlog = rt.sub.backlog
        if rt.over_budget or backlog:
            return rt.over_budget or f"{backlog} events waiting on disk"
        queued, capacity = rt.sub.depth, rt.sub.capacity
        return f"{queued} events queued (of {capacity})" if queued * 2 >= capacity > 1 else ""

    def _note_lag(self, rt: AgentRuntime) -> None:
        """Keep ``rt.lagging`` current; log once when the agent falls behind, once
        when it has caught up."""
        why = self.lag_reason(rt)
        if why and not rt.lagging:
            log.warning("agent lagging", agent=rt.agent_id, why=why)
        elif rt.lagging and not why:
            log.info("agent caught up", agent=rt.agent_id)
        rt.lagging = why

    async def _within_budget(self, rt: AgentRuntime) -> None:
        """Live: wait until the agent's hook time is back within its CPU budget."""
        if self.cpu is None:
            return
        delay = self.cpu.delay(rt.agent_id)
        if delay <= 0:
            rt.over_budget = ""
            return
        spent = self.cpu.spent(rt.agent_id) / 1000
        budget = self.cpu.budget_ms / 1000
        rt.over_budget = (
            f"over its CPU budget ({spent:.1f} s of hook time in {self.cpu.window:g} s, "
            f"budget {budget:.1f} s): waits {delay:.1f} s"
        )
        self._note_lag(rt)
        await anyio.sleep(delay)

    def _fresh(self, rt: AgentRuntime, event: FeedEvent) -> bool:
        if event.event_id in rt.recent:
            return False
        rt.recent[event.event_id] = None
        if len(rt.recent) > RECENT_EVENTS:
            rt.recent.popitem(last=False)
        return True

    def _wants(self, rt: AgentRuntime, event: FeedEvent) -> bool:
        symbols = rt.agent.config.symbols
        return not symbols or event.symbol is None or event.symbol in symbols

    async def handle(self, rt: AgentRuntime, event: FeedEvent) -> list[HookResult]:
        """Evaluate every hook of ``rt`` on ``event`` and act on the decisions."""
        early = rt.ahead.pop(event.event_id, None)
        market = early.market if early is not None else None
        if early is None and rt.ahead_state is not None:
            # In order, before anything awaits (a lookahead request may start then).
            rt.ahead_state.apply(event)
            if rt.state is rt.ahead_state:  # one cache: it may move on while we await
                market = rt.market(rt.state, event)
        # The marks first: a re-delivered event they cover must not take a place in
        # the bounded ``recent`` window, which holds the evaluations the marks lag.
        if self.checkpoints.done_before(rt.agent_id, event) or not self._fresh(rt, event):
            # Re-delivered (a restart): the state cache takes what it lacks (it ignores
            # what it holds); the hooks never see an event twice.
            if rt.state is not rt.ahead_state:
                rt.state.apply(event)
            self.checkpoints.skipped += 1
            if rt.cut:
                await self._redo_cut(rt, event)
            return []
        now = await self._event_time(rt, event)
        if rt.state is not rt.ahead_state:
            rt.state.apply(event)
        # Risk checks and fills see the market up to this event (lockstep: exactly).
        await self.route.caught_up(rt.agent_id, event)
        if not rt.agent.hooks or not rt.listens_to(event.topic) or not self._wants(rt, event):
            return []
        hooks = list(rt.agent.hooks.values())
        await self._within_budget(rt)
        if early is not None and early.results is None and rt.prefetch is not None:
            await rt.prefetch.wait()  # this event may be in the request in flight
        rt.pacing.step()
        if early is not None and early.results is not None:
            paused = self.pool.paused(rt.agent_id, hooks)
            if early.holds(hooks, self._account(rt), rt.last_outputs, paused):
                results = early.results
                self.ahead_used += 1
                rt.pacing.held(self.lookahead)
                self.pool.record(rt.agent_id, results, now)
            else:  # what the rest assumed is likely off too: evaluate it in its turn
                self.ahead_missed += 1
                rt.pacing.missed()
                for entry in rt.ahead.values():
                    entry.results = None
                early.results = None
        if early is None or early.results is None:
            results = await self._evaluate(rt, event, hooks, now, market)
        if self.cpu is not None:
            self.cpu.record(rt.agent_id, sum(r.runtime_ms for r in results))
        self.evaluations += len(results)
        trace = event.trace_id or trace_id_for(event.event_id)
        # Every hook row of the event is queued before any action awaits, so the rows
        # reach the audit log together: after a crash the audit tail never shows an
        # event with some of its hooks evaluated and others not (see checkpoints).
        n = len(results)
        actions = [self._settle(rt, event, trace, result, n) for result in results]
        if self.write_ahead is not None and any(_acts(r) for r in results):
            if not marked(event):
                # A signal is evaluated again after a crash took its rows (known by
                # event id) and its copy is idempotent by that id: the order is
                # recorded first, so a kill before the rows are written never loses it.
                trades = [r.ok and isinstance(r.decision, Trade) for r in results]
                for i, act in enumerate(actions):
                    if act is not None and trades[i]:
                        actions[i] = None
                        await act()
            # A restart knows an evaluated event by its rows in the log: they reach
            # the OS before its wake can start, its alert go out or (a market event)
            # its order be recorded (no await since the decisions), so a kill -9 does
            # not have it evaluated again, against a state that later events have
            # moved on (their fills, their cooldowns), nor wake or alert twice.
            self.write_ahead()
        acted = False
        for act in actions:
            if act is not None:
                await act()
                acted = True
        if acted and self.write_ahead is not None:
            self.write_ahead()  # and the rows the actions wrote (risk, order placed, filled)
        self._prefetch_soon(rt, hooks, now)
        return results

    async def _evaluate(
        self,
        rt: AgentRuntime,
        event: FeedEvent,
        hooks: list[HookSpec],
        now: float | None,
        market: dict[str, Any] | None,
    ) -> list[HookResult]:
        """One sandbox request: ``event`` (``market``: its market state, when taken
        earlier), and on event time the queued events after it."""
        state = self.build_state(rt, event, market)
        looks = now is not None and rt.pacing.on
        ahead = [*itertools.islice(self._queued(rt), self.lookahead)] if looks else []
        for _, entry in ahead:
            entry.results = None  # replaced by this request's
        # The account as the state just built shows it (nothing awaited since).
        seen = {"positions": state["positions"], "orders": state["orders"]}
        entries, steps, candles = self._steps(rt, ahead, seen, hooks)
        try:
            if not steps:
                return await self.pool.evaluate(rt.agent_id, hooks, to_dict(event), state, now)
            assumed = self._account(rt)  # what the steps were sent with
            results, later = await self.pool.evaluate_ahead(
                rt.agent_id, hooks, to_dict(event), state, now, steps, candles
            )
        except HookRequestTooLarge as exc:
            return [_oversized(h, exc, rt.last_outputs) for h in hooks]
        except HookRequestUnsendable as exc:
            return [_refused(h, "unsendable", str(exc)) for h in hooks]
        if stood_paused(results) is not None:  # else the steps assumed the wrong history
            outputs = dict(state[LAST_OUTPUTS])
            carry(outputs, results)
            keep(entries, later, hooks, assumed, outputs)
        return results

    def _steps(
        self,
        rt: AgentRuntime,
        run: list[tuple[FeedEvent, Lookahead]],
        seen: dict[str, Any],
        hooks: list[HookSpec],
    ) -> tuple[list[Lookahead], list[Step], list[msgspec.Raw]]:
        """``run`` as lookahead steps, and the candles they list (each once: a step's
        series are indices into them). Only as far as each step's own request would
        surely fit ``max_frame_bytes`` with whatever lastOutputs its turn brings (each
        hook's result is capped): a result never stands for an event whose real
        request would have been refused as oversized."""
        if not run:
            return [], [], []
        cfg = self.pool.config
        grows = len(hooks) * (2 * cfg.max_result_bytes + 1024)
        room = cfg.max_frame_bytes - len(encode_state(rt.last_outputs)) - grows - 4096
        entries, steps = [], []
        table: list[msgspec.Raw] = []
        where: dict[int, int] = {}  # id of a candle's msgpack (shared by the steps) -> index

        def index(candle: msgspec.Raw) -> int:
            i = where.get(id(candle))
            if i is None:
                i = where[id(candle)] = len(table)
                table.append(candle)
            return i

        # Per series, the previous step's window, its indices and its bytes: the next
        # window is mostly the same one moved by a candle (compared in C, not per candle).
        last: dict[tuple[str, str], tuple[list[msgspec.Raw], list[int], int]] = {}
        for e, entry in run:
            refs: dict[str, dict[str, list[int]]] = {}
            size = 0  # the candles' bytes, as the step's own request would carry them
            for symbol, frames in entry.market["candles"].items():
                by_tf: dict[str, list[int]] = {}
                refs[symbol] = by_tf
                for tf, window in frames.items():
                    ids, n = _moved(last.get((symbol, tf)), window, index)
                    by_tf[tf] = ids
                    last[symbol, tf] = (window, ids, n)
                    size += n
            event, state = to_dict(e), encode_state(entry.market | seen | {"candles": refs})
            try:
                encoded = len(msgspec.msgpack.encode(event))
            except (OverflowError, TypeError, ValueError):
                break  # unsendable (an integer beyond 64 bits): refused in its own turn
            if len(state) + size + encoded > room:
                break
            entries.append(entry)
            steps.append(Step(event, state))
        return entries, steps, table

    def _queued(self, rt: AgentRuntime, peek: int = 0) -> Iterator[tuple[FeedEvent, Lookahead]]:
        """The run of queued events after the current one that its hooks will evaluate
        next (fresh, listened to, with a time), each applied to the lookahead state
        cache as the run reaches it (in order; once), with its lookahead entry."""
        ahead_state = rt.ahead_state
        if not self.lookahead or ahead_state is None:
            return
        if rt.listens_to(COPYTRADE_SIGNALS + "opened"):
            return  # the copy-trade view is not split into what a hook read
        if not rt.sub.ordered:
            return  # a queued tick could still be replaced
        seen: set[str] = set()
        for e in rt.sub.peek(peek or self.lookahead):
            entry = rt.ahead.get(e.event_id)
            if e.event_id in seen or not rt.listens_to(e.topic) or not self._wants(rt, e):
                return
            # An event taken ahead passed the rest when it was (it is still queued: not
            # evaluated yet, and no later event of its partition can be finished).
            if entry is None and (
                e.event_id in rt.recent
                or self.checkpoints.done_before(rt.agent_id, e)
                or not _timed(e)
            ):
                return
            seen.add(e.event_id)
            if entry is None:
                ahead_state.apply(e)
                entry = rt.ahead[e.event_id] = Lookahead(rt.market(ahead_state, e))
            yield e, entry

    def _account(self, rt: AgentRuntime) -> Portfolio:
        """The agent's account as the broker holds it now."""
        broker, account = self.desk.broker, self.desk.account_of(rt.agent_id)
        return broker.positions(account), broker.open_orders(account)

    def _portfolio(self, rt: AgentRuntime) -> tuple[dict[str, Any], Portfolio]:
        """The agent's account now: as hooks see it, and as the broker holds it."""
        positions, orders = held = self._account(rt)
        seen = {"positions": msgspec.to_builtins(positions), "orders": msgspec.to_builtins(orders)}
        return seen, held

    def _prefetch_soon(self, rt: AgentRuntime, hooks: list[HookSpec], now: float | None) -> None:
        """On event time, keep the agent's worker busy with the events queued next while
        this task handles the ones already evaluated (one request in flight at most)."""
        if now is None or not self.lookahead or rt.tasks is None or rt.prefetch is not None:
            return
        if not rt.pacing.on:
            return
        held = sum(1 for entry in rt.ahead.values() if entry.results is not None)
        if held >= self.lookahead:
            return  # enough evaluated: no request (and no task) this time
        rt.prefetch = anyio.Event()
        rt.tasks.start_soon(self._prefetch, rt, hooks, now)

    async def _prefetch(self, rt: AgentRuntime, hooks: list[HookSpec], now: float) -> None:
        """Evaluate the next ``lookahead`` queued events that have no results yet, unless
        as many are already evaluated; their ``lastOutputs`` are what the results
        before them would make of the agent's."""
        try:
            outputs, held = dict(rt.last_outputs), 0
            todo: list[tuple[FeedEvent, Lookahead]] = []
            for e, entry in self._queued(rt, 3 * self.lookahead):
                if entry.results is not None and not todo:
                    held += 1
                    if held >= self.lookahead:
                        return
                    carry(outputs, entry.results)
                    continue
                todo.append((e, entry))
                if len(todo) == self.lookahead:
                    break
            if not todo:
                return
            seen, portfolio = self._portfolio(rt)
            entries, steps, candles = self._steps(rt, todo, seen, hooks)
            if not steps:
                return
            state = entries[0].market | seen | {LAST_OUTPUTS: dict(outputs)}
            first = steps[0].event
            got = await self.pool.speculate(
                rt.agent_id, hooks, first, state, now, steps[1:], candles
            )
            keep(entries, got, hooks, portfolio, outputs)
        except Exception as exc:  # noqa: BLE001 - each event is still evaluated in its turn
            log.debug("lookahead request failed", agent=rt.agent_id, error=repr(exc))
        finally:
            done, rt.prefetch = rt.prefetch, None
            if done is not None:
                done.set()

    async def _event_time(self, rt: AgentRuntime, event: FeedEvent) -> float | None:
        """On event time: advance the agent's clock to ``event`` (runs due by then start
        first) and return it, in seconds, for hook backoff; live: None (wall clock)."""
        if not isinstance(rt.scheduler.clock, EventClock):
            return None
        try:
            t = parse_iso_ms(event.ts) / 1000
        except ValueError:
            return rt.scheduler.clock.now()
        await rt.scheduler.advance_to(t)
        return rt.scheduler.clock.now()

    def build_state(
        self, rt: AgentRuntime, event: FeedEvent, market: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """The hooks' read-only view: candles, indicators, ticks, portfolio, last outputs
        (``market``: the market part, when it was taken earlier)."""
        if market is None:
            market = rt.market(rt.state, event)
        state = market | self._portfolio(rt)[0]
        state[LAST_OUTPUTS] = dict(rt.last_outputs)
        if rt.listens_to(COPYTRADE_SIGNALS + "opened"):
            account = self.desk.account_of(rt.agent_id)
            state["copytrade"] = self._copytrade_view(rt, account, event)
        return state

    def _copytrade_view(self, rt: AgentRuntime, account: str, event: FeedEvent) -> dict[str, Any]:
        """The leaders' book as this follower sees it (docs/copytrade.md): each
        position with its target and what was mirrored of it; ``position``: the one
        this signal is about (open, or just closed by it)."""
        signal = signal_of(event.payload)
        return follower_view(
            rt.agent_id,
            account,
            rt.agent.config.copytrade,
            rt.state.copytrade,
            self.desk.broker,
            (signal.leader, signal.position_id) if signal else None,
        )

    async def _copy(
        self, trade: Callable[[], Awaitable[TradeOutcome]], about: dict[str, Any]
    ) -> TradeOutcome:
        """Place a copied order; an ALERT when the follower's risk engine refuses it."""
        outcome = await trade()
        verdict = outcome.verdict
        refused = (about["agent_id"], about["event_id"])
        if verdict is not None and not verdict.approved and refused not in self._refused:
            self._refused[refused] = None  # one alert per signal, however many hooks ask
            if len(self._refused) > RECENT_EVENTS:
                self._refused.popitem(last=False)
            codes = ", ".join(reason.code for reason in verdict.reasons)
            about["reason"] = f"copy refused ({codes}): {about['reason']}"
            await self.alerts.send(Alert(**about))
        return outcome

    # -- settling one result -----------------------------------------------------

    def _settle(
        self, rt: AgentRuntime, event: FeedEvent, trace: str, r: HookResult, n: int
    ) -> Callable[[], Awaitable[object]] | None:
        """Record one of the event's ``n`` results (audit row, dedupe, cooldown, wake
        submission) and return the action it still needs (an alert to send, an
        intent to trade), if any."""
        self.health.record(rt.agent_id, r.hook_id, r.error_kind, r.error)
        if not r.ok or r.decision is None:
            self._audit_hook(rt, event, trace, r, n, error=f"{r.error_kind}: {r.error}")
            if r.error_kind == "paused":
                self._persist_pause(rt, r)
            return None
        d = r.decision
        rt.last_outputs[r.hook_id] = to_builtins(d)  # as lookahead.carry does
        if isinstance(d, Ignore):
            self._audit_hook(rt, event, trace, r, n)
            return None
        blocked = self._blocked(rt, event, r.hook_id, d)
        if blocked != "none":
            self.suppressed += 1
            self._audit_hook(rt, event, trace, r, n, suppressed_by=blocked)
            return None
        match d:
            case Wake():
                decided_at = now_ts()  # the hook's row is stamped before the scheduler's
                request = WakeRequest(**self._about(rt, event, trace, r.hook_id, d))
                outcome = rt.scheduler.submit(request)
                by = outcome.suppressed_by
                self._audit_hook(rt, event, trace, r, n, suppressed_by=by, ts=decided_at)
                return None
            case AlertDecision():
                self._audit_hook(rt, event, trace, r, n)
                alert = Alert(**self._about(rt, event, trace, r.hook_id, d))
                return partial(self.alerts.send, alert)
            case Trade():
                self._audit_hook(rt, event, trace, r, n)
                return self._trade(rt, event, trace, r.hook_id, d)
        return None

    def _trade(
        self, rt: AgentRuntime, event: FeedEvent, trace: str, hook_id: str, d: Trade
    ) -> Callable[[], Awaitable[TradeOutcome]]:
        """The action of an acted TRADE_INTENT: its intent through the agent's desk."""
        trade = partial(
            self.desk.handle,
            d.intent,
            agent_id=rt.agent_id,
            dedupe_key=trade_key(d, hook_id, event.event_id, event.topic),
            trace_id=trace,
            hook_id=hook_id,
            event_id=event.event_id,
        )
        if not event.topic.startswith(COPYTRADE_SIGNALS):
            return trade
        # A refused copy is an alert: the follower no longer mirrors its leader.
        about = self._about(rt, event, trace, hook_id, d)
        return partial(self._copy, trade, about)

    def hold_cut(
        self,
        rt: AgentRuntime,
        cut: list[CutIntent],
        unplaced: list[Unplaced],
        replayed: bool,
        checked: set[str],
    ) -> list[Alert]:
        """At an agent's start: keep the intents the last stop cut short for their
        event, or settle them now (see :meth:`CutIntents.hold`); the alerts to raise."""
        return self.cuts.hold(rt.agent_id, rt.cut, cut, unplaced, replayed, checked)

    async def _redo_cut(self, rt: AgentRuntime, event: FeedEvent) -> None:
        """The intents of ``event`` that a stop cut short (its rows written, no risk
        row; see :func:`recent_evaluations`), acted on now that ``event`` is here
        again: on the market as of ``event``, as they would have been. The desk
        knows an order the kill let through by its client order id."""
        cut = rt.cut.pop(event.event_id, None)
        if not cut:
            return
        await self._event_time(rt, event)
        await self.route.caught_up(rt.agent_id, event)
        for c in cut:
            d = cut_trade(rt.agent_id, c)
            if d is None:
                continue
            trace = c.trace_id or event.trace_id or trace_id_for(event.event_id)
            outcome = await self._trade(rt, event, trace, c.hook_id, d)()
            about = {"agent": rt.agent_id, "hook": c.hook_id, "event_id": event.event_id}
            if outcome.duplicate:  # the kill came after the order was recorded
                key = trade_key(d, c.hook_id, event.event_id, event.topic)
                rows = self.cuts.restore_rows(rt.agent_id, c, d, key, trace)
                log.info(
                    "trade intent cut short by the stop: its order was placed", rows=rows, **about
                )
            else:
                log.warning("trade intent cut short by the stop: acted on now", **about)

    def _blocked(self, rt: AgentRuntime, event: FeedEvent, hook: str, d: Decision) -> str:
        """dedupe / cooldown / paused / store, or ``none``; records the key and cooldown
        if acting. A store that cannot record them (disk full) acts on nothing: an
        intent acted on without its key could be placed again after a restart."""
        if rt.paused:
            return "paused"
        try:
            blocked = self._dedupe_and_cooldown(rt, event, hook, d)
        except StoreError as exc:
            self.store_outage.failed(str(exc), agent=rt.agent_id)
            return "store"
        if blocked == "none" and (d.dedupe_key is not None or bool(d.cooldown_seconds)):
            self.store_outage.worked(agent=rt.agent_id)  # (it wrote: reads work on a full disk)
        return blocked

    def _dedupe_and_cooldown(
        self, rt: AgentRuntime, event: FeedEvent, hook: str, d: Decision
    ) -> str:
        event_ms = parse_iso_ms(event.ts)
        scope = event.symbol or "*"
        key = d.dedupe_key
        # The key and the cooldown a decision on a market event holds stay its own: if
        # a crash has the event evaluated again (its audit rows lost, the mark not
        # saved), they do not suppress it (the wake, the order are idempotent from
        # here). Other events (signals) are recognised by event id only, not so far
        # back: a key there stays a key. A replay started over disowns every key.
        marked_event = marked(event)
        owner = f"{hook} {event.event_id}" if marked_event else ""
        started_by = event.event_id if marked_event else ""
        # Dedupe is the reason when both hold; a key is marked only when acting. The
        # cooldown is known in memory, so acting costs one statement for the key.
        if self.store.cooling(rt.agent_id, hook, scope, event_ms, started_by):
            seen = key is not None and self.store.seen(rt.agent_id, key, owner)
            return "dedupe" if seen else "cooldown"
        if key is not None and not self.store.claim(rt.agent_id, key, event_ms, owner):
            return "dedupe"
        cooldown = d.cooldown_seconds
        if cooldown:
            until = event_ms + int(min(cooldown, MAX_COOLDOWN_SECONDS) * 1000)
            self.store.start_cooldown(rt.agent_id, hook, scope, until, started_by)
        return "none"

    def _persist_pause(self, rt: AgentRuntime, r: HookResult) -> None:
        if r.hook_id in rt.paused_hooks:
            return
        rt.paused_hooks.add(r.hook_id)
        self._keep_pause(rt, r.hook_id, r.error or "paused")  # logged by self.health
        limit = rt.agent.config.pause_agent_after_paused_hooks
        if limit and len(rt.paused_hooks) >= limit and not rt.paused:
            self.pause_agent(rt, f"{len(rt.paused_hooks)} hooks paused")

    def pause_agent(self, rt: AgentRuntime, reason: str) -> None:
        """Stop acting for this agent (hooks still evaluate and are audited)."""
        rt.paused = True
        rt.scheduler.set_paused(True)
        self._keep_pause(rt, AGENT_WIDE, reason)
        log.warning("agent paused", agent=rt.agent_id, reason=reason)

    def _keep_pause(self, rt: AgentRuntime, hook: str, reason: str) -> None:
        """Persist a pause; one the store cannot keep holds until the daemon stops."""
        try:
            self.store.pause(rt.agent_id, hook, reason)
        except StoreError as exc:
            log.error(
                "pause not saved: it holds until the daemon stops",
                agent=rt.agent_id,
                hook=hook,
                error=str(exc),
            )

    def resume_agent(self, rt: AgentRuntime) -> None:
        """Act again for this agent."""
        rt.paused = False
        rt.scheduler.set_paused(False)
        log.info("agent resumed", agent=rt.agent_id)

    # -- actions -------------------------------------------------------------------

    @staticmethod
    def _about(
        rt: AgentRuntime, event: FeedEvent, trace: str, hook: str, d: Decision
    ) -> dict[str, Any]:
        """Who decided what about which event: the fields of a wake request and an alert."""
        return {
            "agent_id": rt.agent_id,
            "hook_id": hook,
            "reason": d.reason,
            "event_id": event.event_id,
            "trace_id": trace,
            "symbol": event.symbol,
            "topic": event.topic,
            "ts": event.ts,
        }

    def _audit_hook(
        self,
        rt: AgentRuntime,
        event: FeedEvent,
        trace: str,
        r: HookResult,
        n: int,
        *,
        suppressed_by: str = "none",
        error: str | None = None,
        ts: str | None = None,
    ) -> None:
        d = r.decision
        self.audit.write(
            HookRecord(
                ts=ts or now_ts(),
                agent_id=rt.agent_id,
                trace_id=trace,
                hook_id=r.hook_id,
                revision=r.revision,
                kind=r.kind,
                event_id=event.event_id,
                topic=event.topic,
                symbol=event.symbol,
                event_ts=event.ts,
                decision=d.name if d else None,
                reason=d.reason if d else "",
                dedupe_key=d.dedupe_key if d else None,
                suppressed_by=suppressed_by,  # type: ignore[arg-type]
                runtime_ms=round(r.runtime_ms, 3),
                error=error,
                output=_full_output(d),
                event_hooks=n,
            )
        )


def _moved(
    prev: tuple[list[msgspec.Raw], list[int], int] | None,
    window: list[msgspec.Raw],
    index: Callable[[msgspec.Raw], int],
) -> tuple[list[int], int]:
    """A lookahead step's candle indices and bytes for ``window``: from the previous
    step's (``prev``) when the window is that one unchanged, grown by a candle or
    moved by one; else candle by candle."""
    if prev is not None:
        before, ids, size = prev
        if window == before:
            return ids, size
        if window[:-1] == before[1:] and len(window) == len(before):
            return [*ids[1:], index(window[-1])], size - len(before[0]) + len(window[-1])
        if window[:-1] == before:
            return [*ids, index(window[-1])], size + len(window[-1])
    return [index(c) for c in window], sum(map(len, window))


def _acts(r: HookResult) -> bool:
    """A decision that may act (wake, alert, trade), unless dedupe or a cooldown stops it."""
    return r.decision is not None and not isinstance(r.decision, Ignore)


def _timed(event: FeedEvent) -> bool:
    try:
        parse_iso_ms(event.ts)
    except ValueError:
        return False
    return True


def _full_output(d: Decision | None) -> dict[str, Any] | None:
    """The decision's lastOutputs entry, when the row's own fields do not rebuild it."""
    if d is None or (d.data is None and d.cooldown_seconds is None and not isinstance(d, Trade)):
        return None
    return to_builtins(d)


def _refused(h: HookSpec, kind: ErrorKind, msg: str) -> HookResult:
    """An error result for a request the sandbox was never sent."""
    return HookResult(
        hook_id=h.hook_id, kind=h.kind, revision=h.revision, runtime_ms=0.0,
        error_kind=kind, error=msg,
    )  # fmt: skip


def _oversized(h: HookSpec, exc: HookRequestTooLarge, outputs: dict[str, Any]) -> HookResult:
    """An error result naming what made the request too big, and what to change."""
    sizes = sorted(((len(msgspec.json.encode(v)), k) for k, v in outputs.items()), reverse=True)
    held = sum(n for n, _ in sizes)
    biggest = ", ".join(f"{k} {n} B" for n, k in sizes[:3]) or "none"
    msg = (
        f"{exc}: state.lastOutputs holds {held} bytes (largest: {biggest}); "
        "return smaller `data` from hooks, lower state_candles, "
        "or raise [hooks.sandbox] max_frame_bytes"
    )
    return _refused(h, "oversized", msg)
