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
from collections.abc import Callable, Coroutine, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import msgspec
import structlog
from anyio.abc import TaskGroup, TaskStatus

from daemon import config as config_mod
from daemon.bus import Bus, Subscription
from daemon.config import Config
from daemon.errors import ConfigError, StoreError
from daemon.events import FeedEvent
from daemon.recorder import record
from daemon.sdnotify import Notifier
from daemon.state import StateCache, read_snapshot, write_snapshot
from feeds.base import Feed, FeedHealth

log = structlog.get_logger("service")

FeedFactory = Callable[[Config], Sequence[Feed]]
Consumer = Callable[[Subscription], Coroutine[Any, Any, Any]]
# A component is entered before the feeds start and left after the bus closed
# and drained (the hook pipeline is one).
Component = Callable[["Service"], AbstractAsyncContextManager[Any]]
STATUS_FILE = "status.json"
SNAPSHOT_FILE = "state_cache.json"


class FeedStatus(msgspec.Struct, frozen=True):
    name: str
    silent_seconds: float
    errors: int
    finished: bool
    stalled: bool
    stats: dict[str, Any] = {}


class Status(msgspec.Struct, frozen=True):
    """What ``marketwake status`` shows; written to ``<state_dir>/status.json``."""

    pid: int
    started_at: float
    written_at: float
    running: bool
    bus: dict[str, Any]
    feeds: list[FeedStatus]
    state: dict[str, int]


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
    ) -> None:
        self.components = components
        self.config = config
        self.config_path = config_path
        self.build_feeds = build_feeds
        self.notifier = notifier or Notifier()
        self.bus = Bus(queue_size=config.bus.queue_size)
        self.state = StateCache.from_config(config.state)
        self.health: dict[str, FeedHealth] = {}
        self.feeds: dict[str, Feed] = {}
        self.finished: set[str] = set()
        self.started_at = time.time()
        self._feeds_scope: anyio.CancelScope | None = None
        self._all_finished = anyio.Event()
        self._stop = anyio.Event()
        self._subs: list[tuple[Consumer, Subscription]] = [
            (self._update_state, self.bus.subscribe("market.>", name="state"))
        ]
        path = record_path or (Path(config.daemon.record) if config.daemon.record else None)
        if path is not None:
            sub = self.bus.subscribe(">", name="recorder")
            self._subs.append((lambda s: record(s, path), sub))
        for name, consumer in consumers:
            self._subs.append((consumer, self.bus.subscribe(">", name=name)))

    @property
    def state_dir(self) -> Path:
        return Path(self.config.daemon.state_dir)

    async def _update_state(self, sub: Subscription) -> None:
        async for event in sub:
            self.state.apply(event)

    def _load_snapshot(self) -> None:
        """Warm start: indicators continue where the last run stopped."""
        try:
            data = read_snapshot(self.state_dir / SNAPSHOT_FILE)
            if data is not None:
                n = self.state.load(data)
                log.info("state cache restored", series=n)
        except StoreError as exc:
            log.warning("state snapshot unreadable; starting cold", error=str(exc))

    async def _save_snapshot(self) -> None:
        data = self.state.dump()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        try:
            await anyio.to_thread.run_sync(write_snapshot, self.state_dir / SNAPSHOT_FILE, data)
        except StoreError as exc:
            log.warning("state snapshot not written", error=str(exc))

    # -- feeds ---------------------------------------------------------------

    async def _publish(self, event: FeedEvent) -> None:
        await self.bus.publish(event)

    async def _run_feed(self, feed: Feed, *, task_status: TaskStatus[None]) -> None:
        health = self.health[feed.name] = FeedHealth(feed.name)
        self.feeds[feed.name] = feed
        self.finished.discard(feed.name)
        log.info("feed starting", feed=feed.name)
        await feed.run(self._publish, health, task_status=task_status)
        log.info("feed finished", feed=feed.name)
        self.finished.add(feed.name)
        if self.health and self.finished >= set(self.health):
            self._all_finished.set()

    async def _run_feeds(self, config: Config, *, task_status: TaskStatus[None]) -> None:
        with anyio.CancelScope() as scope:
            self._feeds_scope = scope
            feeds = self.build_feeds(config)
            self.health = {}
            self.feeds = {}
            async with anyio.create_task_group() as tg:
                for feed in feeds:
                    await tg.start(self._run_feed, feed)
                task_status.started()
            if not feeds:
                task_status.started()

    def stalled_feeds(self) -> list[str]:
        """Feeds that are neither finished nor heard from recently."""
        limit = self.config.daemon.stall_seconds
        return [
            name
            for name, h in self.health.items()
            if name not in self.finished and h.silent_for() > limit
        ]

    # -- background loops ----------------------------------------------------

    async def _watchdog(self, interval: float) -> None:
        while True:
            stalled = self.stalled_feeds()
            if stalled:
                log.warning("feeds stalled; withholding watchdog ping", feeds=stalled)
            else:
                self.notifier.watchdog()
            await anyio.sleep(interval)

    async def _status_loop(self) -> None:
        while True:
            await anyio.sleep(self.config.daemon.status_interval_seconds)
            status = self.write_status(running=True)
            await self._save_snapshot()
            stats = status.bus
            log.info(
                "status",
                published=stats["published"],
                delivered=stats["delivered"],
                coalesced=stats["coalesced"],
                stalled=[f.name for f in status.feeds if f.stalled],
            )
            self.notifier.status(f"published {stats['published']} events")

    async def _signals(self, tg: TaskGroup) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as sigs:
            async for signum in sigs:
                if signum == signal.SIGHUP:
                    await self.reload(tg)
                else:
                    log.info("signal received; draining", signal=signal.Signals(signum).name)
                    self._stop.set()
                    return

    async def reload(self, tg: TaskGroup) -> None:
        """Re-read the config file and restart the feeds with it."""
        self.notifier.reloading()
        try:
            new = config_mod.load(self.config_path) if self.config_path else self.config
        except ConfigError as exc:
            log.error("reload failed; keeping the running config", error=str(exc))
            self.notifier.ready("reload failed; old config kept")
            return
        self.config = new
        if self._feeds_scope is not None:
            self._feeds_scope.cancel()
        await tg.start(self._run_feeds, new)
        log.info("config reloaded", path=str(self.config_path))
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
            )
            for name, h in self.health.items()
        ]
        bus = {
            "published": stats.published,
            "delivered": stats.delivered,
            "coalesced": stats.coalesced,
            "subscriptions": [s._asdict() for s in stats.subscriptions],
        }
        return Status(
            os.getpid(),
            self.started_at,
            time.time(),
            running,
            bus,
            feeds,
            self.state.statistics(),
        )

    def _feed_stats(self, name: str) -> dict[str, Any]:
        """A feed's own counters, if it keeps any (``statistics()`` returning plain data)."""
        stats = getattr(self.feeds.get(name), "statistics", None)
        if stats is None:
            return {}
        value = stats()
        return dict(value) if isinstance(value, dict) else msgspec.to_builtins(value)

    def write_status(self, *, running: bool) -> Status:
        """Write status.json atomically (temp file + rename)."""
        status = self.status(running=running)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_dir / (STATUS_FILE + ".tmp")
        tmp.write_bytes(msgspec.json.format(msgspec.json.encode(status)))
        tmp.replace(self.state_dir / STATUS_FILE)
        return status

    # -- main ----------------------------------------------------------------

    async def run(self) -> Status:
        """Run until a signal, or until every (finite) feed has finished."""
        self._load_snapshot()
        async with AsyncExitStack() as stack:
            for component in self.components:
                await stack.enter_async_context(component(self))
            await self._run_main()
        status = self.write_status(running=False)
        await self._save_snapshot()
        log.info("daemon stopped", published=status.bus["published"])
        return status

    async def _run_main(self) -> None:
        async with anyio.create_task_group() as tg:
            for consumer, sub in self._subs:
                tg.start_soon(consumer, sub)
            with anyio.CancelScope() as aux:
                async with anyio.create_task_group() as aux_tg:
                    aux_tg.start_soon(self._signals, tg)
                    await tg.start(self._run_feeds, self.config)
                    names = ", ".join(self.health) or "none"
                    log.info("daemon ready", feeds=names)
                    self.notifier.ready(f"feeds: {names}")
                    if self.notifier.watchdog_interval:
                        aux_tg.start_soon(self._watchdog, self.notifier.watchdog_interval)
                    aux_tg.start_soon(self._status_loop)
                    aux_tg.start_soon(self._wait_for_finish)
                    await self._stop.wait()
                    aux.cancel()
            self.notifier.stopping()
            if self._feeds_scope is not None:
                self._feeds_scope.cancel()
            self.bus.close()

    async def _wait_for_finish(self) -> None:
        if not self.health:
            return
        await self._all_finished.wait()
        log.info("all feeds finished; stopping")
        self._stop.set()

    def request_stop(self) -> None:
        """Begin a graceful stop (used by embedding code and tests)."""
        self._stop.set()
