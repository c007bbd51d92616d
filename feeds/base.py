"""What every feed plugin looks like to the service.

A feed is an object with a ``name`` and an async ``run`` that publishes
FeedEvents through the ``publish`` callable until cancelled. Feeds know nothing
about the bus or agents: ``publish`` is all they get. ``run`` calls
``task_status.started()`` once it is up (connected, first poll done, file
opened), which is what READY=1 waits for. It calls ``health.beat()`` whenever
it hears from its source (a message, a heartbeat, a successful poll) so the
service can tell a live feed from a stalled one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Protocol, runtime_checkable

from anyio.abc import TaskStatus

from daemon.events import Publish

__all__ = ["Feed", "FeedHealth", "Publish"]


class FeedHealth:
    """Liveness of one feed, judged by the time since it last heard its source."""

    __slots__ = ("_now", "errors", "last_beat", "name")

    def __init__(self, name: str, now: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self._now = now
        self.last_beat = now()
        self.errors = 0

    def beat(self) -> None:
        """Record that the source just said something."""
        self.last_beat = self._now()

    def error(self) -> None:
        """Count a recorded (non-fatal) error."""
        self.errors += 1

    def silent_for(self, now: float | None = None) -> float:
        """Seconds since the last beat."""
        return (self._now() if now is None else now) - self.last_beat


class Feed(Protocol):
    """A source of FeedEvents."""

    name: str

    async def run(
        self, publish: Publish, health: FeedHealth, *, task_status: TaskStatus[None]
    ) -> None:
        """Publish events until cancelled; call ``task_status.started()`` once up."""
        ...


@runtime_checkable
class Resumable(Protocol):
    """A finite feed that can fast-forward through what the agents already finished."""

    def resume_after(self, marks: Mapping[str, int]) -> None:
        """Before ``run``: per partition, the event time (ms) every agent finished."""
        ...
