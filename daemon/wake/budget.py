"""A sliding-window run budget: at most ``max_runs`` starts in any ``window`` seconds.

Pure and clock-free: callers pass ``now`` (epoch seconds), so tests slide the
window without sleeping and a restart can rebuild it from stored start times.
Memory is bounded: only the last ``max_runs`` starts can matter, so only they
are kept.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable


class SlidingWindowBudget:
    """Counts run starts inside a trailing window."""

    def __init__(self, max_runs: int, window: float = 3600.0, starts: Iterable[float] = ()) -> None:
        if max_runs < 0 or window <= 0:
            raise ValueError("max_runs must be >= 0 and window > 0")
        self.max_runs = max_runs
        self.window = window
        self._starts: deque[float] = deque(sorted(starts)[-max_runs:] if max_runs else (), max_runs)

    def _trim(self, now: float) -> None:
        while self._starts and self._starts[0] <= now - self.window:
            self._starts.popleft()

    def used(self, now: float) -> int:
        """Starts inside the window ending at ``now``."""
        self._trim(now)
        return len(self._starts)

    def allows(self, now: float, reserved: int = 0) -> bool:
        """Whether one more start fits, after ``reserved`` starts already promised."""
        return self.used(now) + reserved < self.max_runs

    def record(self, ts: float) -> None:
        """Count a start at ``ts``."""
        if self.max_runs:
            self._starts.append(ts)

    def next_free_at(self, now: float) -> float | None:
        """When the next start fits (``now`` if it fits already; None if never)."""
        if self.max_runs == 0:
            return None
        if self.used(now) < self.max_runs:
            return now
        return self._starts[0] + self.window

    def starts(self) -> list[float]:
        """The remembered start times, oldest first."""
        return list(self._starts)

    def resized(self, max_runs: int) -> SlidingWindowBudget:
        """The same history under a new limit (policy hot reload)."""
        return SlidingWindowBudget(max_runs, self.window, self._starts)
