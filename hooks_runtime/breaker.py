"""Backoff and pause for failing hooks: a pure state machine with an injectable clock.

A hook that fails (compile error, runtime error, invalid result, timeout, crash)
is skipped for ``base * 2**(n-1)`` seconds (capped) after its n-th consecutive
failure, and paused until someone calls :meth:`HookBreaker.resume` once
``pause_after`` of its last ``window`` evaluations failed: failing on every
other event cannot dodge the pause, since a success ends the backoff but not
the count. A new revision starts from a clean slate (the author presumably
fixed it).

Each agent also has a worker-restart budget: failures that cost a worker
(timeouts, crashes, memory) are counted per agent over ``restart_window``
seconds, and past ``max_restarts`` every hook that caused one in the window
is paused, so twenty hooks that each fail rarely cannot keep a core busy
restarting workers. Persisting pauses across restarts is the caller's job:
:meth:`paused` lists them and :meth:`pause` restores one.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import structlog

from daemon.backoff import backoff_delay

log = structlog.get_logger("hooks")
# Failures after which the worker is killed or gone: they count against the budget.
RESTARTING: frozenset[str] = frozenset({"timeout", "crashed", "memory"})

Key = tuple[str, str]  # (agent_id, hook_id)
Gate = Literal["backoff", "paused"]


@dataclass
class _Track:
    revision: str
    failures: int = 0  # consecutive, for the backoff delay
    until: float = 0.0
    paused: bool = False
    last_error: str = ""
    recent: deque[bool] = field(default_factory=deque)  # last evaluations: failed?


class HookBreaker:
    """Decides whether a hook may run now, from its recent failures."""

    def __init__(
        self,
        base_seconds: float,
        max_seconds: float,
        pause_after: int,
        clock: Callable[[], float] = time.monotonic,
        *,
        window: int = 20,
        max_restarts: int = 20,
        restart_window: float = 300.0,
    ) -> None:
        self._base = base_seconds
        self._max = max_seconds
        self._pause_after = pause_after
        self._window = max(window, pause_after)
        self._max_restarts = max_restarts
        self._restart_window = restart_window
        self._clock = clock
        self._tracks: dict[Key, _Track] = {}
        self._restarts: dict[str, deque[tuple[float, str]]] = {}

    @property
    def idle(self) -> bool:
        """True while no hook has a failure on record: every gate is open and
        recording a success changes nothing."""
        return not self._tracks

    def gate(self, key: Key, revision: str, now: float | None = None) -> tuple[Gate, str] | None:
        """None when the hook may run; else why not (``backoff`` or ``paused``).

        ``now`` overrides the clock (the caller's event time in a replay)."""
        t = self._tracks.get(key)
        if t is None:
            return None
        if t.revision != revision:
            del self._tracks[key]
            return None
        if t.paused:
            failed = sum(t.recent)
            why = (
                f"{failed} failures in its last {len(t.recent)} evaluations"
                if failed
                else "an earlier run"
            )
            return "paused", (
                f"paused after {why} (last: {t.last_error}); lift with `marketwake hooks resume`"
            )
        left = t.until - (self._clock() if now is None else now)
        if left > 0:
            return "backoff", f"backing off {left:.1f}s after {t.failures} failure(s)"
        return None

    def record(
        self,
        key: Key,
        revision: str,
        error: str | None,
        now: float | None = None,
        kind: str | None = None,
    ) -> None:
        """Record the outcome of an evaluation that actually ran (at ``now``, if given);
        ``kind`` is the error kind (a timeout or crash also counts against the agent's
        restart budget)."""
        t = self._tracks.get(key)
        if t is None or t.revision != revision:
            if error is None:
                return  # healthy and unknown: nothing to keep
            t = self._tracks[key] = _Track(revision, recent=deque(maxlen=self._window))
        t.recent.append(error is not None)
        at = self._clock() if now is None else now
        if error is None:
            t.failures, t.until = 0, 0.0
            if not any(t.recent):
                del self._tracks[key]
            return
        t.failures += 1
        t.last_error = error[:200]
        if sum(t.recent) >= self._pause_after:
            t.paused = True
        else:
            delay = backoff_delay(t.failures - 1, self._base, self._max, jitter=0)
            t.until = at + delay
        if kind in RESTARTING:
            self._restarted(key, at)

    def _restarted(self, key: Key, at: float) -> None:
        """Count a worker restart against the agent's budget; past it, pause every hook
        that caused one in the window."""
        agent, hook = key
        seen = self._restarts.setdefault(agent, deque())
        seen.append((at, hook))
        while seen and seen[0][0] <= at - self._restart_window:
            seen.popleft()
        if len(seen) <= self._max_restarts:
            return
        culprits = sorted({h for _, h in seen})
        log.warning(
            "agent over its worker-restart budget: pausing the hooks that caused restarts",
            agent=agent,
            restarts=len(seen),
            window_seconds=self._restart_window,
            budget=self._max_restarts,
            hooks=culprits,
        )
        for h in culprits:
            t = self._tracks.get((agent, h))
            if t is not None:
                t.paused = True
                t.last_error = (
                    f"{len(seen)} worker restarts in {self._restart_window:g} s (budget "
                    f"{self._max_restarts}); last: {t.last_error}"
                )[:200]
        seen.clear()

    def pause(self, key: Key, revision: str, reason: str) -> None:
        """Pause a hook explicitly (for example when restoring persisted pauses)."""
        self._tracks[key] = _Track(
            revision, self._pause_after, 0.0, True, reason[:200], deque(maxlen=self._window)
        )

    def resume(self, key: Key) -> bool:
        """Lift a pause or backoff; True when there was one."""
        return self._tracks.pop(key, None) is not None

    def paused(self) -> dict[Key, tuple[str, str]]:
        """Paused hooks: key -> (revision, last error)."""
        return {k: (t.revision, t.last_error) for k, t in self._tracks.items() if t.paused}

    def failures(self, key: Key) -> int:
        """Consecutive failures currently on record."""
        t = self._tracks.get(key)
        return t.failures if t else 0
