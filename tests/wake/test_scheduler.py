"""WakeScheduler: budget, cooldown, collect and immediate modes, audits, pause, restart."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
import pytest

from daemon.audit.records import AuditRecord, LlmReport, RunRecord
from daemon.clock import ManualClock, SystemClock
from daemon.wake.context import RunResult, WakeContext
from daemon.wake.policy import WakePolicy
from daemon.wake.runners import Spent
from daemon.wake.scheduler import WakeScheduler
from daemon.wake.store import RunStore
from tests.wake.helpers import GateRunner, Harness, policy, wake


async def test_budget_suppresses_the_extra_run_until_the_window_slides(tmp_path: Path) -> None:
    """With 3 runs/hour the 4th wake is suppressed by budget; an hour later it runs again."""
    h = Harness(tmp_path, policy(max_runs_per_hour=3, queue_mode="immediate"))
    async with h.running():
        for i in range(3):
            assert h.sched.submit(wake(i)).outcome == "woke"
            await h.settle()
            await h.advance(60)
        out = h.sched.submit(wake(3))
        assert (out.outcome, out.suppressed_by) == ("suppressed", "budget")
        await h.advance(3600 - 3 * 60 + 1)  # the first run slides out of the window
        assert h.sched.submit(wake(4)).outcome == "woke"
        await h.settle()
    assert [c.reasons[0].event_id for c in h.runner.contexts] == ["ev0", "ev1", "ev2", "ev4"]
    [sup] = h.wakes("suppressed")
    assert (sup.suppressed_by, sup.event_id, sup.trace_id) == ("budget", "ev3", "tr3")
    assert sup.hook_ids == ["wake_two_green"] and sup.reasons == ["reason 3"]


async def test_cooldown_after_run_suppresses_then_expires(tmp_path: Path) -> None:
    """A wake within the cooldown after a run is suppressed; after it, the agent wakes."""
    h = Harness(tmp_path, policy(cooldown_after_run_seconds=60))
    async with h.running():
        h.sched.submit(wake(1))
        await h.settle()
        await h.advance(30)
        out = h.sched.submit(wake(2))
        assert (out.outcome, out.suppressed_by) == ("suppressed", "cooldown")
        await h.advance(30)
        assert h.sched.submit(wake(3)).outcome == "woke"
        await h.settle()
    assert len(h.runner.contexts) == 2
    assert [w.suppressed_by for w in h.wakes("suppressed")] == ["cooldown"]
    assert h.sched.counters["suppressed_cooldown"] == 1


async def test_collect_merges_wakes_during_a_run_into_one_follow_up(tmp_path: Path) -> None:
    """Wakes arriving while a run is in flight join exactly one follow-up run with all reasons."""
    runner = GateRunner(hold=True)
    h = Harness(tmp_path, policy(), runner=runner)
    async with h.running():
        first = h.sched.submit(wake(1))
        await h.settle()
        assert len(runner.contexts) == 1
        queued = [h.sched.submit(wake(i)) for i in (2, 3, 4)]
        assert {q.outcome for q in queued} == {"queued"}
        assert len({q.run_id for q in queued}) == 1 and queued[0].run_id != first.run_id
        runner.release.set()
        await h.settle()
        assert len(runner.contexts) == 2
        runner.release.set()
        await h.settle()
    follow_up = runner.contexts[1]
    assert follow_up.run_id == queued[0].run_id
    assert [r.reason for r in follow_up.reasons] == ["reason 2", "reason 3", "reason 4"]
    assert [r.trace_id for r in follow_up.reasons] == ["tr2", "tr3", "tr4"]
    assert follow_up.earlier is None
    assert len(h.runs("finished")) == 2
    assert h.runs("finished")[1].event_ids == ["ev2", "ev3", "ev4"]
    assert [r.wakes for r in h.runs("finished")] == [1, 3]


async def test_collect_debounce_window_merges_first_wakes(tmp_path: Path) -> None:
    """The first wake of an idle agent waits debounce_seconds; wakes inside it share the run."""
    h = Harness(tmp_path, policy(debounce_seconds=5))
    async with h.running():
        assert h.sched.submit(wake(1)).outcome == "queued"
        await h.advance(2)
        h.sched.submit(wake(2))
        await h.advance(2.9)
        assert h.runner.contexts == []
        await h.advance(0.2)
        assert len(h.runner.contexts) == 1
    assert [r.event_id for r in h.runner.contexts[0].reasons] == ["ev1", "ev2"]


async def test_collect_cap_summarizes_the_oldest(tmp_path: Path) -> None:
    """Beyond max_collected, the oldest wakes become one summary line in the context."""
    runner = GateRunner(hold=True)
    h = Harness(tmp_path, policy(max_collected=3), runner=runner)
    async with h.running():
        h.sched.submit(wake(0))
        await h.settle()
        hooks = ["two_green", "crash"] * 3 + ["two_green", "x", "y", "z"]
        for i, hook in enumerate(hooks, start=1):
            h.sched.submit(wake(i, hook=hook))
        runner.hold = False
        runner.release.set()
        await h.settle()
    ctx = runner.contexts[1]
    assert [r.hook_id for r in ctx.reasons] == ["x", "y", "z"]
    assert ctx.earlier == "...and 7 earlier wakes: 4x two_green, 3x crash"
    assert ctx.earlier_count == 7
    assert len(h.wakes("queued")) == 10  # every merged wake was still recorded


async def test_immediate_mode_runs_each_wake_subject_to_budget(tmp_path: Path) -> None:
    """Immediate mode gives each wake its own run, in order, and suppresses beyond the budget."""
    runner = GateRunner(hold=True)
    h = Harness(tmp_path, policy(queue_mode="immediate", max_runs_per_hour=3), runner=runner)
    async with h.running():
        outcomes = [h.sched.submit(wake(i)) for i in range(4)]
        assert [o.outcome for o in outcomes] == ["woke", "queued", "queued", "suppressed"]
        assert outcomes[3].suppressed_by == "budget"
        for _ in range(3):
            await h.settle()
            runner.release.set()
        await h.settle()
    assert [[r.event_id for r in c.reasons] for c in runner.contexts] == [["ev0"], ["ev1"], ["ev2"]]
    assert len({c.run_id for c in runner.contexts}) == 3


async def test_pending_run_waits_for_the_cooldown(tmp_path: Path) -> None:
    """A follow-up collected during a run starts only once the cooldown after that run ends."""
    runner = GateRunner(hold=True)
    h = Harness(tmp_path, policy(cooldown_after_run_seconds=30), runner=runner)
    async with h.running():
        h.sched.submit(wake(1))
        await h.settle()
        h.sched.submit(wake(2))
        runner.hold = False
        runner.release.set()
        await h.settle()
        await h.advance(29)
        assert len(runner.contexts) == 1
        await h.advance(1)
        assert len(runner.contexts) == 2


async def test_scheduled_audit_runs_fill_silence(tmp_path: Path) -> None:
    """An audit run starts after audit_interval without runs; a wake run resets the timer."""
    h = Harness(tmp_path, policy(audit_interval_seconds=600))
    async with h.running():
        await h.advance(599)
        assert h.runner.contexts == []
        await h.advance(1)
        assert [c.kind for c in h.runner.contexts] == ["audit"]
        await h.advance(300)
        h.sched.submit(wake(1))
        await h.settle()
        await h.advance(599)
        assert [c.kind for c in h.runner.contexts] == ["audit", "wake"]
        await h.advance(1)
    assert [c.kind for c in h.runner.contexts] == ["audit", "wake", "audit"]
    assert h.runner.contexts[0].reasons == [] and h.sched.counters["runs_audit"] == 2
    assert h.sched.budget.used(h.clock.now()) == 1  # audit runs do not use the wake budget


async def test_audit_runs_with_the_system_clock(tmp_path: Path) -> None:
    """With real time and a short interval, audit runs keep coming."""
    third = anyio.Event()

    class Counting(GateRunner):
        async def run(self, ctx: WakeContext) -> RunResult:
            result = await super().run(ctx)
            if len(self.contexts) == 3:
                third.set()
            return result

    runner = Counting()
    h = Harness(tmp_path, policy(audit_interval_seconds=0.02), runner=runner, clock=SystemClock())
    with anyio.fail_after(5):
        async with h.running():
            await third.wait()
    assert [c.kind for c in runner.contexts] == ["audit"] * 3


async def test_paused_agent_suppresses_wakes_and_drops_pending(tmp_path: Path) -> None:
    """A paused agent records wakes as suppressed by paused, including already pending ones."""
    h = Harness(tmp_path, policy(debounce_seconds=5, audit_interval_seconds=60))
    async with h.running():
        h.sched.submit(wake(1))
        h.sched.set_paused(True)
        out = h.sched.submit(wake(2))
        assert (out.outcome, out.suppressed_by) == ("suppressed", "paused")
        await h.advance(60)
        h.sched.set_paused(False)
        h.sched.submit(wake(3))
        await h.advance(5)
    assert [c.reasons[0].event_id for c in h.runner.contexts] == ["ev3"]
    paused = h.wakes("suppressed")
    assert [(w.event_id, w.suppressed_by) for w in paused] == [
        ("ev2", "paused"),
        ("ev1", "paused"),
        (None, "paused"),  # the audit run that came due while paused
    ]
    assert paused[2].hook_ids == ["audit"]
    # Only ev1 was queued as decided (its hook row says so): the row that drops it counts it.
    assert [w.dropped for w in paused] == [0, 1, 0]


async def test_budget_and_cooldown_survive_a_restart(tmp_path: Path) -> None:
    """Reopening the SQLite store restores the hourly budget and the post-run cooldown."""
    pol = policy(max_runs_per_hour=2, cooldown_after_run_seconds=120, queue_mode="immediate")
    h = Harness(tmp_path, pol)
    async with h.running():
        h.sched.submit(wake(1))
        await h.settle()
        await h.advance(200)
        h.sched.submit(wake(2))
        await h.settle()
    h.store.close()
    store = RunStore(tmp_path / "wake.sqlite3")
    again = WakeScheduler("a1", pol, store=store, runner=GateRunner(), clock=h.clock)
    assert again.submit(wake(3)).suppressed_by == "cooldown"
    h.clock.advance(120)
    assert again.submit(wake(4)).suppressed_by == "budget"
    h.clock.advance(3600 - 320 + 1)
    assert again.submit(wake(5)).outcome == "woke"
    store.close()


async def test_run_records_and_a_failing_runner(tmp_path: Path) -> None:
    """Each run has started/ended records; a runner that raises is a failed run, not a crash."""

    class Exploding:
        name = "boom"
        calls = 0

        async def run(self, ctx: WakeContext) -> RunResult:
            Exploding.calls += 1
            if Exploding.calls == 1:
                raise RuntimeError("kaput")
            return RunResult(status="ok", exit_code=0, stdout="done\n")

    h = Harness(tmp_path, policy(), runner=Exploding())
    async with h.running():
        first = h.sched.submit(wake(1))
        await h.settle()
        h.sched.submit(wake(2))
        await h.settle()
    started, failed, _, finished = h.runs()
    assert (started.status, started.run_id, started.trace_id) == ("started", first.run_id, "tr1")
    assert failed.status == "failed" and "kaput" in (failed.error or "")
    assert finished.status == "finished" and finished.duration_ms is not None
    assert finished.runner == "boom" and "stdout: done" in finished.summary
    assert h.wakes("woke")[0].run_id == first.run_id


async def test_state_snapshot_in_context(tmp_path: Path) -> None:
    """The context carries the provider's state; a provider that raises gives None."""
    snaps = iter([{"price": 1.5}])

    def provider(agent_id: str) -> dict[str, object]:
        return {"agent": agent_id, **next(snaps)}

    h = Harness(tmp_path, policy(), state=provider)
    async with h.running():
        h.sched.submit(wake(1))
        await h.settle()
        h.sched.submit(wake(2))
        await h.settle()
    assert h.runner.contexts[0].state == {"agent": "a1", "price": 1.5}
    assert h.runner.contexts[1].state is None


async def test_policy_update_keeps_history(tmp_path: Path) -> None:
    """A hot-reloaded policy applies at once and keeps the runs already counted."""
    h = Harness(tmp_path, policy(queue_mode="immediate"))
    async with h.running():
        h.sched.submit(wake(1))
        await h.settle()
        h.sched.update_policy(policy(max_runs_per_hour=1))
        assert h.sched.submit(wake(2)).suppressed_by == "budget"


def test_wake_for_another_agent_is_refused(tmp_path: Path) -> None:
    """Submitting another agent's wake is a wiring bug and says so."""
    h = Harness(tmp_path, policy())
    with pytest.raises(ValueError, match="sent to 'a1'"):
        h.sched.submit(wake(1, agent="other"))


async def test_dropped_run_records_its_summarized_wakes(tmp_path: Path) -> None:
    """When a collected run is dropped, its detailed wakes and its summary line are recorded."""
    runner = GateRunner(hold=True)
    h = Harness(tmp_path, policy(max_collected=2), runner=runner)
    async with h.running():
        h.sched.submit(wake(0))
        await h.settle()
        for i, hook in enumerate(["a", "b", "a", "c", "d"], start=1):
            h.sched.submit(wake(i, hook=hook))
        h.sched.set_paused(True)
        runner.release.set()
        await h.settle()
    assert len(runner.contexts) == 1
    dropped = h.wakes("suppressed")
    expected = [("ev4", "paused"), ("ev5", "paused")]
    assert [(w.event_id, w.suppressed_by) for w in dropped[:2]] == expected
    summary = dropped[2]
    assert summary.event_id is None and summary.hook_ids == ["a", "b"]
    assert summary.reasons == ["...and 3 earlier wakes: 2x a, 1x b"]
    assert [w.dropped for w in dropped] == [1, 1, 3]  # the five queued wakes


async def test_store_failure_does_not_stop_runs(tmp_path: Path) -> None:
    """If the run history cannot be written, runs still happen and the failure is counted."""
    h = Harness(tmp_path, policy(queue_mode="immediate"))
    h.store.close()  # every later write raises StoreError
    async with h.running():
        h.sched.submit(wake(1))
        await h.settle()
        h.sched.submit(wake(2))
        await h.settle()
    assert len(h.runner.contexts) == 2
    assert h.sched.counters["store_errors"] == 6  # per run: queue, start (unqueued with it), finish
    assert [r.status for r in h.runs()] == ["started", "finished"] * 2


async def test_command_runner_from_policy_end_to_end(tmp_path: Path) -> None:
    """A policy with a command runner pipes the context to the program; a slow
    program's run is recorded as timeout."""
    out = tmp_path / "ctx.json"
    code = f"import sys, pathlib; pathlib.Path({str(out)!r}).write_bytes(sys.stdin.buffer.read())"
    cmd = {"kind": "command", "command": [sys.executable, "-c", code], "timeout_seconds": 20}
    ended: list[RunRecord] = []
    done = [anyio.Event(), anyio.Event()]

    def sink(record: AuditRecord) -> None:
        if isinstance(record, RunRecord) and record.status != "started":
            ended.append(record)
            done[len(ended) - 1].set()

    store = RunStore(tmp_path / "wake.sqlite3")
    sched = WakeScheduler("a1", policy(runner=cmd), store=store, sink=sink)
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            await tg.start(sched.run)
            sched.submit(wake(1))
            await done[0].wait()
            slow = [sys.executable, "-c", "import time; time.sleep(30)"]
            sched.update_policy(policy(runner={**cmd, "command": slow, "timeout_seconds": 0.3}))
            sched.submit(wake(2))
            await done[1].wait()
            tg.cancel_scope.cancel()
    store.close()
    ctx = json.loads(out.read_bytes())
    assert ctx["agentId"] == "a1" and ctx["reasons"][0]["traceId"] == "tr1"
    assert [(r.status, r.runner) for r in ended] == [
        ("finished", "command"),
        ("timeout", "command"),
    ]
    assert ended[1].error == "killed after 0.3 s" and "timeout" in ended[1].summary


async def test_pending_runs_survive_a_restart_and_a_removed_agent_drops_them(
    tmp_path: Path,
) -> None:
    """A collect run still in its debounce when the scheduler stops is kept in the
    store; a new scheduler on the same store runs it when due, with its wakes and
    its summary of older ones. Abandoned without ``keep`` (the agent was removed),
    the wakes are recorded as suppressed by shutdown and nothing is left behind."""
    h = Harness(tmp_path, policy(debounce_seconds=5, max_collected=2))
    async with h.running():
        for i in (1, 2, 3):
            h.sched.submit(wake(i))
        assert h.sched.abandon_pending(keep=True) == 1
    assert h.runner.contexts == [] and not h.wakes("suppressed")

    again = Harness(tmp_path, policy(debounce_seconds=5, max_collected=2), clock=h.clock)
    assert again.sched.counters["restored"] == 1 and again.sched.busy
    async with again.running():
        await again.advance(5.1)
    (ctx,) = again.runner.contexts
    assert [r.event_id for r in ctx.reasons] == ["ev2", "ev3"] and ctx.earlier_count == 1
    assert again.store.pending("a1") == []

    (tmp_path / "other").mkdir()
    gone = Harness(tmp_path / "other", policy(debounce_seconds=5))
    gone.sched.submit(wake(4))
    assert gone.sched.abandon_pending(keep=False) == 1
    assert [w.suppressed_by for w in gone.wakes("suppressed")] == ["shutdown"]
    assert gone.store.pending("a1") == []


async def test_a_wake_taken_before_a_crash_joins_its_restored_run_not_a_second_one(
    tmp_path: Path,
) -> None:
    """The process died after a WAKE was queued (stored) but before its audit rows were
    written: the event comes again and its hook wakes again. That wake is the one
    the restored run already holds, so it is recorded as queued into that run and
    no second run starts (a second LLM run, billed twice). Another hook's wake on
    the same event, or a later event's, is decided as usual."""
    pol = policy(debounce_seconds=5)
    h = Harness(tmp_path, pol)
    first = h.sched.submit(wake(1))  # stored as it queued; then kill -9 (no stop)
    h.store.close()

    again = Harness(tmp_path, pol, clock=h.clock)
    assert again.sched.counters["restored"] == 1
    async with again.running():
        redo = again.sched.submit(wake(1))
        other = again.sched.submit(wake(1, hook="wake_other"))
        await again.advance(5.1)
    assert (redo.outcome, redo.run_id) == ("queued", first.run_id)
    assert (other.outcome, other.run_id) == ("queued", first.run_id)  # collect, as usual
    (ctx,) = again.runner.contexts
    assert [(r.event_id, r.hook_id) for r in ctx.reasons] == [
        ("ev1", "wake_two_green"),
        ("ev1", "wake_other"),
    ]
    assert [w.outcome for w in again.wakes()] == ["queued", "queued"]
    again.store.close()


async def test_a_scratch_store_keeps_queued_runs_at_a_clean_stop_only(tmp_path: Path) -> None:
    """Not durable (a backtest): no pending row is written as runs queue and start
    (two statements a run), but a clean stop still keeps what is queued, the next
    start runs it, and once started it is not restored again."""
    pol = policy(debounce_seconds=5, max_collected=2)
    h = Harness(tmp_path, pol, durable=False)
    async with h.running():
        for i in (1, 2, 3):
            h.sched.submit(wake(i))
        assert h.store.pending("a1") == []  # queued, not written
        assert h.sched.abandon_pending(keep=True) == 1
    assert len(h.store.pending("a1")) == 1  # written at the stop
    h.store.close()

    again = Harness(tmp_path, pol, clock=h.clock, durable=False)
    assert again.sched.counters["restored"] == 1
    async with again.running():
        again.sched.submit(wake(4))  # joins the restored run (collect)
        await again.advance(5.1)
    (ctx,) = again.runner.contexts
    assert [r.event_id for r in ctx.reasons] == ["ev3", "ev4"] and ctx.earlier_count == 2
    assert again.store.pending("a1") == []  # dropped when it started
    again.store.close()
    third = Harness(tmp_path, pol, clock=h.clock, durable=False)
    assert third.sched.counters["restored"] == 0


class PricedRunner:
    """Each run 'costs' a fixed amount, as an LLM run reports it."""

    name = "priced"

    def __init__(self, cost: float) -> None:
        self.cost = cost
        self.runs = 0

    async def run(self, ctx: WakeContext) -> RunResult:
        self.runs += 1
        report = LlmReport(provider="p", model="m", tokens_in=100, tokens_out=10, cost=self.cost)
        return RunResult(status="ok", llm=report)


async def test_daily_cost_cap_suppresses_until_the_utc_day_turns(tmp_path: Path) -> None:
    """Runs that spent max_cost_per_day since 00:00 UTC stop new runs (reason 'cost');
    the spend is persisted (a restarted scheduler knows it) and resets at midnight."""
    pol = policy(queue_mode="immediate", cooldown_after_run_seconds=0, max_cost_per_day=1.0)
    runner = PricedRunner(0.6)
    h = Harness(tmp_path, pol, runner=runner)  # the manual clock starts at 08:00 UTC
    async with h.running():
        for i in (1, 2):
            assert h.sched.submit(wake(i)).outcome == "woke"
            await h.settle()
        assert h.sched.submit(wake(3)).suppressed_by == "cost"
    assert runner.runs == 2 and h.sched.usage_today() == (2, 1.2, 200, 20)

    again = Harness(tmp_path, pol, runner=runner, clock=h.clock)
    assert again.sched.submit(wake(4)).suppressed_by == "cost"
    again.clock.advance(16 * 3600 + 1)  # past 00:00 UTC
    async with again.running():
        assert again.sched.submit(wake(5)).outcome == "woke"
        await again.settle()
    assert runner.runs == 3 and again.sched.usage_today()[:2] == (1, 0.6)


async def test_an_unreadable_queued_run_is_dropped_not_fatal(tmp_path: Path) -> None:
    """A garbled wake_pending row (a disk or a hand edit) costs that run only: the
    scheduler starts, restores the readable ones and forgets the bad one."""
    store = RunStore(tmp_path / "wake.sqlite3")
    store.save_pending("a1", "a1-bad", 1.0, b"\xff{not json")
    store.save_pending("a1", "a1-good", 2.0, b'{"wakes": [], "earlier": {"wake_x": 2}}')
    h = Harness(tmp_path, policy())
    assert h.sched.counters["restored"] == 1 and h.sched.busy
    assert [run_id for run_id, _, _ in h.store.pending("a1")] == ["a1-good"]


class ScriptedRunner:
    """Each run ends as the next of ``outcomes`` says."""

    name = "scripted"

    def __init__(self, *outcomes: RunResult) -> None:
        self.outcomes = list(outcomes)

    async def run(self, ctx: WakeContext) -> RunResult:
        return self.outcomes.pop(0)


async def test_failed_runs_are_counted_for_status_with_the_last_error(tmp_path: Path) -> None:
    """A model endpoint that refuses: status must say the runs fail, not only count
    them; a run that succeeds ends the streak, the count since the start stays."""
    refused = RunResult(status="failed", error="APIConnectionError: Connection error.")
    runner = ScriptedRunner(
        refused, RunResult(status="timeout", error="deadline 45 s"), refused,
        RunResult(status="ok"), RunResult(status="failed", exit_code=3),
    )  # fmt: skip
    h = Harness(tmp_path, policy(queue_mode="immediate"), runner=runner)
    seen = []
    async with h.running():
        for i in range(5):
            assert h.sched.submit(wake(i)).outcome == "woke"
            await h.settle()
            seen.append((h.sched.runs_failed, h.sched.runs_failing, h.sched.last_run_error))
    assert seen == [
        (1, 1, "failed: APIConnectionError: Connection error."),
        (2, 2, "timeout: deadline 45 s"),
        (3, 3, "failed: APIConnectionError: Connection error."),
        (3, 0, "failed: APIConnectionError: Connection error."),
        (4, 1, "failed: exit code 3"),
    ]


START = ManualClock().now()  # where a harness's clock starts


def _kill_copy(h: Harness, dest: Path) -> Path:
    """The run store as a kill -9 would leave it now (SQLite's own backup of the open
    database: what is committed, nothing a clean stop would add)."""
    import sqlite3

    dest.mkdir()
    src = sqlite3.connect(h.store.path)
    dst = sqlite3.connect(dest / "wake.sqlite3")
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()
    return dest


async def _cut_during_a_run(tmp_path: Path, pol: WakePolicy, name: str = "killed") -> Path:
    """A scheduler whose first run (wakes ev1, ev2) is in flight when the process dies:
    a copy of its store taken then."""
    h = Harness(tmp_path, pol, runner=GateRunner(hold=True))
    async with h.running():
        h.sched.submit(wake(1))
        h.sched.submit(wake(2))
        await h.settle()
        assert len(h.runner.contexts) == 1  # in flight
        dead = _kill_copy(h, tmp_path / name)
        h.runner.release.set()
    h.store.close()
    return dead


async def test_a_run_a_kill_cut_runs_again_once_when_the_policy_says_so(tmp_path: Path) -> None:
    """``rerun_interrupted_within_seconds``: the run a kill cut is closed as interrupted
    at the next start, its row naming the events that woke it, and its wakes run once
    more, first, with the same reasons. A kill during that re-run is not run a third
    time; neither is anything at a later start."""
    pol = policy(rerun_interrupted_within_seconds=600)
    dead = await _cut_during_a_run(tmp_path, pol)
    clock = ManualClock(START + 30)  # 30 s after the cut run started
    again = Harness(dead, pol, runner=GateRunner(hold=True), clock=clock)
    assert again.sched.close_interrupted() == 1
    (closed,) = again.runs("failed")
    assert (closed.status, closed.event_ids, closed.trace_id) == ("failed", ["ev1", "ev2"], "tr1")
    assert closed.trace_ids == ["tr1", "tr2"]
    assert closed.error is not None and "its wakes run again as a1-" in closed.error
    assert again.sched.runs_failing == 1  # status: RUNS FAILING, last: interrupted: ...
    assert again.sched.last_run_error == f"failed: {closed.error}"
    # Its event, evaluated again (its rows lost to the kill), wakes into that run.
    redo = again.sched.submit(wake(1))
    assert redo.outcome == "queued" and closed.error.endswith(str(redo.run_id))
    async with again.running():
        await again.settle()
        (ctx,) = again.runner.contexts
        assert [r.event_id for r in ctx.reasons] == ["ev1", "ev2"]
        assert closed.error.endswith(ctx.run_id) and ctx.rerun_of == closed.run_id
        deader = _kill_copy(again, tmp_path / "killed again")
        again.runner.release.set()
    started = again.runs("started")[0]
    assert started.summary.endswith(f"again, for {closed.run_id}, which a stop cut")
    assert started.event_ids == ["ev1", "ev2"] and started.trace_id == "tr1"
    again.store.close()

    third = Harness(deader, pol, clock=clock)
    assert third.sched.close_interrupted() == 1 and not third.sched.busy
    (row,) = third.runs()
    assert row.run_id == ctx.run_id and row.error is not None
    assert row.error.endswith(f"it is not run again: it ran the wakes of {closed.run_id} again")
    assert third.sched.close_interrupted() == 0
    third.store.close()


@pytest.mark.parametrize("later", [30, 3700])
async def test_a_re_run_takes_the_place_of_the_run_it_redoes(tmp_path: Path, later: int) -> None:
    """A re-run redoes work already counted in the hourly budget: with one run an hour,
    the cut run's wakes still run again (its own start took the only place: they were
    lost to ``budget``), and a new wake in that hour is suppressed by ``budget`` as it
    would have been had no kill come. Once the cut run's start has left the window, the
    re-run takes a place of its own."""
    pol = policy(rerun_interrupted_within_seconds=7200, max_runs_per_hour=1)
    dead = await _cut_during_a_run(tmp_path, pol)
    again = Harness(dead, pol, clock=ManualClock(START + later))
    assert again.sched.close_interrupted() == 1
    async with again.running():
        await again.settle()
        (ctx,) = again.runner.contexts
        assert [r.event_id for r in ctx.reasons] == ["ev1", "ev2"] and ctx.rerun_of
        late = again.sched.submit(wake(3))
        assert (late.outcome, late.suppressed_by) == ("suppressed", "budget")
    assert not again.wakes("suppressed")[:-1]  # only ev3's: the re-run's were not dropped
    again.store.close()


class SpendingGate(GateRunner):
    """Spends (as the LLM runner reports a model call), then waits for ``release``."""

    name = "spending"
    reports_spend = True

    async def run(self, ctx: WakeContext, spent: Spent | None = None) -> RunResult:
        assert spent is not None
        spent((0.5, 1200, 300))
        return await super().run(ctx)


async def test_what_a_run_a_kill_cut_had_spent_counts_against_the_daily_cap(
    tmp_path: Path,
) -> None:
    """An LLM run reports its spend after each model call and the store keeps it, so a
    kill -9 before the run's end does not forget it: the next start counts it against
    ``max_cost_per_day`` (a daemon killed during every run would otherwise never reach
    the cap), and the cut run's row says what it had used."""
    pol = policy(max_cost_per_day=0.4)
    h = Harness(tmp_path, pol, runner=SpendingGate(hold=True))
    async with h.running():
        h.sched.submit(wake(1))
        await h.settle()
        dead = _kill_copy(h, tmp_path / "killed")
        h.runner.release.set()
    h.store.close()
    again = Harness(dead, pol, clock=ManualClock(START + 30))
    assert again.sched.close_interrupted() == 1
    (row,) = again.runs("failed")
    assert row.error is not None
    assert row.error.endswith(
        "it had used 1200 tokens in and 300 out (cost 0.5), counted in max_cost_per_day"
    )
    assert again.sched.usage_today() == (1, 0.5, 1200, 300)
    late = again.sched.submit(wake(2))
    assert (late.outcome, late.suppressed_by) == ("suppressed", "cost")
    again.store.close()

    # A clean stop cancels the run in flight, which reports nothing: what it had
    # reported stands, in the store and in the day's usage.
    (tmp_path / "stopped").mkdir()
    stop = Harness(tmp_path / "stopped", pol, runner=SpendingGate(hold=True))
    async with stop.running():
        stop.sched.submit(wake(3))
        await stop.settle()
    assert stop.sched.usage_today() == (1, 0.5, 1200, 300)
    assert stop.store.usage_since("a1", 0.0) == (1, 0.5, 1200, 300)
    stop.store.close()


async def test_a_re_run_does_not_wait_for_the_cooldown_of_the_run_it_redoes(
    tmp_path: Path,
) -> None:
    """The store makes a cut run end as it started, so its cooldown counts from there;
    the re-run is that run redone and starts at once (it waited out that cooldown: on
    event time it ran later than the run it redoes, and moved the cooldown after it,
    so a later wake could be suppressed where, without the stop, it ran)."""
    pol = policy(rerun_interrupted_within_seconds=600, cooldown_after_run_seconds=120)
    dead = await _cut_during_a_run(tmp_path, pol)
    again = Harness(dead, pol, clock=ManualClock(START + 30))
    assert again.sched.close_interrupted() == 1
    async with again.running():
        await again.settle()
        (ctx,) = again.runner.contexts
        assert ctx.rerun_of
        await again.advance(121)  # the cooldown after the re-run, not after START + 120
        assert again.sched.submit(wake(3)).outcome == "woke"
    again.store.close()


@pytest.mark.parametrize("cut_again", [False, True])
async def test_a_re_runs_start_is_not_counted_at_the_next_start(
    tmp_path: Path, cut_again: bool
) -> None:
    """The store says which starts took a place: with two runs an hour, a restart
    after the cut run's re-run (ended, or cut in turn) leaves one place to a new wake
    (the budget rebuilt from the store counted the re-run's start as a second place)."""
    pol = policy(rerun_interrupted_within_seconds=600, max_runs_per_hour=2)
    dead = await _cut_during_a_run(tmp_path, pol)
    again = Harness(dead, pol, runner=GateRunner(hold=cut_again), clock=ManualClock(START + 30))
    assert again.sched.close_interrupted() == 1
    async with again.running():
        await again.settle()
        (ctx,) = again.runner.contexts
        assert ctx.rerun_of
        deader = _kill_copy(again, tmp_path / "killed again")
        again.runner.release.set()
    again.store.close()
    third = Harness(deader, pol, clock=ManualClock(START + 60))
    assert third.sched.close_interrupted() == int(cut_again)
    assert third.sched.submit(wake(3)).outcome == "woke"
    third.store.close()


async def test_a_run_a_kill_cut_is_not_run_again_by_default_or_when_old(tmp_path: Path) -> None:
    """By default a cut run is only closed (it may have paid), yet its row still names
    its events; with the option, a run that started longer ago than it allows is not
    run again either, and the row says why."""
    dead = await _cut_during_a_run(tmp_path, policy())
    flushed: list[int] = []  # rows sunk at each write-ahead
    off: Harness = Harness(
        dead,
        policy(),
        clock=ManualClock(START + 30),
        write_ahead=lambda: flushed.append(len(off.records)),
    )
    assert off.sched.close_interrupted() == 1 and not off.sched.busy
    assert flushed == [1]  # the closing row is not left to a batch a kill could take
    (row,) = off.runs()
    assert row.event_ids == ["ev1", "ev2"] and row.error is not None
    assert row.error.endswith("this run; it is not run again")
    off.store.close()

    pol = policy(rerun_interrupted_within_seconds=600)
    (tmp_path / "b").mkdir()
    dead = await _cut_during_a_run(tmp_path / "b", pol)
    late = Harness(dead, pol, clock=ManualClock(START + 700))
    assert late.sched.close_interrupted() == 1 and not late.sched.busy
    (row,) = late.runs()
    assert row.error is not None
    assert row.error.endswith(
        "it is not run again: it started 700 s before, over rerun_interrupted_within_seconds (600)"
    )
    late.store.close()


async def test_a_run_a_clean_stop_cuts_runs_again_at_the_next_start(tmp_path: Path) -> None:
    """A stop (not a kill) cancels the run in flight: with the option, its wakes are
    kept as a queued run for the next start, which runs them once; the cut run's row
    says so. An agent removed meanwhile drops them as suppressed by shutdown."""
    pol = policy(rerun_interrupted_within_seconds=600)
    h = Harness(tmp_path, pol, runner=GateRunner(hold=True))
    async with h.running():
        h.sched.submit(wake(1))
        await h.settle()
    assert h.sched.abandon_pending(keep=True) == 1
    (cut,) = h.runs("failed")
    assert cut.error is not None
    assert cut.error.startswith("cancelled: the scheduler stopped; its wakes run again as a1-")
    h.store.close()

    again = Harness(tmp_path, pol, clock=h.clock)
    assert again.sched.counters["restored"] == 1
    async with again.running():
        await again.settle()
    (ctx,) = again.runner.contexts
    assert [r.event_id for r in ctx.reasons] == ["ev1"] and cut.error.endswith(ctx.run_id)
    again.store.close()

    (tmp_path / "removed").mkdir()
    gone = Harness(tmp_path / "removed", pol, runner=GateRunner(hold=True))
    async with gone.running():
        gone.sched.submit(wake(2))
        await gone.settle()
    assert gone.sched.abandon_pending(keep=False) == 1
    assert [(w.event_id, w.suppressed_by) for w in gone.wakes("suppressed")] == [
        ("ev2", "shutdown")
    ]
    assert gone.store.pending("a1") == []
    gone.store.close()


async def test_a_cut_run_from_an_older_store_has_no_wakes_to_run(tmp_path: Path) -> None:
    """A run row written before runs kept their wakes (no body) is closed, and not
    run again: there is nothing to run."""
    store = RunStore(tmp_path / "wake.sqlite3")
    store.record_start("a1", "r-old", "wake", START)
    store.close()
    h = Harness(tmp_path, policy(rerun_interrupted_within_seconds=600))
    assert h.sched.close_interrupted() == 1 and not h.sched.busy
    (row,) = h.runs()
    assert (row.run_id, row.event_ids) == ("r-old", [])
    assert row.error is not None and row.error.endswith("its wakes were not kept")
    h.store.close()


async def test_a_stop_waits_for_the_run_in_flight_and_starts_no_other(tmp_path: Path) -> None:
    """``finish_in_flight``: returns once the run in flight ends; the follow-up run
    that was due meanwhile does not start (it is kept for the next start)."""
    runner = GateRunner(hold=True)
    h = Harness(tmp_path, policy(), runner=runner)
    async with h.running():
        h.sched.submit(wake(1))
        await h.settle()
        h.sched.submit(wake(2))  # the follow-up run, due as soon as the first ends
        done = anyio.Event()

        async def stop() -> None:
            await h.sched.finish_in_flight()
            done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(stop)
            await h.settle()
            assert not done.is_set()  # the run is still in flight
            runner.release.set()
            with anyio.fail_after(5):
                await done.wait()
        await h.settle()
        with anyio.fail_after(5):
            await h.sched.finish_in_flight()  # nothing in flight: at once
    assert [[r.event_id for r in c.reasons] for c in runner.contexts] == [["ev1"]]
    assert [r.status for r in h.runs()] == ["started", "finished"]
    assert h.sched.abandon_pending(keep=True) == 1
    h.store.close()


async def test_unreadable_run_records_are_closed_not_fatal(tmp_path: Path) -> None:
    """A run row whose kept wakes do not read (bytes that are not JSON, JSON of the
    wrong shape, wakes of the wrong shape) is closed like one that kept none, logged;
    the start goes on and nothing is run again from it."""
    store = RunStore(tmp_path / "wake.sqlite3")
    for i, body in enumerate(
        [b"\xff not json", b'{"wakes": 5, "earlier": {}}', b'{"wakes": [{"x": 1}], "earlier": []}']
    ):
        store.record_start("a1", f"r{i}", "wake", START + i, body=body)
    store.close()
    h = Harness(tmp_path, policy(rerun_interrupted_within_seconds=600))
    assert h.sched.close_interrupted() == 3 and not h.sched.busy
    rows = h.runs()
    assert [(r.run_id, r.event_ids) for r in rows] == [("r0", []), ("r1", []), ("r2", [])]
    assert all(r.error and r.error.endswith("as the store kept them, do not read") for r in rows)
    assert h.store.unfinished("a1") == [] and h.sched.close_interrupted() == 0
    h.store.close()


async def test_on_event_time_runs_stop_once_the_first_ones_all_failed(tmp_path: Path) -> None:
    """A replay whose model never answers: once the first ``fuse`` runs have all failed,
    the scheduler starts no more (due ones included) and says so once; a scheduler
    whose runs succeeded first never trips."""
    from daemon.clock import EventClock

    refused = RunResult(status="failed", error="APIConnectionError: Connection error.")
    tripped: list[str] = []
    h = Harness(
        tmp_path, policy(queue_mode="immediate"), runner=ScriptedRunner(*[refused] * 6),
        clock=EventClock(), fuse=3, on_fuse=lambda: tripped.append("stop"),
    )  # fmt: skip
    t0 = 1_700_000_000.0
    for i in range(6):
        await h.sched.advance_to(t0 + 60 * i)
        h.sched.submit(wake(i))
    await h.sched.advance_to(t0 + 3600)
    assert (h.sched.runs_failed, tripped) == (3, ["stop"])
    assert await h.sched.drain() == 0  # the rest stay queued: not run, not failed
    assert len(h.runs("failed")) == 3

    ok = RunResult(status="ok")
    steady = Harness(
        tmp_path / "b", policy(queue_mode="immediate"), runner=ScriptedRunner(ok, *[refused] * 5),
        clock=EventClock(), fuse=3, on_fuse=lambda: tripped.append("again"),
    )  # fmt: skip
    for i in range(6):
        await steady.sched.advance_to(t0 + 60 * i)
        steady.sched.submit(wake(i))
    await steady.sched.advance_to(t0 + 3600)
    assert steady.sched.runs_failed == 5 and tripped == ["stop"]  # it worked once: no fuse
