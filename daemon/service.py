"""The running daemon: feeds, bus and consumers under one task group.

Lifecycle, as systemd sees it (``Type=notify``):

* every configured feed is started with ``tg.start`` and READY=1 is sent only
  after all of them report started;
* WATCHDOG=1 is sent every ``WATCHDOG_USEC/2`` *only while no feed is stalled*
  (silent for longer than ``daemon.stall_seconds``), so systemd restarts a
  zombie whose feeds died quietly;
* SIGHUP re-reads the config: RELOADING=1, then feeds restart with the new
  config and READY=1 follows; a bad file is logged and the old config stays;
* SIGTERM/SIGINT: STOPPING=1, feeds stop, the bus closes and every consumer
  drains what it already holds (recorder flushed, status written), then exit.

A daemon whose feeds are all finite (replay) stops by itself when they end.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import msgspec
import structlog
from anyio.abc import TaskGroup, TaskStatus

from daemon import config as config_mod
from daemon.atomicfile import write_atomic
from daemon.bus import Bus, Subscription
from daemon.clock import Clock, MonotonicClock
from daemon.config import Config
from daemon.control import CONTROL_SOCKET, serve_control
from daemon.copytrade.book import LiveBook
from daemon.errors import ConfigError, StoreError
from daemon.events import MARKET_CANDLE_CLOSED, MARKET_PRICE_TICK, FeedEvent
from daemon.inputfile import read_input
from daemon.logs import Outage
from daemon.loopwatch import LoopWatch
from daemon.recorder import record
from daemon.sdnotify import Notifier
from daemon.state import StateCache, read_snapshot, write_snapshot
from daemon.statedir import REPLAY_FILE, SNAPSHOT_FILE, StateDirLock
from daemon.status import FeedStatus, Status, write_status
from daemon.walkeeper import KEEPER
from feeds.base import Feed, FeedHealth, Resumable

SETTLED_TOPICS = frozenset({MARKET_CANDLE_CLOSED, MARKET_PRICE_TICK})  # what Service.settle gates

log = structlog.get_logger("service")

FeedFactory = Callable[[Config], Sequence[Feed]]
Consumer = Callable[[Subscription], Coroutine[Any, Any, Any]]
# A component is entered before the feeds start and left after the bus closed
# and drained (the hook pipeline is one).
Component = Callable[["Service"], AbstractAsyncContextManager[Any]]
# Config sections a SIGHUP does not apply (the hook pipeline reloads agents itself).
RESTART_ONLY = (
    "daemon", "bus", "state", "hooks", "audit", "trading", "copytrade", "rag", "mcp", "tools",
)  # fmt: skip
# How often feeds are checked for a stall (at most; a quarter of stall_seconds if less).
STALL_CHECK_SECONDS = 1.0


class _StartFlag(TaskStatus[None]):
    """Passes ``started()`` on and remembers that it happened."""

    def __init__(self, inner: TaskStatus[None]) -> None:
        self.inner = inner
        self.is_started = False

    def started(self, value: None = None) -> None:
        self.is_started = True
        self.inner.started(value)


def new_run_id() -> str:
    """A daemon run's id: its UTC start time (sortable, readable) plus a random suffix."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + os.urandom(2).hex()


class _Publisher:
    """One feed's ``publish``: an event onto the bus. After an event that waited for
    a slow subscriber, a stop ends the feed before its next event (not hundreds
    later), never between delivering an event and the feed counting it."""

    __slots__ = ("_held_back", "_service")

    def __init__(self, service: Service) -> None:
        self._service = service
        self._held_back = False

    async def __call__(self, event: FeedEvent) -> None:
        if self._held_back:
            self._held_back = False
            await anyio.lowlevel.checkpoint_if_cancelled()
        service = self._service
        if service.settle is not None and event.topic in SETTLED_TOPICS:
            await service.settle()  # (not shielded: a stop may cut the wait)
        rest = service.bus.offer(event)  # the usual case: every queue takes it at once
        if rest is None:
            return
        # Shielded: stopping a feed never leaves an event delivered to some
        # subscribers (the recorder) and not to others (an agent). Subscribers
        # keep draining while feeds stop, so a blocked publish always completes.
        with anyio.CancelScope(shield=True):
            await service.bus.deliver(event, rest)
        self._held_back = True


class Service:
    """Owns the bus, the state cache, the feeds and the consumers of one daemon run."""

    def __init__(
        self,
        config: Config,
        build_feeds: FeedFactory,
        *,
        config_path: Path | None = None,
        record_path: Path | None = None,
        consumers: Sequence[tuple[str, Consumer]] = (),
        components: Sequence[Component] = (),
        notifier: Notifier | None = None,
        from_start: bool = False,
        clock: Clock | None = None,
    ) -> None:
        self.components = components
        # Components register a ``() -> plain data`` here to appear in status.json.
        self.status_providers: dict[str, Callable[[], Any]] = {}
        # The agent tools for LLM runs (a daemon.llm.runner.ToolBox), set by the
        # component that owns the shared market connection (daemon/app.py).
        self.tools: Any = None
        # The audit log's write (an AuditWriter.write), while the agents' pipeline
        # runs: feeds that audit what they refuse (copy-trade signals) go through it.
        self.audit: Callable[[Any], None] | None = None
        self.config = config
        self.config_path = config_path
        self.build_feeds = build_feeds
        self.notifier = notifier or Notifier()
        # Feed stall timers and the watchdog ping (a ManualClock in tests).
        self.clock: Clock = clock or MonotonicClock()
        self.loop_watch = LoopWatch()  # (on the monotonic clock whatever ``clock`` is)
        self.bus = Bus(queue_size=config.bus.queue_size)
        self.state = StateCache.from_config(config.state)
        # false ([state] shared): nobody reads self.state, which stays empty.
        self._shared_state = config.state.shared
        self.health: dict[str, FeedHealth] = {}
        self.feeds: dict[str, Feed] = {}
        self.finished: set[str] = set()
        self.failed: set[str] = set()
        self.errors: dict[str, str] = {}  # why each failed feed failed
        self._feeds_tg: TaskGroup | None = None
        self._consumers_done = anyio.Event()
        self._status_outage = Outage(
            log,
            "status.json not written; `marketwake status` asks the running daemon",
            "status.json written again",
        )
        self._snapshot_outage = Outage(log, "state snapshot not written", level="warning")
        self.started_at = time.time()
        self.run_id = new_run_id()  # stamped on every audit row of this run
        # Start a replay over: components forget what agents applied (see run()).
        self.from_start = from_start
        # Per partition, the event time every agent finished (set by the hook pipeline):
        # resumable feeds fast-forward through it.
        self.resume_points: Callable[[], Mapping[str, int]] = dict
        self._feeds_scope: anyio.CancelScope | None = None
        self._feeds_done = anyio.Event()  # set once the running feed group has ended
        self._all_finished = anyio.Event()
        self._expected: set[str] = set()  # the names of the feeds started
        self._stop = anyio.Event()
        # A stop was asked (a signal, the runs fuse, embedding code) before the daemon
        # stopped by itself at the end of a finite replay, catching up included.
        self.interrupted = False
        # Called when a stop is asked while a finished replay drains (its queued wakes
        # running): the hook pipeline then starts no more runs.
        self.on_interrupt: list[Callable[[], None]] = []
        # Set once every feed has started (READY): signals re-delivered at start
        # are on the bus by then.
        self.ready = anyio.Event()
        # Awaited before a feed publishes a market event, when set: replays with
        # leader agents wait until what the last one caused has been handled.
        self.settle: Callable[[], Awaitable[None]] | None = None
        self._reload_lock = anyio.Lock()
        self._subs: list[tuple[Consumer, Subscription]] = []
        if self._shared_state:
            topics = ("market.>", "copytrade.signal.*")
            self._subs.append((self._update_state, self.bus.subscribe(topics, name="state")))
        path = record_path or (Path(config.daemon.record) if config.daemon.record else None)
        if path is not None:
            sub = self.bus.subscribe(">", name="recorder")
            cap = int(config.daemon.record_max_mb * 1024 * 1024)
            self._subs.append((lambda s: record(s, path, cap), sub))
        for name, consumer in consumers:
            self._subs.append((consumer, self.bus.subscribe(">", name=name)))

    @property
    def state_dir(self) -> Path:
        return Path(self.config.daemon.state_dir)

    async def _update_state(self, sub: Subscription) -> None:
        async for event in sub:
            try:
                self.state.apply(event)
            except Exception:
                log.exception("state cache rejected an event", event_id=event.event_id)

    def _check_replay_source(self) -> None:
        """A different replay file than last time means starting over (``from_start``)."""
        replay = self.config.feeds.replay
        if not replay.enabled:
            return
        path = Path(replay.path)
        try:
            st = path.stat()
        except OSError:
            return  # the feed itself reports an unreadable file
        ident = f"{path.resolve()}\n{st.st_size}\n{st.st_mtime_ns}\n"
        marker = self.state_dir / REPLAY_FILE
        try:  # (never blocks on a FIFO, never reads a huge file whole)
            previous: str | None = read_input(marker, 4096).decode()
        except (OSError, UnicodeDecodeError):
            previous = None
        # Only a marker naming another file starts over: an empty or cut one (an older
        # version's kill -9 mid-write) says nothing, and starting over re-evaluates
        # every event against the agents' newer state.
        if previous and previous.count("\n") == 3 and previous != ident and not self.from_start:
            log.warning("a different replay file than the last run: starting over", path=str(path))
            self.from_start = True
        self.state_dir.mkdir(parents=True, exist_ok=True)
        if previous != ident:
            try:
                write_atomic(marker, ident.encode())
            except OSError as exc:  # (a start that cannot record it would start over next)
                raise StoreError(f"{marker}: cannot record the replay file: {exc}") from None

    def _load_snapshot(self) -> None:
        """Warm start: indicators continue where the last run stopped."""
        if not self._shared_state:
            return
        try:
            data = read_snapshot(self.state_dir / SNAPSHOT_FILE)
            if data is not None:
                n = self.state.load(data)
                log.info("state cache restored", series=n)
        except StoreError as exc:
            log.warning("state snapshot unreadable; starting cold", error=str(exc))

    async def _save_snapshot(self) -> None:
        if not self._shared_state:  # a later start must not warm up from an older one
            (self.state_dir / SNAPSHOT_FILE).unlink(missing_ok=True)
            return
        data = self.state.dump()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        try:
            await anyio.to_thread.run_sync(write_snapshot, self.state_dir / SNAPSHOT_FILE, data)
        except StoreError as exc:  # once, not every status interval
            self._snapshot_outage.failed(str(exc))
        else:
            self._snapshot_outage.worked()

    # -- feeds ---------------------------------------------------------------

    async def _run_feed(self, feed: Feed, *, task_status: TaskStatus[None]) -> None:
        """Run one feed. Failing to start propagates (startup fails fast, a reload rolls
        back); failing later is contained: the feed is marked failed, which withholds
        the watchdog ping so systemd restarts us, and the daemon keeps draining."""
        health = self.health[feed.name] = FeedHealth(feed.name, self.clock.now)
        self.feeds[feed.name] = feed
        self.finished.discard(feed.name)
        self.failed.discard(feed.name)
        status = _StartFlag(task_status)
        log.info("feed starting", feed=feed.name)
        try:
            await feed.run(_Publisher(self), health, task_status=status)
        except Exception as exc:
            if not status.is_started:
                raise
            self.failed.add(feed.name)
            self.errors[feed.name] = str(exc) or type(exc).__name__
            log.error("feed failed", feed=feed.name, error=self.errors[feed.name])
        else:
            log.info("feed finished", feed=feed.name)
            self.finished.add(feed.name)
        if not status.is_started:
            status.started()
        if self.health and (self.finished | self.failed) >= self._expected:
            self._all_finished.set()

    async def _run_feed_group(
        self,
        feeds: Sequence[Feed],
        scope: anyio.CancelScope,
        done: anyio.Event,
        *,
        task_status: TaskStatus[None],
    ) -> None:
        started = False
        try:
            with scope:
                async with anyio.create_task_group() as tg:
                    for feed in feeds:
                        await tg.start(self._run_feed, feed)
                    task_status.started()
                    started = True
        finally:
            done.set()
        if not started:  # a stop during the start cancelled ``scope`` (a failure raised)
            task_status.started()

    async def _start_feeds(self, config: Config) -> None:
        """Build and start every feed of ``config``; raises if one fails to start."""
        assert self._feeds_tg is not None
        feeds = self.build_feeds(config)
        marks = self.resume_points()
        for feed in feeds:
            if isinstance(feed, Resumable):
                feed.resume_after(marks)
        self.health, self.feeds = {}, {}
        self.finished, self.failed, self.errors = set(), set(), {}
        # All of them, before any starts: a replay that ends before the next feed has
        # registered must not look like "every feed finished".
        self._expected = {feed.name for feed in feeds}
        scope, done = anyio.CancelScope(), anyio.Event()
        self._feeds_scope, self._feeds_done = scope, done
        await self._feeds_tg.start(self._run_feed_group, feeds, scope, done)

    def feeds_finished(self) -> bool:
        """Whether every feed ran out by itself (a finite replay), not stopped by a signal."""
        return bool(self.health) and self.finished >= self._expected

    def ran_out(self) -> bool:
        """Whether the daemon stops because a finite replay ended and every subscriber
        caught up on it, not because a stop was asked meanwhile."""
        return self.feeds_finished() and not self.interrupted

    def stalled_feeds(self) -> list[str]:
        """Feeds that failed, or are neither finished nor heard from recently."""
        limit = self.config.daemon.stall_seconds
        return [
            name
            for name, h in self.health.items()
            if name in self.failed or (name not in self.finished and h.silent_for() > limit)
        ]

    # -- background loops ----------------------------------------------------

    async def _watchdog(self, interval: float) -> None:
        while True:
            stalled = self.stalled_feeds()
            if stalled:  # the stall monitor logs each stall once; this repeats every ping
                log.debug("feeds stalled; withholding watchdog ping", feeds=stalled)
            else:
                self.notifier.watchdog()
            await self.clock.sleep_until(self.clock.now() + interval)

    async def _stall_monitor(self) -> None:
        """A WARNING when a feed goes silent past ``stall_seconds``, an INFO when it is
        heard again: once per transition, not in every status line."""
        limit = self.config.daemon.stall_seconds
        stalled: set[str] = set()
        while True:
            now = {n for n in self.stalled_feeds() if n not in self.failed}
            for name in sorted(now - stalled):
                silent = self.health[name].silent_for() if name in self.health else limit
                log.warning(
                    "feed stalled: nothing heard from its source",
                    feed=name,
                    silent_seconds=round(silent, 1),
                    stall_seconds=limit,
                )
            for name in sorted(stalled - now):
                if name in self.health and name not in self.finished and name not in self.failed:
                    log.info("feed recovered", feed=name)
            stalled = now
            await self.clock.sleep_until(self.clock.now() + min(STALL_CHECK_SECONDS, limit / 4))

    async def _status_loop(self) -> None:
        self.write_status(running=True)  # `marketwake status` works from READY on
        while True:
            await anyio.sleep(self.config.daemon.status_interval_seconds)
            status = await self.write_status_in_thread()
            await self._save_snapshot()
            stats = status.bus
            books = {
                name: {
                    "realized": round(a.realized, 2),
                    "unrealized": round(a.unrealized, 2),
                    "positions": len(a.positions),
                    "working_orders": a.working_orders,
                }
                for name, a in status.accounts.items()
            }
            log.info(
                "status",
                published=stats.published,
                delivered=stats.delivered,
                coalesced=stats.coalesced,
                stalled=[f.name for f in status.feeds if f.stalled],
                **({"accounts": books} if books else {}),
            )
            self.notifier.status(f"published {stats.published} events")

    async def _signals(self, signals: AsyncIterator[int]) -> None:
        """Handle signals for the whole run: the receiver stays open while draining, so a
        second TERM or a HUP during shutdown cannot kill the drain."""
        async for signum in signals:
            name = signal.Signals(signum).name
            if self._stop.is_set() and (self.interrupted or signum == signal.SIGHUP):
                log.warning("signal ignored: already stopping", signal=name)
            elif signum == signal.SIGHUP:
                # In its own task: a slow reload (a feed that takes seconds to
                # start) must not hold up a SIGTERM that follows it.
                if self._feeds_tg is not None:
                    self._feeds_tg.start_soon(self._reload_once)
            else:
                log.info("signal received; draining", signal=name, **self.bus.held())
                self.request_stop()

    async def _reload_once(self) -> None:
        async with self._reload_lock:
            await self.reload()

    async def reload(self) -> None:
        """Re-read the config and restart the feeds with it; any failure keeps (or
        restores) the running config."""
        self.notifier.reloading()
        try:
            new = config_mod.load(self.config_path) if self.config_path else self.config
        except ConfigError as exc:
            log.error("reload failed; keeping the running config", error=str(exc))
            self.notifier.ready("reload failed; old config kept")
            return
        old = self.config
        if self._feeds_scope is not None:
            self.bus.hurry()
            self._feeds_scope.cancel()
            # The old feeds have let go of what they held (a listening port) first.
            await self._feeds_done.wait()
            self.bus.hurry(on=False)
        try:
            self.config = new
            await self._start_feeds(new)
        except Exception as exc:  # noqa: BLE001 - any failure must restore the old feeds
            log.error("new feeds failed to start; restarting the previous config", error=str(exc))
            self.config = old
            await self._start_feeds(old)
            self.notifier.ready("reload failed; old config restored")
            return
        log.info("config reloaded; feeds restarted", path=str(self.config_path))
        frozen = [n for n in RESTART_ONLY if getattr(new, n) != getattr(old, n)]
        if frozen:
            log.warning("these sections changed but apply only after a restart", sections=frozen)
        self.notifier.ready("reloaded")

    # -- status ----------------------------------------------------------------

    def status(self, *, running: bool) -> Status:
        stats = self.bus.statistics()
        limit = self.config.daemon.stall_seconds
        feeds = [
            FeedStatus(
                name,
                round(h.silent_for(), 3),
                h.errors,
                name in self.finished,
                name not in self.finished and h.silent_for() > limit,
                self._feed_stats(name),
                name in self.failed,
                self.errors.get(name, "") if name in self.failed else "",
            )
            for name, h in self.health.items()
        ]
        return Status(
            os.getpid(),
            self.started_at,
            time.time(),
            running,
            stats,
            feeds,
            self.state.statistics() if self._shared_state else {},
            {name: provider() for name, provider in self.status_providers.items()},
            self.run_id,
            self.loop_watch.status(),
            KEEPER.status(),
            self.interrupted,
        )

    def published_by_feeds(self) -> int:
        """Events the feeds have published so far (what a progress bar counts)."""
        total = 0
        for name in self.health:
            n = self._feed_stats(name).get("published", 0)
            total += n if isinstance(n, int) else 0
        return total

    def _feed_stats(self, name: str) -> dict[str, Any]:
        """A feed's own counters, if it keeps any (``statistics()`` returning plain data)."""
        stats = getattr(self.feeds.get(name), "statistics", None)
        if stats is None:
            return {}
        value = stats()
        return dict(value) if isinstance(value, dict) else msgspec.to_builtins(value)

    def _live_status(self) -> bytes:
        """The status as of now, for the control socket (``marketwake status``)."""
        return msgspec.json.encode(self.status(running=True))

    def _live_book(self) -> bytes:
        """The leaders' book as of now, as the state snapshot holds it (``copytrade
        status``); none without a shared cache ([state] shared = false: a backtest)."""
        if not self._shared_state:
            return b""
        return msgspec.json.encode(LiveBook(book=self.state.copytrade.dump()))

    async def write_status_in_thread(self) -> Status:
        """The periodic status: taken on the loop, written from a worker thread (the
        rename took 610 ms once on a busy disk, holding the whole loop)."""
        status = self.status(running=True)
        await anyio.to_thread.run_sync(self._save_status, status)
        return status

    def write_status(self, *, running: bool) -> Status:
        """Write status.json atomically (temp file + rename); a failure (a full disk) is
        logged once until a write works again, and the daemon goes on."""
        status = self.status(running=running)
        self._save_status(status)
        return status

    def _save_status(self, status: Status) -> None:
        try:
            write_status(self.state_dir, status)
        except StoreError as exc:
            self._status_outage.failed(str(exc))
        else:
            self._status_outage.worked()

    # -- main ----------------------------------------------------------------

    async def run(self) -> Status:
        """Run until a signal, or until every (finite) feed has finished.

        The state dir is locked for the whole run: a second daemon on the same
        dir fails with :exc:`StateDirInUse` before touching anything.

        Shutdown order: feeds stop; components drain (agents evaluate what they
        hold, the broker's last account events are published, the audit log is
        flushed); then the bus closes and the recorder and state cache drain.
        """
        with StateDirLock(self.state_dir):
            return await self._run_locked()

    async def _run_locked(self) -> Status:
        log.info("daemon starting", run=self.run_id, pid=os.getpid(), state_dir=str(self.state_dir))
        self._check_replay_source()
        if self.from_start:
            (self.state_dir / SNAPSHOT_FILE).unlink(missing_ok=True)
            log.warning("starting over: state caches and applied marks are reset")
        self._load_snapshot()
        sigs = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
        with anyio.open_signal_receiver(*sigs) as signals:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._signals, signals)
                tg.start_soon(KEEPER.run)  # the stores' WAL checkpoints, off the loop
                consumers = anyio.CancelScope()
                tg.start_soon(self._run_consumers, consumers)
                async with AsyncExitStack() as stack:
                    for component in self.components:
                        await stack.enter_async_context(component(self))
                    await self._serve()
                self.bus.close()
                await self._consumers_done.wait()
                tg.cancel_scope.cancel()
        status = self.write_status(running=False)
        await self._save_snapshot()
        log.info("daemon stopped", published=status.bus.published)
        return status

    async def _run_consumers(self, scope: anyio.CancelScope) -> None:
        with scope:
            async with anyio.create_task_group() as tg:
                for consumer, sub in self._subs:
                    tg.start_soon(consumer, sub)
        self._consumers_done.set()

    async def _serve(self) -> None:
        """Feeds and the periodic tasks, until a stop is requested."""
        async with anyio.create_task_group() as ftg:
            self._feeds_tg = ftg
            if not self._stop.is_set():
                await self._start_feeds(self.config)
            if self._stop.is_set():  # stopped while starting: never READY
                log.info("stopped during the start")
            else:
                # Up before READY: `status` right after READY asks the daemon itself.
                answers = {"status": self._live_status, "copytrade": self._live_book}
                await ftg.start(serve_control, self.state_dir / CONTROL_SOCKET, answers)
                names = ", ".join(self.health) or "none"
                log.info("daemon ready", feeds=names)
                self.notifier.ready(f"feeds: {names}")
                self.ready.set()
                if self.notifier.watchdog_interval:
                    ftg.start_soon(self._watchdog, self.notifier.watchdog_interval)
                ftg.start_soon(self._status_loop)
                ftg.start_soon(self._stall_monitor)
                ftg.start_soon(self.loop_watch.run)
                ftg.start_soon(self._wait_for_finish)
            await self._stop.wait()
            self.notifier.stopping()
            self.bus.hurry()  # a feed waiting on a slow agent's queue stops at its next event
            ftg.cancel_scope.cancel()

    async def _wait_for_finish(self) -> None:
        if not self.health:
            return
        await self._all_finished.wait()
        await self._catch_up()
        log.info("all feeds finished; stopping")
        self._stop.set()

    async def _catch_up(self) -> None:
        """After a finite replay, until every subscriber has finished what was
        published: a slow agent may hold much of it on disk, more than a stop's
        drain (bounded by ``stop_timeout_seconds``) could finish. A signal still
        stops at once; a subscriber that makes no progress for ``stall_seconds``
        is given up on (the stop's drain then takes its turn)."""
        bus, limit = self.bus, self.config.daemon.stall_seconds
        if bus.idle():
            return
        log.info("all feeds finished; waiting for the agents to catch up", **bus.held())
        seen, since = bus.delivered, time.monotonic()
        while not bus.idle():
            await anyio.sleep(0.05)
            if bus.delivered != seen:
                seen, since = bus.delivered, time.monotonic()
            elif time.monotonic() - since > limit:
                log.warning("subscribers made no progress; stopping anyway", seconds=limit)
                return

    @property
    def stopping(self) -> bool:
        """Whether the daemon is stopping: asked to, or its finite feeds ran out."""
        return self._stop.is_set()

    def request_stop(self) -> None:
        """Begin a graceful stop (signals, embedding code, tests). Before READY, the
        feeds still starting are given up at once: Ctrl-C does not wait out a feed's
        start (Coinbase unreachable waits up to its startup timeout). Asked while a
        finished replay drains, the runs its queued wakes would start are spared
        (``on_interrupt``) and the run counts as interrupted."""
        if not self._stop.is_set():
            self.interrupted = True
        elif not self.interrupted:
            # The replay ended by itself and its queued wakes are running: the user
            # means those (paid model calls) too.
            self.interrupted = True
            log.warning("stop asked during the end of the replay: no more runs start")
            for interrupt in self.on_interrupt:
                interrupt()
        self._stop.set()
        if not self.ready.is_set() and self._feeds_scope is not None:
            self._feeds_scope.cancel()
