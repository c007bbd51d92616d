"""Loads agent workspaces, keeps one runtime per enabled agent, hot-reloads edits.

Every ``reload_seconds`` the agents directory is rescanned (0: only at start):

* a hook file whose content changed is a new revision: it is recorded and
  compiled in the agent's worker first; if it compiles it replaces the old
  revision between two events, if not the compile error is recorded and
  logged and **the previous good revision keeps running** (a typo in an edit
  never silently turns a hook off); a deleted file stops being evaluated;
* an edited ``agent.toml`` updates the wake policy and risk limits in place;
  new topics change the agent's subscription in place, so nothing queued or
  in flight is lost; an invalid file is logged (once per change) and the
  running config stays;
* new agents start, removed or disabled agents stop;
* ``marketwake hooks resume`` requests (left in the hook store) are applied.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import structlog
from anyio.abc import TaskGroup, TaskStatus

from daemon.agents.dispatcher import RECENT_EVENTS, STATE_TOPICS, AgentRuntime, Dispatcher
from daemon.agents.revisions import RevisionStore
from daemon.agents.store import AGENT_WIDE
from daemon.agents.workspace import Agent, discover, load_agent
from daemon.audit.reader import Recent
from daemon.audit.records import AuditRecord
from daemon.backlog import open_backlog
from daemon.bus import Bus, Subscription
from daemon.clock import EventClock
from daemon.errors import ConfigError, StoreError
from daemon.logs import Outage
from daemon.state import StateCache
from daemon.status import AgentStatus, HooksStatus
from daemon.tools.calls import AgentCall, AgentView
from daemon.wake.policy import RunnerConfig
from daemon.wake.runners import LogRunner, Runner, build_runner
from daemon.wake.scheduler import WakeScheduler
from daemon.wake.store import RunStore
from hooks_runtime.hookfile import HookSpec

log = structlog.get_logger("agents")


def _log_runner(_config: RunnerConfig) -> Runner:
    return LogRunner()


TRANSIENT_RETRIES = 3  # more compile attempts after a timeout or a crashed worker


def rescan_outage() -> Outage:
    """How the periodic rescan reports a store failure: once, and once it works again."""
    return Outage(log, "agents rescan failed; will retry", "agents rescan works again")


class AgentManager:
    """Owns the runtimes of all agents and their hot reload."""

    def __init__(
        self,
        *,
        agents_dir: Path,
        bus: Bus,
        dispatcher: Dispatcher,
        run_store: RunStore,
        state_factory: Callable[[], StateCache],
        max_source_bytes: int,
        max_agent_source_bytes: int = 0,
        reload_seconds: float = 2.0,
        event_time: bool = False,
        recently_evaluated: Recent | None = None,
        tools: Any = None,
        backlog_dir: Path | None = None,
        backlog_max_bytes: int = 256 * 1024 * 1024,
        run_agents: bool = True,
        include_disabled: bool = False,
        stop_after_failed_runs: int = 0,
        on_runs_failing: Callable[[], None] | None = None,
        revisions: RevisionStore | None = None,
    ) -> None:
        self.agents_dir = agents_dir
        self.bus = bus
        self.dispatcher = dispatcher
        self.run_store = run_store
        self.state_factory = state_factory
        self.max_source_bytes = max_source_bytes
        self.max_agent_source_bytes = max_agent_source_bytes
        self.reload_seconds = reload_seconds
        # Agents live on event time (replays): each scheduler gets its own EventClock.
        self.event_time = event_time
        # Set when the feeds ran out (not on a signal): pending wakes still run.
        self.drain_wakes = False
        # Per agent, the events its newest audit rows show evaluated (see checkpoints).
        self.recently_evaluated = recently_evaluated or Recent({}, {})
        self._started: set[str] = set()  # agents loaded once in this process
        # The agent tools LLM runs call (a daemon.llm.runner.ToolBox; None: no tools).
        self.tools = tools
        # Where an agent's events go when its queue is full (a slow agent never holds
        # the feed back). On event time the pipeline empties it at start: a replay
        # re-publishes what agents had not finished.
        self.backlog_dir = backlog_dir
        self.backlog_max_bytes = backlog_max_bytes
        # False: runs only log (a backtest counts wakes without calling any model).
        self.run_agents = run_agents
        self.include_disabled = include_disabled
        # Event time: an agent whose first runs all failed stops the replay (see config).
        self.fuse = stop_after_failed_runs if event_time else 0
        self.on_runs_failing = on_runs_failing
        # Where each new revision's source is kept (backtest --revision).
        self.revisions = revisions
        self.runtimes: dict[str, AgentRuntime] = {}
        self._scopes: dict[str, anyio.CancelScope] = {}
        self._tg: TaskGroup | None = None
        self._reload_scope = anyio.CancelScope()
        self._loaded = anyio.Event()
        self._done = anyio.Event()
        self.reloads = 0
        self._config_errors: dict[str, str] = {}
        self._file_errors: dict[tuple[str, str], str] = {}
        # (agent, hook) -> why the file's revision is not running: it did not compile.
        self._compile_errors: dict[tuple[str, str], str] = {}
        self._warned_missing = False
        self._rescan = rescan_outage()  # a store failure the rescans hit (a full disk)
        self._bad_revisions: set[tuple[str, str, str]] = set()

    async def _keep_source(self, spec: HookSpec) -> None:
        """Keep a new revision's source; in a worker thread: its write syncs the file
        and the directory (up to hundreds of ms on a loaded disk), and an edit reloads
        while the feeds run."""
        assert self.revisions is not None
        try:
            await anyio.to_thread.run_sync(self.revisions.put, spec.revision, spec.source)
        except StoreError as exc:  # the audit still names it; only a re-run is lost
            log.error("hook revision source not kept", hook=spec.hook_id, error=str(exc))

    def agent_call(self, agent_id: str, run_id: str) -> AgentCall | None:
        """Who a trading tool acts for when called for ``agent_id`` from outside its
        LLM runs (MCP, ``[mcp] agent``): None unless that agent is running."""
        rt = self.runtimes.get(agent_id)
        if rt is None or rt.removed:
            return None
        runner = rt.agent.config.wake.runner
        return AgentCall(
            agent_id=agent_id,
            run_id=run_id,
            signal_notional=runner.signal_notional,
            min_confidence=runner.min_confidence,
            signal_expiry_seconds=runner.signal_expiry_seconds,
            one_signal_per_symbol=False,
        )

    def agent_view(self, agent_id: str) -> AgentView | None:
        """On event time, what ``agent_id``'s runs see: its clock and its own state
        (None live, or when the agent is not running)."""
        rt = self.runtimes.get(agent_id)
        if rt is None or rt.removed or not isinstance(rt.scheduler.clock, EventClock):
            return None
        return AgentView(round(rt.scheduler.clock.now() * 1000), rt.state)

    def statistics(self) -> HooksStatus:
        """Per agent: hooks and revisions, paused hooks, queue depth; plus dispatcher counters."""
        d = self.dispatcher
        ready = d.pool.ready
        usage = {agent_id: rt.scheduler.usage_today() for agent_id, rt in self.runtimes.items()}
        return HooksStatus(
            sandbox_layers=list(ready.active) if ready is not None else [],
            evaluations=d.evaluations,
            suppressed=d.suppressed,
            failures=d.failures,
            config_errors=dict(self._config_errors),
            lookahead_used=d.ahead_used,
            lookahead_missed=d.ahead_missed,
            agents_dir=str(self.agents_dir.absolute()),
            store_error=d.store_outage.error,
            agents={
                agent_id: AgentStatus(
                    hooks={h: s.revision for h, s in rt.agent.hooks.items()},
                    paused=rt.paused,
                    paused_hooks=sorted(rt.paused_hooks),
                    queue_depth=rt.sub.statistics().depth,
                    file_errors={h: e for (a, h), e in self._file_errors.items() if a == agent_id},
                    compile_errors={
                        h: e for (a, h), e in self._compile_errors.items() if a == agent_id
                    },
                    runs_today=usage[agent_id][0],
                    cost_today=round(usage[agent_id][1], 6),
                    tokens_in_today=usage[agent_id][2],
                    tokens_out_today=usage[agent_id][3],
                    runs_failed=rt.scheduler.runs_failed,
                    runs_failing=rt.scheduler.runs_failing,
                    last_run_error=rt.scheduler.last_run_error,
                    hook_health=d.health.of(agent_id),
                    # as of now, not as of its last event (it may be deep in one)
                    lagging=d.lag_reason(rt),
                    backlog=rt.sub.backlog,
                )
                for agent_id, rt in self.runtimes.items()
            },
        )

    def _sink(self, record: AuditRecord) -> None:
        self.dispatcher.audit.write(record)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Load every agent and rescan until :meth:`stop_reloading`; return once every
        agent has drained its subscription (the bus closing ends them)."""
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                await self.rescan()
                self._loaded.set()
                task_status.started()
                with self._reload_scope:
                    while self.reload_seconds > 0:
                        await anyio.sleep(self.reload_seconds)
                        # Shielded: stopping never interrupts a half-applied scan.
                        with anyio.CancelScope(shield=True):
                            await self._rescan_logged()
        finally:
            self._loaded.set()
            self._done.set()

    async def wait_loaded(self) -> None:
        """Until the first scan has started every agent."""
        await self._loaded.wait()

    def close_subscriptions(self) -> None:
        """Take no new events; each agent finishes what it already holds, then ends.
        No run starts from here on (a run begun now would be a model call the stop
        asked to spare, or cut by its deadline), except on event time at the end of
        the data (``drain_wakes``): the runs due as the held events are evaluated
        start, as in an uninterrupted replay."""
        for rt in self.runtimes.values():
            rt.sub.close()
            if not (self.event_time and self.drain_wakes):
                rt.scheduler.stop_starting()

    def spare_runs(self) -> None:
        """A stop asked while the end of a replay drains: the run in flight ends, no
        other starts (their wakes stay queued, as at any stop)."""
        self.drain_wakes = False
        for rt in self.runtimes.values():
            rt.scheduler.stop_starting()

    def release_backlogs(self) -> None:
        """After the drain: what agents left on disk waits there for the next start."""
        for rt in self.runtimes.values():
            rt.sub.release()

    def stop_reloading(self) -> None:
        """No more rescans; running agents keep draining."""
        self._reload_scope.cancel()

    async def wait_drained(self) -> None:
        """Until every agent task has finished."""
        await self._done.wait()

    # -- scanning ------------------------------------------------------------------

    async def _rescan_logged(self) -> None:
        """A periodic scan that fails (a directory vanishing mid-scan, a worker that
        cannot start) is logged and retried next time; running agents are untouched."""
        try:
            await self.rescan()
        except StoreError as exc:  # (disk full) once, not once a second
            self._rescan.failed(str(exc))
            return
        except Exception:
            log.exception("agents rescan failed; will retry", path=str(self.agents_dir))
            return
        self._rescan.worked()

    async def rescan(self) -> None:
        """Apply every change on disk since the last scan (problems logged once each)."""
        if not self.agents_dir.is_dir() and not self._warned_missing:
            self._warned_missing = True
            log.warning("agents directory not found; no hooks will run", path=str(self.agents_dir))
        seen: set[str] = set()
        # Workspace files are read off the event loop (one slow or hostile file must
        # not stall every agent); each is capped and must be a plain regular file.
        for path in await anyio.to_thread.run_sync(discover, self.agents_dir):
            try:
                fresh = await anyio.to_thread.run_sync(
                    load_agent, path, self.max_source_bytes, self.max_agent_source_bytes
                )
            except ConfigError as exc:
                if self._config_errors.get(path.name) != str(exc):
                    self._config_errors[path.name] = str(exc)
                    log.error(
                        "agent config invalid",
                        agent=path.name,
                        error=str(exc),
                        running=(
                            "its last good config"
                            if path.name in self.runtimes
                            else "not started (see `marketwake status`)"
                        ),
                    )
                seen.add(path.name)
                continue
            self._config_errors.pop(path.name, None)
            if not fresh.config.enabled and not self.include_disabled:
                continue
            seen.add(fresh.agent_id)
            rt = self.runtimes.get(fresh.agent_id)
            if rt is None:
                await self._start(fresh)
            else:
                await self._update(rt, fresh)
        for agent_id in set(self.runtimes) - seen:
            await self._stop(agent_id)
        self._apply_resume_requests()

    async def _accept_hooks(
        self, agent: Agent, current: dict[str, HookSpec]
    ) -> dict[str, HookSpec]:
        """The hook set to run: new revisions that compile, old ones where they don't."""
        store = self.dispatcher.store
        for agent_id, hook_id in list(self._file_errors):
            if agent_id == agent.agent_id and hook_id not in agent.errors:
                del self._file_errors[(agent_id, hook_id)]  # fixed (or removed)
        for hook_id, problem in agent.errors.items():
            if self._file_errors.get((agent.agent_id, hook_id)) != problem:
                self._file_errors[(agent.agent_id, hook_id)] = problem
                log.error("hook file refused", agent=agent.agent_id, hook=hook_id, error=problem)
        for agent_id, hook_id in list(self._compile_errors):
            if agent_id == agent.agent_id and hook_id not in agent.hooks:
                del self._compile_errors[(agent_id, hook_id)]  # removed, or now unreadable
        bad = self._bad_revisions
        changed = [
            s
            for h, s in agent.hooks.items()
            if current.get(h) != s and (agent.agent_id, h, s.revision) not in bad
        ]
        results = await self.dispatcher.pool.compile(agent.agent_id, changed) if changed else []
        for _ in range(TRANSIENT_RETRIES):
            # A timeout or a crashed worker says nothing about the source (a loaded
            # machine, a worker still starting): try again before running without the
            # hook, or the events it missed would count as evaluated.
            retry = [i for i, r in enumerate(results) if not r.ok and r.error_kind != "compile"]
            if not retry:
                break
            log.warning(
                "hook compile failed transiently; retrying",
                agent=agent.agent_id,
                hooks=[changed[i].hook_id for i in retry],
                error=results[retry[0]].error,
            )
            again = await self.dispatcher.pool.compile(agent.agent_id, [changed[i] for i in retry])
            for i, res in zip(retry, again, strict=True):
                results[i] = res
        # A file that vanished stops; one that became unreadable keeps its last revision.
        accepted = {h: s for h, s in current.items() if h in agent.hooks or h in agent.errors}
        for spec, res in zip(changed, results, strict=True):
            path = str(agent.hook_paths[spec.hook_id])
            error = None if res.ok else f"{res.error_kind}: {res.error}"
            new = store.record_revision(agent.agent_id, spec.hook_id, spec.revision, path, error)
            if new:
                if self.revisions is not None:
                    await self._keep_source(spec)
                (log.error if error else log.info)(
                    "hook revision failed to compile" if error else "hook revision",
                    agent=agent.agent_id,
                    hook=spec.hook_id,
                    revision=spec.revision,
                    error=error,
                )
            if res.ok:
                accepted[spec.hook_id] = spec
                if new or spec.hook_id in current:
                    # An edit starts fresh; a restart keeps the revision's pause (it
                    # lifted every pause: a hook failing on each event failed again).
                    store.unpause(agent.agent_id, spec.hook_id)
                self._compile_errors.pop((agent.agent_id, spec.hook_id), None)
                continue
            if res.error_kind == "compile":  # a broken revision is not compiled again
                bad.add((agent.agent_id, spec.hook_id, spec.revision))
                running = current.get(spec.hook_id)
                self._compile_errors[(agent.agent_id, spec.hook_id)] = (
                    f"{path}: revision {spec.revision[:8]} does not compile ({res.error}); "
                    + (
                        f"revision {running.revision[:8]} keeps running"
                        if running is not None
                        else "the hook does not run"
                    )
                )
            if spec.hook_id in current:
                log.error(
                    "new revision failed to compile; previous revision keeps running",
                    agent=agent.agent_id,
                    hook=spec.hook_id,
                    error=error,
                )
        return accepted

    # -- lifecycle -----------------------------------------------------------------

    async def _start(self, agent: Agent) -> None:
        assert self._tg is not None
        agent.hooks = await self._accept_hooks(agent, {})
        if self.run_agents and self.tools is not None and agent.config.wake.runner.kind == "llm":
            # The tools' modules (~0.3 s of imports, the first time) load on a thread, so
            # the loop keeps serving feeds and agents; the runner built below finds them.
            await anyio.to_thread.run_sync(self.tools.specs)
        scheduler = WakeScheduler(
            agent.agent_id,
            agent.config.wake,
            store=self.run_store,
            sink=self._sink,
            # A run's context carries a state snapshot for the agent's LLM only: the
            # log runner (agents not run) reads none, so none is taken.
            state=self._wake_state if self.run_agents else None,
            clock=EventClock() if self.event_time else None,
            runner_factory=partial(build_runner, agent_dir=agent.path, tools=self.tools)
            if self.run_agents
            else _log_runner,
            write_ahead=self.dispatcher.write_ahead,
            fuse=self.fuse,
            on_fuse=self.on_runs_failing,
        )
        ahead = self.state_factory() if self.event_time else None
        rt = AgentRuntime(
            agent=agent,
            sub=self._subscribe(agent),
            scheduler=scheduler,
            # Runs that only log read no state (no tools, no context snapshot): the
            # hooks' market state then comes from the lookahead cache alone, and each
            # candle is one indicator update lighter (see AgentRuntime.ahead_state).
            state=ahead if ahead is not None and not self.run_agents else self.state_factory(),
            ahead_state=ahead,
        )
        self.dispatcher.desk.set_limits(agent.agent_id, agent.config.risk, agent.config.account)
        self.dispatcher.checkpoints.load(agent.agent_id)
        if agent.agent_id not in self._started:  # (a reload's old runs may still be going)
            self._started.add(agent.agent_id)
            scheduler.close_interrupted()
        recent = self.recently_evaluated
        for event_id in recent.evaluated.pop(agent.agent_id, [])[-RECENT_EVENTS:]:
            rt.recent[event_id] = None
        rt.last_outputs.update(recent.outputs.pop(agent.agent_id, {}))
        cut = recent.cut.pop(agent.agent_id, [])
        unplaced = recent.unplaced.pop(agent.agent_id, [])
        held = self.dispatcher.hold_cut(rt, cut, unplaced, self.event_time, recent.checked)
        for alert in held:
            self._tg.start_soon(self.dispatcher.alerts.send, alert)
        self._restore_pauses(rt)
        self.runtimes[agent.agent_id] = rt
        scope = anyio.CancelScope()
        self._scopes[agent.agent_id] = scope
        self._tg.start_soon(self._serve, rt, scope)
        log.info("agent started", agent=agent.agent_id, hooks=sorted(agent.hooks))

    @staticmethod
    def _topics(agent: Agent) -> list[str]:
        return [*agent.config.topics, *STATE_TOPICS]

    def _subscribe(self, agent: Agent) -> Subscription:
        overflow = None
        if self.backlog_dir is not None:
            path = self.backlog_dir / f"{agent.agent_id}.jsonl"
            overflow = open_backlog(path, self.backlog_max_bytes, f"agent {agent.agent_id}")
        sub = self.bus.subscribe(
            self._topics(agent),
            name=f"agent:{agent.agent_id}",
            overflow=overflow,
            ordered=self.event_time,  # it steps with its account's route
            spill=self.dispatcher.route.crowded if self.event_time else None,
        )
        # Same instant: the agent has "seen" exactly what was published before it.
        account = agent.config.account or agent.agent_id
        self.dispatcher.route.join(agent.agent_id, account, self.bus.last_published)
        return sub

    def _wake_state(self, agent_id: str) -> dict[str, Any] | None:
        """The state snapshot a run's context carries (symbols the agent follows)."""
        rt = self.runtimes.get(agent_id)
        if rt is None:
            return None
        return rt.state.export(rt.agent.config.symbols or None, candles=10)

    async def _serve(self, rt: AgentRuntime, scope: anyio.CancelScope) -> None:
        with scope:
            async with anyio.create_task_group() as tg:
                if not self.event_time:  # on event time the agent's loop drives it
                    await tg.start(rt.scheduler.run)
                try:
                    await self.dispatcher.serve_agent(rt)
                finally:
                    self.dispatcher.route.leave(rt.agent_id)
                if self.event_time and self.drain_wakes:
                    ran = await rt.scheduler.drain()
                    if ran:
                        log.info("queued wakes run after the replay", agent=rt.agent_id, runs=ran)
                elif not self.event_time:
                    # Live, a stop lets the run in flight end (an LLM run paid for so far),
                    # within what is left of [daemon] stop_timeout_seconds.
                    await rt.scheduler.finish_in_flight()
                tg.cancel_scope.cancel()
            rt.scheduler.abandon_pending(keep=not rt.removed)

    async def _update(self, rt: AgentRuntime, fresh: Agent) -> None:
        hooks = await self._accept_hooks(fresh, rt.agent.hooks)
        old = rt.agent
        if hooks != old.hooks or fresh.config != old.config:
            self.reloads += 1
            log.info("agent reloaded", agent=fresh.agent_id, hooks=sorted(hooks))
        if fresh.config.topics != old.config.topics:
            self.bus.resubscribe(rt.sub, self._topics(fresh))
        if fresh.config.wake != old.config.wake:
            rt.scheduler.update_policy(fresh.config.wake)
        if (fresh.config.risk, fresh.config.account) != (old.config.risk, old.config.account):
            cfg = fresh.config
            self.dispatcher.desk.set_limits(fresh.agent_id, cfg.risk, cfg.account)
        fresh.hooks = hooks
        fresh.hook_paths = {**old.hook_paths, **fresh.hook_paths}
        rt.agent = fresh

    async def _stop(self, agent_id: str) -> None:
        rt = self.runtimes.pop(agent_id)
        rt.removed = True
        rt.sub.close()
        if rt.sub.overflow is not None:  # its undelivered events go with it
            rt.sub.overflow.close(delete=True)
        self.dispatcher.route.leave(agent_id)
        self._scopes.pop(agent_id).cancel()
        await self.dispatcher.pool.discard(agent_id)
        self.dispatcher.health.forget(agent_id)
        if self.dispatcher.cpu is not None:
            self.dispatcher.cpu.forget(agent_id)
        log.info("agent stopped", agent=agent_id)

    # -- pauses ----------------------------------------------------------------------

    def _restore_pauses(self, rt: AgentRuntime) -> None:
        for agent_id, hook, reason, _ in self.dispatcher.store.pauses():
            if agent_id != rt.agent_id:
                continue
            if hook == AGENT_WIDE:
                rt.paused = True
                rt.scheduler.set_paused(True)
            elif hook in rt.agent.hooks:
                key = (agent_id, hook)
                self.dispatcher.pool.breaker.pause(key, rt.agent.hooks[hook].revision, reason)
                rt.paused_hooks.add(hook)

    def _apply_resume_requests(self) -> None:
        for agent_id, hook in self.dispatcher.store.take_resume_requests():
            rt = self.runtimes.get(agent_id)
            if rt is None:
                continue
            if hook == AGENT_WIDE:
                self.dispatcher.resume_agent(rt)
            else:
                self.dispatcher.pool.resume(agent_id, hook)
                self.dispatcher.health.resumed(agent_id, hook)
                rt.paused_hooks.discard(hook)
                log.info("hook resumed", agent=agent_id, hook=hook)
