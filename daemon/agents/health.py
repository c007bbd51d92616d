"""Per-hook health: counters for ``status`` and one log line per transition.

A hook is ``ok``, ``failing`` (its last evaluation failed; the breaker backs it
off) or ``paused``. Each change is logged once at WARNING (a hook starts
failing, is paused, recovers), so an infinite-loop hook shows up in the log
and in ``marketwake status``, not only as thousands of audit rows. Sans-I/O
apart from the logger: fed the result kinds the dispatcher settles.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import structlog

from daemon.status import HookHealth

log = structlog.get_logger("hooks")

State = Literal["ok", "failing", "paused"]
Key = tuple[str, str]  # (agent_id, hook_id)


@dataclass
class _Counters:
    evaluations: int = 0
    timeouts: int = 0
    errors: int = 0
    backoffs: int = 0
    state: State = "ok"
    last_error: str | None = None


class HealthTracker:
    """Counts results per hook and logs state transitions."""

    def __init__(self) -> None:
        self._hooks: dict[Key, _Counters] = {}

    def record(
        self, agent_id: str, hook_id: str, error_kind: str | None, error: str | None
    ) -> State:
        """One settled result (``error_kind`` None = a valid decision); the new state."""
        c = self._hooks.get((agent_id, hook_id))
        if c is None:  # (not setdefault: that builds a _Counters for every result)
            c = self._hooks[(agent_id, hook_id)] = _Counters()
        if error_kind == "backoff":
            c.backoffs += 1
            return c.state
        if error_kind == "paused":
            self._move(agent_id, hook_id, c, "paused")
            return c.state
        c.evaluations += 1
        if error_kind is None:
            self._move(agent_id, hook_id, c, "ok")
            return c.state
        if error_kind == "timeout":
            c.timeouts += 1
        else:
            c.errors += 1
        c.last_error = f"{error_kind}: {error or ''}"[:300]
        if c.state == "ok":
            self._move(agent_id, hook_id, c, "failing")
        return c.state

    def resumed(self, agent_id: str, hook_id: str) -> None:
        """An operator lifted the pause: back to failing until a success says ok."""
        c = self._hooks.get((agent_id, hook_id))
        if c is not None and c.state == "paused":
            c.state = "failing"

    def forget(self, agent_id: str) -> None:
        """The agent is gone."""
        for key in [k for k in self._hooks if k[0] == agent_id]:
            del self._hooks[key]

    def of(self, agent_id: str) -> dict[str, HookHealth]:
        """The agent's hooks, for ``status``."""
        return {
            hook: HookHealth(
                evaluations=c.evaluations,
                timeouts=c.timeouts,
                errors=c.errors,
                backoffs=c.backoffs,
                state=c.state,
                last_error=c.last_error,
            )
            for (agent, hook), c in sorted(self._hooks.items())
            if agent == agent_id
        }

    @staticmethod
    def _move(agent_id: str, hook_id: str, c: _Counters, new: State) -> None:
        if c.state == new:
            return
        old, c.state = c.state, new
        fields = {"agent": agent_id, "hook": hook_id, "timeouts": c.timeouts, "errors": c.errors}
        if new == "failing":
            log.warning("hook failing", last_error=c.last_error, **fields)
        elif new == "paused":
            log.warning(
                "hook paused: `marketwake hooks resume` lifts it",
                last_error=c.last_error,
                **fields,
            )
        else:
            log.warning("hook recovered", was=old, **fields)
