"""Event loop stalls: how late the loop runs a timer.

Whatever holds the event loop (a synchronous import, a long computation, a
blocking call) holds every feed, hook, agent run and server of the daemon for
as long, and nothing else shows it: events simply arrive late. The watch sleeps
``interval`` at a time on the monotonic clock and measures how late it wakes. A
wake ``threshold`` or more late is a stall: counted, kept for ``status`` (the
longest, the latest) and logged as a warning, at most one line per ``quiet``
seconds, which then counts the stalls it did not log. The warning also gives
the CPU time the loop's thread used meanwhile: about the stall, and code held
the loop; far less, and the thread waited (a blocking call, another thread
holding the GIL, or a machine that did not run the process).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import anyio
import msgspec
import structlog

from daemon.events import iso_ms

log = structlog.get_logger("daemon.loop")

#: Defaults: a stall is a timer run 250 ms late, measured every 100 ms.
THRESHOLD_SECONDS = 0.25
INTERVAL_SECONDS = 0.1
QUIET_SECONDS = 60.0


class LoopStalls(msgspec.Struct, frozen=True, kw_only=True):
    """The event loop's stalls since the daemon started (``status``)."""

    threshold_ms: float
    stalls: int = 0
    longest_ms: float = 0.0
    last_ms: float = 0.0
    last_at: str = ""  # when the latest ended, UTC ISO


class LoopWatch:
    """Counts and logs stalls (see the module docstring); ``now``, ``wall``, ``cpu``
    (the loop thread's CPU time) and ``sleep`` are injectable for tests."""

    def __init__(
        self,
        *,
        threshold: float = THRESHOLD_SECONDS,
        interval: float = INTERVAL_SECONDS,
        quiet: float = QUIET_SECONDS,
        now: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        cpu: Callable[[], float] = time.thread_time,
        sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
    ) -> None:
        self.threshold, self.interval, self.quiet = threshold, interval, quiet
        self._now, self._wall, self._cpu, self._sleep = now, wall, cpu, sleep
        self.stalls = 0
        self.longest = 0.0
        self.last = 0.0
        self.last_at = 0.0  # wall time
        self._logged_at: float | None = None  # monotonic time of the last warning
        self._unlogged = 0  # stalls since it

    def observe(self, late: float, cpu: float) -> None:
        """One wake ``late`` seconds after its time; ``cpu``: the seconds of CPU the
        loop's thread used from the sleep to the wake."""
        if late < self.threshold:
            return
        self.stalls += 1
        self.longest = max(self.longest, late)
        self.last, self.last_at = late, self._wall()
        now = self._now()
        if self._logged_at is not None and now - self._logged_at < self.quiet:
            self._unlogged += 1
            return
        log.warning(
            "event loop stalled: nothing else ran meanwhile (feeds, hooks, runs, servers)",
            stalled_ms=round(late * 1000),
            loop_cpu_ms=round(cpu * 1000),
            threshold_ms=round(self.threshold * 1000),
            stalls_not_logged=self._unlogged,
        )
        self._logged_at, self._unlogged = now, 0

    async def run(self) -> None:
        """Measure until cancelled."""
        while True:
            start, cpu = self._now(), self._cpu()
            await self._sleep(self.interval)
            self.observe(self._now() - start - self.interval, self._cpu() - cpu)

    def status(self) -> LoopStalls:
        return LoopStalls(
            threshold_ms=round(self.threshold * 1000, 1),
            stalls=self.stalls,
            longest_ms=round(self.longest * 1000, 1),
            last_ms=round(self.last * 1000, 1),
            last_at=iso_ms(int(self.last_at * 1000)) if self.stalls else "",
        )
