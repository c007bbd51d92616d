"""Backoff and pause for failing hooks: a pure state machine with an injectable clock.

A hook that fails (compile error, runtime error, invalid result, timeout, crash)
is skipped for ``base * 2**(n-1)`` seconds (capped) after its n-th consecutive
failure, and paused after ``pause_after`` consecutive failures until someone
calls :meth:`HookBreaker.resume`. One success clears its record; a new revision
starts from a clean slate (the author presumably fixed it). Persisting pauses
across restarts is the caller's job: :meth:`paused` lists them and
:meth:`pause` restores one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from daemon.backoff import backoff_delay

Key = tuple[str, str]  # (agent_id, hook_id)
Gate = Literal["backoff", "paused"]


@dataclass
class _Track:
    revision: str
    failures: int = 0
    until: float = 0.0
    paused: bool = False
    last_error: str = ""


class HookBreaker:
    """Decides whether a hook may run now, from its recent failures."""

    def __init__(
        self,
        base_seconds: float,
        max_seconds: float,
        pause_after: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._base = base_seconds
        self._max = max_seconds
        self._pause_after = pause_after
        self._clock = clock
        self._tracks: dict[Key, _Track] = {}

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
            return "paused", (
                f"paused after {t.failures} consecutive failures (last: {t.last_error}); "
                "lift with `marketwake hooks resume`"
            )
        left = t.until - (self._clock() if now is None else now)
        if left > 0:
            return "backoff", f"backing off {left:.1f}s after {t.failures} failure(s)"
        return None

    def record(self, key: Key, revision: str, error: str | None, now: float | None = None) -> None:
        """Record the outcome of an evaluation that actually ran (at ``now``, if given)."""
        if error is None:
            self._tracks.pop(key, None)
            return
        t = self._tracks.get(key)
        if t is None or t.revision != revision:
            t = self._tracks[key] = _Track(revision)
        t.failures += 1
        t.last_error = error[:200]
        if t.failures >= self._pause_after:
            t.paused = True
        else:
            delay = backoff_delay(t.failures - 1, self._base, self._max, jitter=0)
            t.until = (self._clock() if now is None else now) + delay

    def pause(self, key: Key, revision: str, reason: str) -> None:
        """Pause a hook explicitly (for example when restoring persisted pauses)."""
        self._tracks[key] = _Track(revision, self._pause_after, 0.0, True, reason[:200])

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
