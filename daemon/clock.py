"""The daemon's one notion of time: wall clock live, event time in replays.

Everything time-dependent (wake budgets, debounce, cooldown after a run, hook
backoff, and the service's feed-stall and watchdog timers) takes a :class:`Clock`. Live it is :class:`SystemClock`. In a replay
or backtest it is an :class:`EventClock`: the time of the last event applied,
so a replay answers "how often would this agent wake?" the same at any speed.
:class:`ManualClock` moves only when a test says so.

Clocks work in epoch seconds (not monotonic time) because budgets and
cooldowns are persisted and must mean the same thing after a restart; only
liveness timers, never persisted, use :class:`MonotonicClock`. This
module imports nothing from the project, so every layer may take a clock.
"""

from __future__ import annotations

import time
from typing import Protocol

import anyio
import anyio.lowlevel

MAX_NAP = 30.0


class Clock(Protocol):
    """Tells the time and sleeps until a given time."""

    def now(self) -> float:
        """Epoch seconds."""
        ...

    async def sleep_until(self, deadline: float) -> None:
        """Return once ``now() >= deadline``."""
        ...


class SystemClock:
    """Wall-clock time; sleeps with anyio."""

    def now(self) -> float:
        """Epoch seconds from ``time.time``."""
        return time.time()

    async def sleep_until(self, deadline: float) -> None:
        """Sleep until ``deadline``, re-reading the clock at least every ``MAX_NAP`` s.

        Napping in slices keeps a wall-clock step (NTP, suspend) from stretching
        a wait by the size of the step.
        """
        while (left := deadline - time.time()) > 0:  # noqa: ASYNC110 (time is the event)
            await anyio.sleep(min(left, MAX_NAP))


class MonotonicClock:
    """Seconds that never step back (``time.monotonic``): for liveness timers,
    which must not see an NTP step as silence."""

    def now(self) -> float:
        """Seconds from ``time.monotonic``."""
        return time.monotonic()

    async def sleep_until(self, deadline: float) -> None:
        """Sleep until ``deadline`` on the monotonic clock."""
        left = deadline - time.monotonic()
        if left > 0:
            await anyio.sleep(left)
        else:
            await anyio.lowlevel.checkpoint()


class ManualClock:
    """A clock that moves only when told, so tests cover hours without waiting."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self._now = start
        self._sleepers: list[tuple[float, anyio.Event]] = []

    def now(self) -> float:
        """The current manual time."""
        return self._now

    async def sleep_until(self, deadline: float) -> None:
        """Wait until :meth:`advance` moves the clock past ``deadline``."""
        if deadline <= self._now:
            await anyio.lowlevel.checkpoint()
            return
        entry = (deadline, anyio.Event())
        self._sleepers.append(entry)
        try:
            await entry[1].wait()
        finally:
            if entry in self._sleepers:
                self._sleepers.remove(entry)

    def advance(self, seconds: float) -> None:
        """Move time forward and wake every sleeper whose deadline passed."""
        self._now += seconds
        for deadline, event in list(self._sleepers):
            if deadline <= self._now:
                event.set()


class EventClock(ManualClock):
    """Event time: :meth:`advance_to` an event's time as it is applied (never backwards).

    Before the first event it reads ``start`` (0 by default: the epoch), which
    callers treat as "no time yet"."""

    def __init__(self, start: float = 0.0) -> None:
        super().__init__(start)

    @property
    def started(self) -> bool:
        """Whether any event time has been applied."""
        return self._now > 0

    def advance_to(self, t: float) -> None:
        """Move to ``t`` if it is later; wake sleepers whose deadline passed."""
        if t > self._now:
            self.advance(t - self._now)
