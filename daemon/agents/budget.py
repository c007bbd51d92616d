"""How much hook time an agent may use (live), so one busy agent cannot starve the rest.

Each agent's hooks run in its own worker process, but the machine's cores are
shared: an agent whose hooks take 230 ms per event would use a core on its
own and slow every other agent's worker. Its budget is a share of one core
over a sliding window (``[hooks] cpu_budget_share`` of
``cpu_budget_window_seconds``), counted in the evaluation times the workers
report. An agent over it waits before its next evaluation until the window
lets it in again; meanwhile its events queue, and spill to its backlog on
disk, and nobody else waits. On event time (replays) there is no budget:
simulated time has no cores to share.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable


class CpuBudget:
    """Per agent, hook milliseconds within the window, and the wait that keeps them
    within ``share`` of it."""

    def __init__(
        self, share: float, window_seconds: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.budget_ms = share * window_seconds * 1000
        self.window = window_seconds
        self._clock = clock
        self._spent: dict[str, deque[tuple[float, float]]] = {}
        self._totals: dict[str, float] = {}

    def record(self, agent: str, ms: float) -> None:
        """``agent``'s hooks just used ``ms`` of evaluation time."""
        self._spent.setdefault(agent, deque()).append((self._clock(), ms))
        self._totals[agent] = self._totals.get(agent, 0.0) + ms

    def spent(self, agent: str) -> float:
        """Milliseconds used within the window."""
        self._expire(agent, self._clock())
        return self._totals.get(agent, 0.0)

    def delay(self, agent: str) -> float:
        """Seconds ``agent`` must wait before its next evaluation (0: within budget)."""
        now = self._clock()
        self._expire(agent, now)
        total = self._totals.get(agent, 0.0)
        if total <= self.budget_ms:
            return 0.0
        for t, ms in self._spent[agent]:  # oldest first: when enough has expired
            total -= ms
            if total <= self.budget_ms:
                return max(0.0, t + self.window - now)
        return 0.0

    def forget(self, agent: str) -> None:
        """The agent is gone."""
        self._spent.pop(agent, None)
        self._totals.pop(agent, None)

    def _expire(self, agent: str, now: float) -> None:
        entries = self._spent.get(agent)
        while entries and entries[0][0] <= now - self.window:
            self._totals[agent] -= entries.popleft()[1]
