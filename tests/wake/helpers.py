"""Shared pieces of the wake tests: a controllable runner and a running scheduler."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import msgspec

from daemon.audit.records import AuditRecord, RunRecord, WakeRecord
from daemon.clock import ManualClock
from daemon.wake.context import RunResult, WakeContext, WakeRequest
from daemon.wake.policy import WakePolicy
from daemon.wake.scheduler import WakeScheduler
from daemon.wake.store import RunStore


async def settle() -> None:
    """Yield until every other task waits on something.

    ``anyio.wait_all_tasks_blocked`` does the same but sleeps 0.1 s per busy
    round; this spins with zero-length sleeps (the tests pin asyncio). Quiet
    must hold for several loop rounds, because a finished child wakes its task
    group through a ``call_soon`` callback that no task shows as pending.
    """
    me = asyncio.current_task()
    quiet = 0
    for _ in range(10_000):
        await asyncio.sleep(0)
        busy = any(
            t is not me and (t._fut_waiter is None or t._fut_waiter.done())  # type: ignore[attr-defined]
            for t in asyncio.all_tasks()
        )
        quiet = 0 if busy else quiet + 1
        if quiet >= 20:
            return
    raise AssertionError("tasks never settled")


class GateRunner:
    """Records every context; while ``hold`` is set, a run waits for ``release``."""

    name = "gate"

    def __init__(self, *, hold: bool = False) -> None:
        self.hold = hold
        self.release = anyio.Event()
        self.contexts: list[WakeContext] = []

    async def run(self, ctx: WakeContext) -> RunResult:
        self.contexts.append(ctx)
        if self.hold:
            await self.release.wait()
            self.release = anyio.Event()
        return RunResult(status="ok")


def policy(**overrides: Any) -> WakePolicy:
    """A test policy: no debounce, no cooldown, a roomy budget unless overridden."""
    base: dict[str, Any] = {
        "max_runs_per_hour": 100,
        "cooldown_after_run_seconds": 0.0,
        "debounce_seconds": 0.0,
    }
    base.update(overrides)
    return msgspec.convert(base, WakePolicy)


def wake(n: int, hook: str = "wake_two_green", agent: str = "a1") -> WakeRequest:
    """The n-th wake of a test, with ids derived from n."""
    return WakeRequest(
        agent_id=agent,
        hook_id=hook,
        reason=f"reason {n}",
        event_id=f"ev{n}",
        trace_id=f"tr{n}",
        symbol="BTC-USD",
        topic="market.candle.closed",
        ts="2026-02-17T03:05:00.000Z",
    )


class Harness:
    """A scheduler over a real SQLite store, a manual clock and a list sink."""

    def __init__(self, tmp: Path, pol: WakePolicy, runner: Any = None, **kw: Any) -> None:
        self.tmp = tmp
        self.clock = kw.pop("clock", None) or ManualClock()
        self.records: list[AuditRecord] = []
        self.runner = runner or GateRunner()
        durable = kw.pop("durable", True)
        self.store = RunStore(tmp / "wake.sqlite3", synchronous="NORMAL" if durable else "OFF")
        self.sched = WakeScheduler(
            "a1",
            pol,
            store=self.store,
            runner=self.runner,
            sink=self.records.append,
            clock=self.clock,
            **kw,
        )

    def wakes(self, outcome: str | None = None) -> list[WakeRecord]:
        found = [r for r in self.records if isinstance(r, WakeRecord)]
        return [r for r in found if outcome is None or r.outcome == outcome]

    def runs(self, status: str | None = None) -> list[RunRecord]:
        found = [r for r in self.records if isinstance(r, RunRecord)]
        return [r for r in found if status is None or r.status == status]

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Harness]:
        async with anyio.create_task_group() as tg:
            await tg.start(self.sched.run)
            yield self
            tg.cancel_scope.cancel()

    async def settle(self) -> None:
        """Let the scheduler act on everything submitted so far."""
        await settle()

    async def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        await self.settle()
