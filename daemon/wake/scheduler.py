"""WakeScheduler: one per agent; decides what each WAKE turns into.

``submit()`` returns at once with the decision, and the scheduler's own task
(:meth:`WakeScheduler.run`) starts runs one at a time. The rules, in order:

* **paused**: an agent that is paused wakes for nothing (``suppressedBy=paused``).
* **collect mode**: a wake joins the pending run if there is one (``queued``);
  the first wake of an idle agent opens a pending run that starts after
  ``debounce_seconds``; a wake during an in-flight run opens the one follow-up
  run that every later wake joins. A run keeps the newest ``max_collected``
  wakes in detail and summarizes older ones in one line.
* **immediate mode**: every wake becomes its own run; runs go one after another.
* **cooldown**: after a wake run ends, a wake that would start a *new* run on
  an idle agent within ``cooldown_after_run_seconds`` is suppressed. Runs that
  were already pending wait for the cooldown to end instead.
* **cost**: once the agent's LLM runs have spent ``max_cost_per_day`` since
  00:00 UTC (of its clock), wakes that need a new run and pending runs are
  suppressed (``suppressedBy=cost``) until the day turns; audit runs too.
* **budget**: at most ``max_runs_per_hour`` wake runs start in any hour
  (sliding window, pending runs count as promised); a wake that would need one
  more run is suppressed (``suppressedBy=budget``). Joining a pending run is free.
  A re-run of a run a stop cut takes that run's place (still in the window) and
  starts without that run's cooldown: it is the run redone, so a stop changes no
  later wake's verdict.
* **audit runs** fill silence: when ``audit_interval_seconds`` pass without any
  run starting, an audit run starts. They are bounded by construction (at most
  one per interval), so they neither use the hourly budget nor the cooldown,
  and any run resets their timer; a paused agent skips them (recorded).

**Time.** Live, the scheduler's own task (:meth:`WakeScheduler.run`) sleeps
on the wall clock. On event time (replays, backtests) it has no task of its
own: the agent's loop calls :meth:`WakeScheduler.advance_to` with each event's
time before the event is evaluated, which starts (inline, in due order, each at
the event time it came due) every run due by then. A run occupies no event
time, so the same replay gives the same runs at any speed. When a finite
replay ends, :meth:`WakeScheduler.drain` runs what is still pending.

Every wake gets exactly one ``wake`` record when submitted (``woke``,
``queued`` or ``suppressed``) and another ``suppressed`` one if its pending run
is later dropped (the agent was paused meanwhile). Each run gets a ``run``
record when it starts and one when it ends. Run starts and ends are persisted
so the budget and cooldown survive a restart. Pending runs are persisted too,
each time one changes: at a stop (or a crash) they stay in the store, and the
next start restores them, so a wake recorded ``queued`` is run after the
restart (its run record lists its event id). Only an agent removed from the
workspace drops its pending runs (``suppressedBy=shutdown``).
"""

from __future__ import annotations

import math
import secrets
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

import anyio
import anyio.abc
import msgspec
import structlog

from daemon.audit.records import AuditRecord, RunRecord, WakeRecord, now_ts
from daemon.clock import Clock, EventClock, SystemClock
from daemon.errors import NOT_JSON, StoreError
from daemon.events import iso_ms
from daemon.wake import leftovers
from daemon.wake.budget import SlidingWindowBudget
from daemon.wake.context import (
    RunKind,
    RunResult,
    SuppressedBy,
    Usage,
    WakeContext,
    WakeOutcome,
    WakeReason,
    WakeRequest,
    summarize_earlier,
)
from daemon.wake.policy import RunnerConfig, WakePolicy
from daemon.wake.runners import CommandRunner, Runner, build_runner, is_spending
from daemon.wake.store import RunStore

log = structlog.get_logger("wake")
RecordSink = Callable[[AuditRecord], None]
StateProvider = Callable[[str], dict[str, Any] | None]
HOUR = 3600.0
AUDIT_HOOK = "audit"
_FINAL: dict[str, Literal["finished", "failed", "timeout"]] = {
    "ok": "finished",
    "failed": "failed",
    "timeout": "timeout",
}


def _utc_day(t: float) -> float:
    """00:00 UTC of the day holding epoch second ``t``."""
    return t - t % 86_400


def _discard(record: AuditRecord) -> None:
    """The default sink: records go nowhere."""


class _Saved(msgspec.Struct, frozen=True, omit_defaults=True):
    """What the store keeps of a pending or started run besides its id and times."""

    wakes: list[WakeRequest]
    earlier: dict[str, int]
    rerun_of: str | None = None  # the run a stop cut that this one runs again


_saved_decoder = msgspec.json.Decoder(_Saved)


@dataclass
class _DayUsage:
    """What the agent's runs used since ``start`` (00:00 UTC), kept in memory."""

    start: float
    runs: int
    cost: float
    tokens_in: int
    tokens_out: int


@dataclass
class _PendingRun:
    run_id: str
    kind: RunKind
    due_at: float
    wakes: deque[WakeRequest] = field(default_factory=deque)
    earlier: Counter[str] = field(default_factory=Counter)
    stored: bool = False  # in the store's pending rows (to be dropped when it starts)
    rerun_of: str | None = None  # runs again the wakes of this run, which a stop cut

    @classmethod
    def of(
        cls,
        run_id: str,
        kind: RunKind,
        due_at: float,
        saved: _Saved | None,
        *,
        stored: bool = False,
        rerun_of: str | None = None,
    ) -> _PendingRun:
        """A run with the wakes the store kept of one (None: none)."""
        if saved is None:
            return cls(run_id, kind, due_at, stored=stored, rerun_of=rerun_of)
        wakes, earlier = deque(saved.wakes), Counter(saved.earlier)
        return cls(run_id, kind, due_at, wakes, earlier, stored=stored, rerun_of=rerun_of)

    def as_saved(self) -> _Saved:
        return _Saved(list(self.wakes), dict(self.earlier), self.rerun_of)

    def saved(self) -> bytes:
        """What the store keeps of it."""
        return msgspec.json.encode(self.as_saved())

    def add(self, wake: WakeRequest, cap: int) -> None:
        """Keep the newest ``cap`` wakes; count older ones by hook."""
        if len(self.wakes) >= cap:
            self.earlier[self.wakes.popleft().hook_id] += 1
        self.wakes.append(wake)

    def event_ids(self) -> list[str]:
        return [w.event_id for w in self.wakes if w.event_id is not None]

    def trace_ids(self) -> list[str]:
        return list(dict.fromkeys(w.trace_id for w in self.wakes if w.trace_id))


class WakeScheduler:
    """Budgets, merges and starts the runs of one agent."""

    def __init__(
        self,
        agent_id: str,
        policy: WakePolicy,
        *,
        store: RunStore,
        runner: Runner | None = None,
        sink: RecordSink = _discard,
        clock: Clock | None = None,
        state: StateProvider | None = None,
        paused: bool = False,
        runner_factory: Callable[[RunnerConfig], Runner] = build_runner,
        write_ahead: Callable[[], None] | None = None,
        fuse: int = 0,
        on_fuse: Callable[[], None] | None = None,
    ) -> None:
        self.agent_id = agent_id
        self.policy = policy
        self.store = store
        self.sink = sink
        # Hands the records sunk so far to the OS (AuditWriter.write_ahead; None: a
        # scratch dir): a run's rows, which a kill would otherwise take from the
        # batch, go out as the run starts and as it ends.
        self.write_ahead = write_ahead
        self.clock: Clock = clock or SystemClock()
        self.state = state
        self.paused = paused
        self._own_runner = runner is None
        self._build = runner_factory
        self.runner: Runner = runner or runner_factory(policy.runner)
        now = self.clock.now()
        starts = store.starts_since(agent_id, now - HOUR)
        self.budget = SlidingWindowBudget(policy.max_runs_per_hour, HOUR, starts)
        self._last_wake_end = store.last_finish(agent_id)
        self._last_start = store.last_start(agent_id) or now
        self._pending: deque[_PendingRun] = deque()
        self._in_flight: _PendingRun | None = None
        self._spent_so_far: Usage = (0.0, 0, 0)  # by the run in flight, as it reported
        self._run_ended = anyio.Event()  # set as the run in flight ends
        self._stopping = False  # the daemon stops: no more runs start
        # Once the first ``fuse`` runs have all failed: start no more, and ``on_fuse``
        # (the replay stops). 0: never.
        self.fuse, self._on_fuse = fuse, on_fuse
        self._ran_well = False  # a run of this scheduler ended ok
        self._changed = anyio.Event()
        self.counters: Counter[str] = Counter()
        self._today: _DayUsage | None = None
        # Runs that ended failed or timed out, since this scheduler started: all, the
        # latest ones in a row, and the last one's error (for status).
        self.runs_failed = 0
        self.runs_failing = 0
        self.last_run_error = ""
        # (event, hook) of each wake in the runs restored from a crashed process: the
        # event may come again (its audit rows lost), and its wake is in that run.
        self._restored: dict[tuple[str, str], str] = {}
        self._restore()

    def _restore(self) -> None:
        """Take back the runs a previous process left pending (in due order)."""
        try:
            rows = self.store.pending(self.agent_id)
        except StoreError as exc:
            log.error("queued runs not restored", agent=self.agent_id, error=str(exc))
            return
        for run_id, due_at, body in rows:
            try:
                saved = _saved_decoder.decode(body)
            except NOT_JSON as exc:  # keep the rest; say what was lost
                log.error(
                    "unreadable queued run dropped", agent=self.agent_id, run=run_id, error=str(exc)
                )
                self._persist(self.store.drop_pending, run_id)
                continue
            run = _PendingRun.of(
                run_id, "wake", due_at, saved, stored=True, rerun_of=saved.rerun_of
            )
            self._pending.append(run)
            self._remember(run)
        if self._pending:
            self.counters["restored"] += len(self._pending)
            log.info("queued runs restored", agent=self.agent_id, runs=len(self._pending))

    def _remember(self, run: _PendingRun) -> None:
        """A run from before a stop holds these wakes: their events, if they come again
        (their audit rows lost to a kill), wake into it, not into a second run."""
        for w in run.wakes:
            if w.event_id is not None:
                self._restored[w.event_id, w.hook_id] = run.run_id

    # --- control (sync, from the dispatcher) ---------------------------------

    def submit(self, wake: WakeRequest) -> WakeOutcome:
        """Decide what a WAKE turns into; never blocks."""
        if wake.agent_id != self.agent_id:
            raise ValueError(f"wake for agent {wake.agent_id!r} sent to {self.agent_id!r}")
        restored = (
            self._restored.pop((wake.event_id, wake.hook_id), None) if wake.event_id else None
        )
        if restored is not None:  # taken before a crash: its run was restored, not again
            outcome = WakeOutcome(outcome="queued", run_id=restored)
        else:
            outcome = self._decide(wake, self.clock.now())
        self._record_wake(wake, outcome)
        self._changed.set()
        return outcome

    def set_paused(self, paused: bool) -> None:
        """Pause or resume waking (pending runs are dropped when they come due)."""
        self.paused = paused
        self._changed.set()

    def update_policy(self, policy: WakePolicy) -> None:
        """Apply an edited policy without losing history (hot reload)."""
        self.policy = policy
        self.budget = self.budget.resized(policy.max_runs_per_hour)
        if self._own_runner:
            self.runner = self._build(policy.runner)
        self._changed.set()

    @property
    def busy(self) -> bool:
        """A run is in flight or pending."""
        return self._in_flight is not None or bool(self._pending)

    def _cooldown_end(self) -> float:
        if self._last_wake_end is None:
            return -math.inf
        return self._last_wake_end + self.policy.cooldown_after_run_seconds

    def _decide(self, wake: WakeRequest, now: float) -> WakeOutcome:
        if self.paused:
            return WakeOutcome(outcome="suppressed", suppressed_by="paused")
        policy = self.policy
        if policy.queue_mode == "collect":
            joinable = [p for p in self._pending if p.kind == "wake"]
            if joinable:
                joinable[-1].add(wake, policy.max_collected)
                self._save(joinable[-1])
                return WakeOutcome(outcome="queued", run_id=joinable[-1].run_id)
        if not self.busy and now < self._cooldown_end():
            return WakeOutcome(outcome="suppressed", suppressed_by="cooldown")
        if self._over_cost_cap(now):
            return WakeOutcome(outcome="suppressed", suppressed_by="cost")
        queued = sum(p.kind == "wake" for p in self._pending)
        promised = sum(self._takes_place(p, now) for p in self._pending)
        if not self.budget.allows(now, promised) or queued >= policy.max_collected:
            return WakeOutcome(outcome="suppressed", suppressed_by="budget")
        debounce = policy.debounce_seconds if policy.queue_mode == "collect" else 0.0
        run = _PendingRun(self._new_run_id(), "wake", now if self.busy else now + debounce)
        run.add(wake, policy.max_collected)
        starts_now = (
            not self.busy and debounce == 0 and now >= self._cooldown_end() and not self._stopping
        )
        self._pending.append(run)
        self._save(run)
        return WakeOutcome(outcome="woke" if starts_now else "queued", run_id=run.run_id)

    def _save(self, run: _PendingRun, *, stopping: bool = False) -> None:
        """Keep ``run`` in the store for a restart: as it queues (or grows) when the
        store is durable, else only at a clean stop."""
        if not (self.store.durable or stopping):
            return
        self._persist(self.store.save_pending, self.agent_id, run.run_id, run.due_at, run.saved())
        run.stored = True

    def _forget(self, run: _PendingRun) -> None:
        if run.stored:
            self._persist(self.store.drop_pending, run.run_id)
            run.stored = False

    def _new_run_id(self) -> str:
        return f"{self.agent_id}-{secrets.token_hex(8)}"  # 64 random bits, as uuid4's first 16

    # --- the loop ------------------------------------------------------------

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Start runs as they come due, forever (cancel to stop)."""
        task_status.started()
        while True:
            await self.step()

    async def advance_to(self, t: float) -> None:
        """Event time: move to ``t``, starting every run due by then at its due time."""
        clock = self.clock
        if not isinstance(clock, EventClock):
            raise TypeError("advance_to needs the scheduler to run on an EventClock")
        if not clock.started:
            self._last_start = t  # audit intervals count from the first event
        while not self._stopping and (due := self._next_due()) is not None and due <= t:
            clock.advance_to(due)
            await self._start(self._pending.popleft() if self._pending else self._audit_run(due))
        clock.advance_to(t)

    async def drain(self) -> int:
        """Event time, at the end of a finite replay: run every pending run, each at
        the event time it comes due (no audit runs). Returns how many were started."""
        clock = self.clock
        if not isinstance(clock, EventClock):
            raise TypeError("drain needs the scheduler to run on an EventClock")
        started = 0
        while self._pending and not self._stopping and (due := self._next_due()) is not None:
            clock.advance_to(due)
            await self._start(self._pending.popleft())
            started += 1
        return started

    def stop_starting(self) -> None:
        """At a stop (live): start no more runs; the queued ones, and the wakes the
        drain still queues, stay queued for the next start (a run begun now would
        likely be cut by the stop's deadline, its tokens spent for nothing)."""
        self._stopping = True
        self._changed.set()

    async def finish_in_flight(self) -> None:
        """At a stop (live): :meth:`stop_starting`, and return once the run in flight,
        if any, has ended. The caller bounds the wait (``[daemon]
        stop_timeout_seconds``): a run still going then is cancelled, as a stop cuts
        it."""
        self.stop_starting()
        run = self._in_flight
        if run is None:
            return
        log.info("waiting for the run in flight to end", agent=self.agent_id, run=run.run_id)
        await self._run_ended.wait()

    async def step(self) -> None:
        """Start the next due run, or wait until something may be due."""
        if self._stopping:
            await anyio.sleep_forever()  # until the stop cancels this task
        self._changed = anyio.Event()
        now = self.clock.now()
        due_at = self._next_due()
        if due_at is not None and due_at <= now:
            await self._start(self._pending.popleft() if self._pending else self._audit_run(now))
            return
        await self._wait(self._changed, math.inf if due_at is None else due_at)

    def _next_due(self) -> float | None:
        if self._pending:  # only wake runs wait in the queue; audit runs start on the spot
            first = self._pending[0]
            if first.rerun_of is not None:
                # The run a stop cut, redone (first in line): the cooldown the store
                # gives is that run's own, which is for the run after it.
                return first.due_at
            return max(first.due_at, self._cooldown_end())
        if self.policy.audit_interval_seconds > 0:
            return self._last_start + self.policy.audit_interval_seconds
        return None

    def _audit_run(self, now: float) -> _PendingRun:
        return _PendingRun(self._new_run_id(), "audit", now)

    async def _wait(self, changed: anyio.Event, deadline: float) -> None:
        async with anyio.create_task_group() as tg:

            async def until_changed() -> None:
                await changed.wait()
                tg.cancel_scope.cancel()

            async def until_deadline() -> None:
                await self.clock.sleep_until(deadline)
                tg.cancel_scope.cancel()

            tg.start_soon(until_changed)
            if deadline < math.inf:
                tg.start_soon(until_deadline)

    async def _start(self, run: _PendingRun) -> None:
        now = self.clock.now()
        blocked = self._blocked(run, now)
        if blocked != "none":
            self._forget(run)
            self._drop(run, blocked, now)
            return
        self._last_start = now
        counted = self._takes_place(run, now)
        if counted:
            self.budget.record(now)
        today = self._day(now)  # loaded before this run's row exists: counted once
        # Started and no longer queued in one transaction: a crash before it leaves the
        # run queued (restored and run once), after it the run counts as started
        # (never paid for twice). One after the other, a crash between lost the run.
        queued, run.stored = run.stored, False
        # Its wakes too (durable: a restart after a kill reads them; see close_interrupted).
        body = run.saved() if self.store.durable and run.kind == "wake" else None
        self._persist(
            self.store.record_start, self.agent_id, run.run_id, run.kind, now, queued, body, counted
        )
        today.runs += 1
        self._in_flight, self._run_ended = run, anyio.Event()
        try:
            await self._execute(run, self._context(run, now))
        finally:
            self._in_flight = None
            self._run_ended.set()

    def _persist(self, write: Callable[..., None], *args: Any) -> None:
        """Write run history; a failing disk costs restart memory, not the agent's runs."""
        try:
            write(*args)
        except StoreError as exc:
            self.counters["store_errors"] += 1
            log.error("wake run history not saved", agent=self.agent_id, error=str(exc))

    def _blocked(self, run: _PendingRun, now: float) -> SuppressedBy:
        if self.paused:
            return "paused"
        if self._over_cost_cap(now):
            return "cost"
        if self._takes_place(run, now) and not self.budget.allows(now):
            return "budget"
        return "none"

    @staticmethod
    def _takes_place(run: _PendingRun, now: float) -> bool:
        """Whether ``run`` needs a place in the hourly budget: a wake run does, unless it
        re-runs a run a stop cut whose start (its due time) is still in the window. That
        run's place is its own: the stop changed nothing of what ran, and with the hour's
        places taken, the wakes it is there to redo would be lost to ``budget``."""
        if run.kind != "wake":
            return False
        return run.rerun_of is None or now - run.due_at >= HOUR

    def _over_cost_cap(self, now: float) -> bool:
        """Whether today's LLM spend (UTC day of the agent's clock) reached the cap."""
        cap = self.policy.max_cost_per_day
        return cap > 0 and self._day(now).cost >= cap

    def _day(self, now: float) -> _DayUsage:
        """Today's usage, from the store when the day (of the agent's clock) changes."""
        start = _utc_day(now)
        if self._today is None or self._today.start != start:
            try:
                runs, cost, tin, tout = self.store.usage_since(self.agent_id, start)
            except StoreError as exc:  # unknown spend: do not block runs on a disk problem
                log.error("usage so far unknown", agent=self.agent_id, error=str(exc))
                runs, cost, tin, tout = 0, 0.0, 0, 0
            self._today = _DayUsage(start, runs, cost, tin, tout)
        return self._today

    def usage_today(self) -> tuple[int, float, int, int]:
        """(runs, cost, tokens in, tokens out) since 00:00 UTC of the agent's clock."""
        d = self._day(self.clock.now())
        return d.runs, d.cost, d.tokens_in, d.tokens_out

    def abandon_pending(self, *, keep: bool) -> int:
        """At a stop: ``keep`` leaves the pending runs in the store for the next start
        (the daemon stops); otherwise (the agent was removed) every wake still waiting
        is recorded as suppressed by ``shutdown``. Returns how many runs."""
        now = self.clock.now()
        runs = list(self._pending)
        self._pending.clear()
        if keep:
            if not self.store.durable:  # (a durable store has them as they are)
                for run in runs:
                    if run.kind == "wake":
                        self._save(run, stopping=True)
            if runs:
                log.info("queued runs kept for the next start", agent=self.agent_id, runs=len(runs))
            return len(runs)
        for run in runs:
            self._forget(run)
            self._drop(run, "shutdown", now)
        return len(runs)

    def _drop(self, run: _PendingRun, by: SuppressedBy, now: float) -> None:
        """A pending run that may not start: record each of its wakes as suppressed."""
        self.counters[f"dropped_{by}"] += 1
        if run.kind == "audit":
            self._last_start = now  # retry one interval later, not in a loop
            self.sink(self._wake_record(None, "suppressed", by, None, AUDIT_HOOK, "audit run"))
            return
        for wake in run.wakes:
            self._record_wake(wake, WakeOutcome(outcome="suppressed", suppressed_by=by), 1)
        earlier = summarize_earlier(run.earlier)
        if earlier is not None:  # the summarized wakes are suppressed too, as one line
            hooks = sorted(run.earlier)
            record = self._wake_record(None, "suppressed", by, run.run_id, hooks[0], earlier)
            dropped = sum(run.earlier.values())
            self.sink(msgspec.structs.replace(record, hook_ids=hooks, dropped=dropped))

    def _context(self, run: _PendingRun, now: float) -> WakeContext:
        return WakeContext(
            agent_id=self.agent_id,
            run_id=run.run_id,
            kind=run.kind,
            triggered_at=iso_ms(int(now * 1000)),
            reasons=[WakeReason.of(w) for w in run.wakes],
            earlier=summarize_earlier(run.earlier),
            earlier_count=sum(run.earlier.values()),
            state=self._snapshot(),
            rerun_of=run.rerun_of,
        )

    def _snapshot(self) -> dict[str, Any] | None:
        if self.state is None:
            return None
        try:
            return self.state(self.agent_id)
        except Exception:  # a broken provider must not stop the run
            log.exception("state snapshot failed", agent=self.agent_id)
            return None

    async def _execute(self, run: _PendingRun, ctx: WakeContext) -> None:
        trace = run.wakes[0].trace_id if run.wakes else None
        self.sink(self._run_record(run, trace))
        if self.write_ahead is not None:
            self.write_ahead()
        self.counters[f"runs_{run.kind}"] += 1
        t0 = time.perf_counter()
        result = RunResult(status="failed", error="cancelled: the scheduler stopped")
        cut = True  # until the runner returns
        self._spent_so_far = (0.0, 0, 0)
        try:
            result = await self._call_runner(ctx)
            cut = False
        finally:
            duration_ms = round((time.perf_counter() - t0) * 1000, 3)
            end = self.clock.now()
            if cut and run.kind == "wake":  # a stop: its wakes may run again at the next start
                _, then = self._rerun(run.run_id, run.as_saved(), self._last_start)
                result = RunResult(status="failed", error=f"{result.error}; {then}")
            if run.kind == "wake":
                self._last_wake_end = end
            llm = result.llm
            # (A run a stop cancelled reports nothing: what it had spent so far stands.)
            usage = (llm.cost, llm.tokens_in, llm.tokens_out) if llm else self._spent_so_far
            self._persist(self.store.record_finish, run.run_id, end, result.status, usage)
            self._note_outcome(result)
            day = self._today
            if day is not None and day.start == _utc_day(self._last_start):
                day.cost += usage[0]
                day.tokens_in += usage[1]
                day.tokens_out += usage[2]
            self.sink(self._run_record(run, trace, duration_ms, result))
            if self.write_ahead is not None:
                self.write_ahead()

    def close_interrupted(self) -> int:
        """At the daemon's start: each run of this agent that a stop cut (started, never
        finished: a kill) ends as ``failed``, in the store (when it started, so the
        cooldown still counts from there) and in the audit log, saying so, with the
        events that woke it. It is not run again (it may have paid already) unless
        the policy says so (:meth:`_rerun`). Returns how many."""
        try:
            cut = self.store.unfinished(self.agent_id)
        except StoreError as exc:
            log.error("runs a stop cut not closed", agent=self.agent_id, error=str(exc))
            return 0
        reruns = []
        for u in cut:
            saved: _Saved | None = None
            if u.body is not None:
                try:
                    saved = _saved_decoder.decode(u.body)
                except NOT_JSON as exc:
                    log.error(
                        "unreadable run record", agent=self.agent_id, run=u.run_id, error=str(exc)
                    )
            # Closed first: a crash before the re-run is queued loses it, never runs it twice.
            # What it had spent stays (record_usage): it counts against max_cost_per_day.
            self._persist(self.store.record_finish, u.run_id, u.started_at, "interrupted", None)
            again, then = (
                self._rerun(u.run_id, saved, u.started_at)
                if u.kind == "wake"
                else (None, "it is not run again")
            )
            if again is not None:
                reruns.append(again.run_id)
            elif u.body is not None and saved is None and u.kind == "wake":
                then = "it is not run again: its wakes, as the store kept them, do not read"
            kind: RunKind = "audit" if u.kind == "audit" else "wake"
            closed = _PendingRun.of(u.run_id, kind, u.started_at, saved)
            error = f"interrupted: the daemon stopped during this run; {then}"
            cost, tokens_in, tokens_out = u.usage
            if tokens_in or tokens_out:
                error += (
                    f"; it had used {tokens_in} tokens in and {tokens_out} out (cost"
                    f" {cost:g}), counted in max_cost_per_day"
                )
                self._today = None  # read again from the store, which has them
            if u.process is not None and leftovers.stop_group(u.process):
                # Started by hand, a program outlives a kill -9 of the daemon (the unit
                # stops the control group): it is stopped before any re-run can start.
                error += f"; its program (pid {u.process.pid}) was still running: killed"
                log.warning(
                    "the program of a run the stop cut was still running: killed",
                    agent=self.agent_id,
                    run=u.run_id,
                    pid=u.process.pid,
                )
            self._note_outcome(RunResult(status="failed", error=error))  # status shows it
            self.sink(
                RunRecord(
                    ts=now_ts(),
                    event_ts=iso_ms(int(u.started_at * 1000)),
                    agent_id=self.agent_id,
                    trace_id=closed.wakes[0].trace_id if closed.wakes else None,
                    run_id=u.run_id,
                    runner=self.runner.name,
                    status="failed",
                    event_ids=closed.event_ids(),
                    trace_ids=closed.trace_ids(),
                    error=error,
                    summary=f"{u.kind} run, {len(closed.wakes)} wake(s), interrupted by a stop",
                )
            )
        if cut:
            if self.write_ahead is not None:  # not left to a batch a kill could take
                self.write_ahead()
            log.warning(
                "runs interrupted by the stop", agent=self.agent_id, runs=len(cut), rerun=reruns
            )
        return len(cut)

    def _rerun(
        self, cut_id: str, saved: _Saved | None, started_at: float
    ) -> tuple[_PendingRun | None, str]:
        """Queue the wakes of a run a stop cut to run once more, first, when the policy
        allows (``rerun_interrupted_within_seconds``; off by default: the cut run may
        have paid for its tokens already). Returns the run queued (None: not) and
        what the cut run's row says of it."""
        within = self.policy.rerun_interrupted_within_seconds
        if within <= 0:
            return None, "it is not run again"
        if saved is None or not saved.wakes:
            return None, "it is not run again: its wakes were not kept"
        if saved.rerun_of is not None:
            return None, f"it is not run again: it ran the wakes of {saved.rerun_of} again"
        clock = self.clock
        age = clock.now() - started_at
        # (On event time before the first event, the clock knows no time yet: a replay
        # resumes where it stopped.)
        if not (isinstance(clock, EventClock) and not clock.started) and age > within:
            return None, (
                f"it is not run again: it started {age:.0f} s before, over"
                f" rerun_interrupted_within_seconds ({within:g})"
            )
        run = _PendingRun.of(self._new_run_id(), "wake", started_at, saved, rerun_of=cut_id)
        self._pending.appendleft(run)
        self._save(run, stopping=True)
        self._remember(run)
        self.counters["reruns"] += 1
        self._changed.set()
        return run, f"its wakes run again as {run.run_id}"

    def _spawned(self, run_id: str, pid: int) -> None:
        """Keep the run's program as it starts: a restart after a kill -9 stops what is
        left of it (:meth:`close_interrupted`)."""
        process = leftovers.mark(pid)
        if process is not None:
            self._persist(self.store.record_process, run_id, process)

    def _spent(self, run_id: str, usage: Usage) -> None:
        """Keep what the run in flight has spent so far: a stop that cancels it, or a
        kill -9 before its end (the store: the next start's ``max_cost_per_day`` reads
        it), leaves it counted."""
        self._spent_so_far = usage
        if self.store.durable:
            self._persist(self.store.record_usage, run_id, usage)

    def _note_outcome(self, result: RunResult) -> None:
        if result.status == "ok":
            self.runs_failing = 0
            self._ran_well = True
            return
        self.runs_failed += 1
        self.runs_failing += 1
        error = result.error or (f"exit code {result.exit_code}" if result.exit_code else "")
        self.last_run_error = f"{result.status}: {error}"[:300].rstrip(": ")
        if self.fuse and self.runs_failed == self.fuse and not self._ran_well:
            log.error(
                "every run so far failed: no more start, the replay stops",
                agent=self.agent_id, runs=self.runs_failed, last=self.last_run_error,
            )  # fmt: skip
            self.stop_starting()
            if self._on_fuse is not None:
                self._on_fuse()

    async def _call_runner(self, ctx: WakeContext) -> RunResult:
        try:
            runner = self.runner
            if isinstance(runner, CommandRunner) and self.store.durable:
                return await runner.run(ctx, partial(self._spawned, ctx.run_id))
            if is_spending(runner):
                return await runner.run(ctx, partial(self._spent, ctx.run_id))
            return await runner.run(ctx)
        except anyio.get_cancelled_exc_class():
            raise
        except Exception as exc:  # a runner bug is a failed run, not a dead scheduler
            log.exception("runner raised", agent=self.agent_id, run=ctx.run_id)
            return RunResult(status="failed", error=f"runner raised {exc!r}")

    # --- records -------------------------------------------------------------

    def _record_wake(self, wake: WakeRequest, outcome: WakeOutcome, dropped: int = 0) -> None:
        """The wake's row; ``dropped``: 1 when it was queued and its run is dropped."""
        self.counters[outcome.outcome] += 1
        if outcome.suppressed_by != "none":
            self.counters[f"suppressed_{outcome.suppressed_by}"] += 1
        record = self._wake_record(
            wake, outcome.outcome, outcome.suppressed_by, outcome.run_id, wake.hook_id, wake.reason
        )
        self.sink(msgspec.structs.replace(record, dropped=dropped) if dropped else record)

    def _market_ts(self) -> str | None:
        """The agent's time for a wake or run row: the event time on a replay (None
        before its first event), the wall clock live."""
        clock = self.clock
        if isinstance(clock, EventClock) and not clock.started:
            return None
        return iso_ms(int(clock.now() * 1000))

    def _wake_record(
        self,
        wake: WakeRequest | None,
        outcome: Literal["woke", "queued", "suppressed"],
        by: SuppressedBy,
        run_id: str | None,
        hook_id: str,
        reason: str,
    ) -> WakeRecord:
        return WakeRecord(
            ts=now_ts(),
            event_ts=self._market_ts(),
            agent_id=self.agent_id,
            trace_id=wake.trace_id if wake else None,
            event_id=wake.event_id if wake else None,
            outcome=outcome,
            suppressed_by=by,
            hook_ids=[hook_id],
            reasons=[reason],
            run_id=run_id,
        )

    def _run_record(
        self,
        run: _PendingRun,
        trace_id: str | None,
        duration_ms: float | None = None,
        result: RunResult | None = None,
    ) -> RunRecord:
        earlier = summarize_earlier(run.earlier)
        summary = f"{run.kind} run, {len(run.wakes)} wake(s)" + (f"; {earlier}" if earlier else "")
        if run.rerun_of is not None:
            summary += f"; again, for {run.rerun_of}, which a stop cut"
        if result is not None:
            summary += f"; {result.summary()}"
        return RunRecord(
            ts=now_ts(),
            event_ts=self._market_ts(),
            agent_id=self.agent_id,
            trace_id=trace_id,
            run_id=run.run_id,
            runner=self.runner.name,
            status="started" if result is None else _FINAL[result.status],
            event_ids=run.event_ids(),
            wakes=len(run.wakes) + sum(run.earlier.values()),
            trace_ids=run.trace_ids(),
            duration_ms=duration_ms,
            error=result.error if result else None,
            llm=result.llm if result else None,
            summary=summary,
        )
