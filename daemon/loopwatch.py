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
holding the GIL, or a machine that did not run the process). And where the loop
was: a thread of the watch's own looks every ``threshold / 2`` and, once the
loop is that late, takes the innermost frames of the loop's thread, which the
warning gives as ``at`` (a stall is found where it happens, not guessed at).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Awaitable, Callable
from types import FrameType

import anyio
import msgspec
import structlog

from daemon.events import iso_ms

log = structlog.get_logger("daemon.loop")

#: Defaults: a stall is a timer run 250 ms late, measured every 100 ms.
THRESHOLD_SECONDS = 0.25
INTERVAL_SECONDS = 0.1
QUIET_SECONDS = 60.0
FRAMES = 6  # of the loop's thread, innermost, in a stall's warning


def where(frame: FrameType | None) -> str:
    """The innermost :data:`FRAMES` frames from ``frame`` outwards, innermost first:
    ``file:line function`` (the file's last two path parts). The import system's
    own frames are left out; each module being imported shows as ``import NAME``."""
    parts: list[str] = []
    while frame is not None and len(parts) < FRAMES:
        code = frame.f_code
        if code.co_filename.startswith("<frozen importlib"):
            name = frame.f_locals.get("name") if code.co_name == "_find_and_load" else None
            if isinstance(name, str):
                parts.append(f"import {name}")
        else:
            file = "/".join(code.co_filename.split("/")[-2:])
            parts.append(f"{file}:{frame.f_lineno} {code.co_name}")
        frame = frame.f_back
    return " < ".join(parts)


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
        sample: bool = True,
    ) -> None:
        self.threshold, self.interval, self.quiet = threshold, interval, quiet
        self._now, self._wall, self._cpu, self._sleep = now, wall, cpu, sleep
        self.stalls = 0
        self.longest = 0.0
        self.last = 0.0
        self.last_at = 0.0  # wall time
        self._logged_at: float | None = None  # monotonic time of the last warning
        self._unlogged = 0  # stalls since it
        self._sample = sample  # run the thread that finds where a stall is
        self._due = float("inf")  # when the loop should wake the watch next
        self._seen_due = 0.0  # the wake the sampled frames are for
        self._seen_at = ""  # and those frames

    def observe(self, late: float, cpu: float, at: str = "") -> None:
        """One wake ``late`` seconds after its time; ``cpu``: the seconds of CPU the
        loop's thread used from the sleep to the wake; ``at``: where the loop's
        thread was meanwhile (:func:`where`), if known."""
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
            at=at or "unknown",
        )
        self._logged_at, self._unlogged = now, 0

    async def run(self) -> None:
        """Measure until cancelled (with the sampling thread, if ``sample``)."""
        stop = threading.Event()
        if self._sample:
            loop_thread = threading.get_ident()
            threading.Thread(
                target=self._sampler, args=(loop_thread, stop), name="loop watch", daemon=True
            ).start()
        try:
            while True:
                start, cpu = self._now(), self._cpu()
                self._due = due = start + self.interval
                await self._sleep(self.interval)
                at = self._seen_at if self._seen_due == due else ""
                self.observe(self._now() - due, self._cpu() - cpu, at)
        finally:
            stop.set()

    def _sampler(self, loop_thread: int, stop: threading.Event) -> None:
        """Once the loop is ``threshold / 2`` late for the watch's wake, keep where its
        thread is (once per wake)."""
        while not stop.wait(self.threshold / 2):
            due = self._due
            if due != self._seen_due and self._now() - due >= self.threshold / 2:
                at = where(sys._current_frames().get(loop_thread))
                self._seen_at, self._seen_due = at, due

    def status(self) -> LoopStalls:
        return LoopStalls(
            threshold_ms=round(self.threshold * 1000, 1),
            stalls=self.stalls,
            longest_ms=round(self.longest * 1000, 1),
            last_ms=round(self.last * 1000, 1),
            last_at=iso_ms(int(self.last_at * 1000)) if self.stalls else "",
        )
