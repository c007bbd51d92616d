"""Per-hook health: counters, and one WARNING per transition (failing, paused, recovered)."""

from __future__ import annotations

import msgspec
import structlog.testing

from daemon.agents.health import HealthTracker
from daemon.cli.run import _render_status
from daemon.status import AgentStatus, BusStatus, FeedStatus, HooksStatus, Status


def test_transitions_are_logged_once_each_and_counted() -> None:
    t = HealthTracker()
    with structlog.testing.capture_logs() as logs:
        t.record("a", "h", None, None)
        t.record("a", "h", "timeout", "exceeded its 250 ms budget")
        t.record("a", "h", "backoff", "backing off")
        t.record("a", "h", "runtime", "ZeroDivisionError")  # still failing: no new line
        t.record("a", "h", "paused", "paused after 2 consecutive failures")
        t.record("a", "h", "paused", "paused after 2 consecutive failures")
        t.resumed("a", "h")
        t.record("a", "h", None, None)
    assert [(e["log_level"], e["event"].split(":")[0]) for e in logs] == [
        ("warning", "hook failing"),
        ("warning", "hook paused"),
        ("warning", "hook recovered"),
    ]
    h = t.of("a")["h"]
    assert (h.evaluations, h.timeouts, h.errors, h.backoffs, h.state) == (4, 1, 1, 1, "ok")
    assert h.last_error == "runtime: ZeroDivisionError"
    t.forget("a")
    assert t.of("a") == {}


def test_status_shows_each_troubled_hook() -> None:
    t = HealthTracker()
    for _ in range(4):
        t.record("alpha", "wake_loop", "timeout", "exceeded its 250 ms budget")
    t.record("alpha", "wake_loop", "paused", "paused")
    t.record("alpha", "wake_fine", None, None)
    agent = AgentStatus(
        hooks={"wake_loop": "r1", "wake_fine": "r2"}, paused=False,
        paused_hooks=["wake_loop"], queue_depth=0, hook_health=t.of("alpha"),
    )  # fmt: skip
    hooks = HooksStatus(sandbox_layers=["fds"], evaluations=5, suppressed=0, failures=0,
                        agents={"alpha": agent})  # fmt: skip
    st = Status(pid=1, started_at=0.0, written_at=0.0, running=False,
                bus=BusStatus(published=0, delivered=0, coalesced=0, subscriptions=()),
                feeds=[], state={}, components={"hooks": hooks})  # fmt: skip
    text = _render_status(st, None)
    assert "4 hook failures (4 timeouts, 0 errors), 0 skipped in backoff" in text
    assert (
        "    hook wake_loop: PAUSED, 4 evaluations, 4 timeouts, 0 errors, 0 backoffs "
        "(last: timeout: exceeded its 250 ms budget)"
    ) in text
    assert "wake_fine" not in text.split("hook wake_loop")[1]


def test_status_says_when_the_agents_runs_fail() -> None:
    def shown(failed: int = 0, failing: int = 0, error: str = "") -> str:
        agent = AgentStatus(hooks={}, paused=False, paused_hooks=[], queue_depth=0, runs_today=9,
                            runs_failed=failed, runs_failing=failing, last_run_error=error)  # fmt: skip
        hooks = HooksStatus(sandbox_layers=[], evaluations=0, suppressed=0, failures=0,
                            agents={"alpha": agent})  # fmt: skip
        st = Status(pid=1, started_at=0.0, written_at=0.0, running=False,
                    bus=BusStatus(published=0, delivered=0, coalesced=0, subscriptions=()),
                    feeds=[], state={}, components={"hooks": hooks})  # fmt: skip
        return _render_status(st, None)

    error = "failed: APIConnectionError: Connection error."
    assert f"    RUNS FAILING: the last 3 runs failed (5 since the start; last: {error})" in shown(
        5, 3, error
    )
    recovered = shown(1, 0, error)
    assert (
        f"    1 run failed since the start, the latest run succeeded (last failure: {error})"
        in recovered
    )
    assert "FAIL" not in shown() and "failed" not in shown()


def test_status_says_when_the_hook_store_fails() -> None:
    def shown(store_error: str) -> str:
        hooks = HooksStatus(sandbox_layers=[], evaluations=0, suppressed=0, failures=0,
                            agents={}, store_error=store_error)  # fmt: skip
        st = Status(pid=1, started_at=0.0, written_at=0.0, running=False,
                    bus=BusStatus(published=0, delivered=0, coalesced=0, subscriptions=()),
                    feeds=[], state={}, components={"hooks": hooks})  # fmt: skip
        return _render_status(st, None)

    full = "state/hooks.sqlite3: hook store (claim): database or disk is full"
    assert (
        f"  HOOK STORE FAILING: {full}: WAKE, ALERT and TRADE_INTENT decisions are "
        "suppressed (store) until it works again"
    ) in shown(full)
    assert "HOOK STORE" not in shown("")


def test_a_feed_of_a_daemon_that_is_not_running_is_not_live() -> None:
    feed = FeedStatus(name="replay", silent_seconds=0.0, errors=0, finished=False, stalled=False)
    st = Status(pid=1, started_at=0.0, written_at=0.0, running=False,
                bus=BusStatus(published=0, delivered=0, coalesced=0, subscriptions=()),
                feeds=[feed], state={})  # fmt: skip
    assert "feed replay: stopped," in _render_status(st, None)
    assert "feed replay: live," in _render_status(st, 123)


def test_a_stopped_daemon_says_whether_it_was_asked_to_or_its_replay_ended() -> None:
    """A replay whose feeds all finished but that a signal stopped before its agents
    caught up says so: its feeds' "finished" alone would read as a complete run."""
    feed = FeedStatus(name="replay", silent_seconds=0.0, errors=0, finished=True, stalled=False)
    st = Status(pid=1, started_at=0.0, written_at=0.0, running=False,
                bus=BusStatus(published=0, delivered=0, coalesced=0, subscriptions=()),
                feeds=[feed], state={})  # fmt: skip
    assert "(last pid 1, stopped at the end of its replay, " in _render_status(st, None)
    asked = msgspec.structs.replace(st, interrupted=True)
    assert "(last pid 1, stopped on request, " in _render_status(asked, None)
    assert "stopped" not in _render_status(asked, 7).splitlines()[0]  # running: neither
