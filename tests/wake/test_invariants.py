"""Invariants of the wake scheduler over seeded random wake streams."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from daemon.audit.records import WakeRecord
from daemon.wake.scheduler import HOUR
from tests.wake.helpers import GateRunner, Harness, policy, wake


@pytest.mark.parametrize("mode", ["collect", "immediate"])
@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_every_wake_recorded_and_budget_never_exceeded(
    tmp_path: Path, mode: str, seed: int
) -> None:
    """Each submit gets a matching record; runs per hour never exceed the budget; every
    merged wake reaches a run or a suppressed record."""
    rng = random.Random(seed)
    pol = policy(
        max_runs_per_hour=4,
        cooldown_after_run_seconds=90,
        debounce_seconds=10,
        max_collected=5,
        queue_mode=mode,
        audit_interval_seconds=1200,
    )
    runner = GateRunner()
    h = Harness(tmp_path, pol, runner=runner)
    outcomes = []
    async with h.running():
        for i in range(200):
            if rng.random() < 0.03:
                h.sched.set_paused(not h.sched.paused)
            outcomes.append(h.sched.submit(wake(i, hook=f"h{i % 3}")))
            await h.settle()
            await h.advance(rng.choice([1, 5, 30, 120, 600]))
        h.sched.set_paused(False)
        await h.advance(3 * HOUR)
    by_event: dict[str, list[WakeRecord]] = {}
    for r in h.wakes():
        if r.event_id is not None:
            by_event.setdefault(r.event_id, []).append(r)
    assert len(by_event) == len(outcomes)
    for i, out in enumerate(outcomes):
        rec, *later = by_event[f"ev{i}"]
        assert [x.outcome for x in later] in ([], ["suppressed"])
        assert (rec.outcome, rec.suppressed_by, rec.run_id) == (
            out.outcome,
            out.suppressed_by,
            out.run_id,
        )
        assert (rec.suppressed_by == "none") == (out.outcome != "suppressed")
    assert any(c.kind == "wake" for c in runner.contexts), "the stream should wake the agent"
    _assert_window(h, 4)
    ran = {r.event_id for c in runner.contexts for r in c.reasons}
    summarized = sum(c.earlier_count for c in runner.contexts)
    for r in h.wakes("suppressed"):
        if r.event_id is None and r.hook_ids != ["audit"]:  # a dropped run's summary line
            summarized += int(r.reasons[0].split()[1])
    accepted = {f"ev{i}" for i, o in enumerate(outcomes) if o.outcome != "suppressed"}
    dropped = {r.event_id for r in h.wakes("suppressed")} & accepted
    assert len(accepted - ran - dropped) == summarized


def _assert_window(h: Harness, limit: int) -> None:
    """No hour of manual time holds more than ``limit`` wake-run starts."""
    times = h.store.starts_since("a1", 0.0)
    for i, t in enumerate(times):
        assert sum(1 for u in times[i:] if u < t + HOUR) <= limit
