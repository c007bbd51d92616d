"""What each agent has finished, per market partition: at least once, applied once.

A restart re-delivers (a replay starts over, the candle poller re-emits), and
an agent must not evaluate again what it already evaluated. Each agent keeps
a mark per market partition: the last event it finished (evaluated, audited,
acted on). A re-delivered event at or before the mark is applied to the
agent's state cache (which ignores what it already holds) but not evaluated.

Marks are persisted (``applied`` table of the hook store) only once the audit
rows of the events they cover have been handed to the OS (:attr:`AuditWriter.durable`),
so a persisted mark never claims an evaluation the audit log lost. They may
lag the audit by a flush; the events of that gap are found again at start from
the newest audit rows (:func:`daemon.audit.reader.recent_evaluations`) and
skipped as already seen.

Only ``market.*`` partitions are marked: their events come in time order per
partition. Other events (account, signals) are deduplicated by event id.
"""

from __future__ import annotations

from collections import deque

import anyio
import structlog

from daemon.agents.store import HookStore
from daemon.audit.writer import AuditWriter
from daemon.errors import StoreError
from daemon.events import NO_MARK, FeedEvent, Mark, event_mark

log = structlog.get_logger("checkpoints")


def marked(event: FeedEvent) -> bool:
    """Whether ``event``'s partition carries applied marks."""
    return event.topic.startswith("market.")


def covers(mark: Mark | None, event: Mark) -> bool:
    """Whether a partition finished up to ``mark`` has finished the event at ``event``."""
    if mark is None or event == NO_MARK:
        return False
    return event[0] < mark[0] or event == mark


class Checkpoints:
    """Applied marks of every agent; :meth:`run` persists them behind the audit log."""

    def __init__(self, store: HookStore, audit: AuditWriter) -> None:
        self.store = store
        self.audit = audit
        self._marks: dict[str, dict[str, Mark]] = {}
        # (audit sequence when finished, agent, partition, mark), oldest first
        self._unsaved: deque[tuple[int, str, str, Mark]] = deque()
        self.skipped = 0
        self.saved = 0

    def load(self, agent_id: str) -> None:
        """Read an agent's persisted marks (when it starts)."""
        self._marks[agent_id] = self.store.applied(agent_id)

    def done_before(self, agent_id: str, event: FeedEvent) -> bool:
        """Whether the agent already finished ``event`` (in this run or an earlier one)."""
        if not marked(event):
            return False
        marks = self._marks.get(agent_id)
        return marks is not None and covers(marks.get(event.partition), event_mark(event))

    def finished(self, agent_id: str, event: FeedEvent) -> None:
        """The agent is done with ``event``: its audit rows are already written."""
        if not marked(event):
            return
        mark = event_mark(event)
        marks = self._marks.setdefault(agent_id, {})
        if mark == NO_MARK or mark <= marks.get(event.partition, NO_MARK):
            return
        marks[event.partition] = mark
        self._unsaved.append((self.audit.accepted, agent_id, event.partition, mark))

    def save(self) -> int:
        """Persist the marks whose audit rows are durable; returns how many were written."""
        durable = self.audit.durable
        latest: dict[tuple[str, str], Mark] = {}
        while self._unsaved and self._unsaved[0][0] <= durable:
            _, agent, partition, mark = self._unsaved.popleft()
            latest[(agent, partition)] = mark
        rows = [(a, p, m[0], m[1]) for (a, p), m in latest.items()]
        try:
            self.store.save_applied(rows)
        except StoreError as exc:  # next time: restart memory, not correctness, is at stake
            log.error("applied marks not saved", error=str(exc))
            return 0
        self.saved += len(rows)
        return len(rows)

    async def run(self, interval: float) -> None:
        """Save marks every ``interval`` seconds (cancel to stop; then flush and save)."""
        while True:
            await anyio.sleep(interval)
            self.save()

    async def close(self) -> None:
        """At stop: hand every audit row to the OS, then save every mark (of the rows
        that are durable: after a failed flush, the marks that cover them wait)."""
        try:
            await self.audit.flush()
        except StoreError as exc:  # (a full disk) the audit's own stop reports the loss
            log.error("audit rows not written; their marks are not saved", error=str(exc))
        self.save()

    def resume_points(self, agents: list[str]) -> dict[str, int]:
        """Per partition, the oldest event time any of ``agents`` finished there: a
        feed re-delivers what follows (agents without a mark see everything anyway:
        a replay fast-forwards but still publishes every event)."""
        out: dict[str, int] = {}
        for agent in agents:
            for partition, (ts, _) in self._marks.get(agent, {}).items():
                out[partition] = min(ts, out.get(partition, ts))
        return out

    def reset(self) -> None:
        """Forget every mark, stored ones included (a replay started over)."""
        self.store.reset_applied()
        self._marks.clear()
        self._unsaved.clear()

    def statistics(self) -> dict[str, int]:
        """For status: events skipped as already applied, marks saved, marks waiting."""
        return {"skipped": self.skipped, "saved": self.saved, "unsaved": len(self._unsaved)}
