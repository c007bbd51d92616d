"""The hook pipeline end to end: real bus, real sandbox workers, real stores, audit log."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
import structlog.testing
from anyio.abc import TaskStatus

from daemon.agents.pipeline import open_agents
from daemon.agents.store import HookStore
from daemon.config import Config
from daemon.events import MARKET_CANDLE_CLOSED, FeedEvent, candle_event_id, iso_ms
from daemon.service import Service
from daemon.status import read_status
from feeds.base import Feed, FeedHealth, Publish
from tests.test_alerts import serve
from tests.threads import on_loop_calls

T0 = 1_700_000_000_000

WAKE_EVERY = """
def evaluate(event, state):
    closes = state["candles"][event["symbol"]][event["timeframe"]]
    return {"decision": "WAKE", "reason": "seen " + str(len(closes)),
            "dedupeKey": "k:" + event["eventId"]}
"""

ALERT_EVERY = """
def evaluate(event, state):
    return {"decision": "ALERT", "reason": "close " + str(event["payload"]["close"])}
"""

COOL = """
def evaluate(event, state):
    return {"decision": "ALERT", "reason": "cool", "cooldownSeconds": 300}
"""


def candle(i: int) -> FeedEvent:
    close_ms = T0 + 60_000 * (i + 1)
    return FeedEvent(
        event_id=candle_event_id("t", "BTC-USD", "1m", close_ms),
        ts=iso_ms(close_ms),
        source="t",
        topic=MARKET_CANDLE_CLOSED,
        symbol="BTC-USD",
        timeframe="1m",
        partition_key="t:BTC-USD:1m",
        payload={
            "open": 100.0,
            "high": 102.0,
            "low": 99.0,
            "close": 101.0 + i,
            "volume": 1.0,
            "openTimeMs": close_ms - 60_000,
            "closeTimeMs": close_ms,
            "openTime": iso_ms(close_ms - 60_000),
            "closeTime": iso_ms(close_ms),
        },
    )


class PacedFeed:
    """Publishes candles, optionally pausing between them so a test can act mid-stream,
    and optionally staying up afterwards (``hold``) until ``release`` is set."""

    name = "paced"

    def __init__(self, events: list[FeedEvent], gap: float = 0.0, *, hold: bool = False) -> None:
        self.events = events
        self.gap = gap
        self.published = 0
        self.reached: dict[int, anyio.Event] = {}
        self.gates: dict[int, anyio.Event] = {}
        # hold: once published, stay up (the daemon keeps running) until released.
        self.hold = hold
        self.release = anyio.Event()

    def when(self, n: int) -> anyio.Event:
        """An event set once ``n`` events have been published."""
        return self.reached.setdefault(n, anyio.Event())

    def gate(self, n: int) -> anyio.Event:
        """An event the feed waits for after publishing ``n`` events, so a test's
        action lands at that point however loaded the machine is."""
        return self.gates.setdefault(n, anyio.Event())

    async def run(
        self, publish: Publish, health: FeedHealth, *, task_status: TaskStatus[None]
    ) -> None:
        task_status.started()
        for e in self.events:
            health.beat()
            await publish(e)
            self.published += 1
            if self.published in self.reached:
                self.reached[self.published].set()
            if self.published in self.gates:
                await self.gates[self.published].wait()
            if self.gap:
                await anyio.sleep(self.gap)
        if self.hold:
            await self.release.wait()


def workspace(root: Path, hooks: dict[str, str], toml: str = "") -> Path:
    agents = root / "agents"
    hooks_dir = agents / "alpha" / "hooks"
    hooks_dir.mkdir(parents=True, exist_ok=True)
    (agents / "alpha" / "agent.toml").write_text(toml)
    for name, src in hooks.items():
        (hooks_dir / name).write_text(src)
    return agents


def config(root: Path, agents: Path) -> Config:
    return msgspec.convert(
        {
            "daemon": {"state_dir": str(root / "state")},
            "hooks": {"agents_dir": str(agents), "reload_seconds": 0.05},
        },
        Config,
    )


def audit(root: Path) -> list[dict[str, Any]]:
    """The audit rows written so far: a line still being written (a test may read while
    the daemon writes) is not a row yet."""
    out: list[dict[str, Any]] = []
    for f in sorted((root / "state" / "audit").glob("audit-*.jsonl")):
        text = f.read_text()
        out += [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines()]
    return out


async def run_service(root: Path, agents: Path, feed: Feed) -> Service:
    svc = Service(config(root, agents), lambda _: [feed], components=[open_agents])
    with anyio.fail_after(30):
        await svc.run()
    return svc


async def test_every_event_is_audited_once_across_restarts_and_dedupe_survives(
    tmp_path: Path,
) -> None:
    """Each candle gets one hook record with the state including that candle. A restart
    that re-delivers them evaluates only the new ones (with the old ones in state); with
    the applied marks forgotten, every re-evaluated WAKE is suppressed as a duplicate."""
    # No cooldown or budget: on event time they would (rightly) suppress some wakes.
    toml = "[wake]\ncooldown_after_run_seconds = 0\nmax_runs_per_hour = 100\n"
    agents = workspace(tmp_path, {"wake_every.py": WAKE_EVERY}, toml)
    events = [candle(i) for i in range(16)]
    await run_service(tmp_path, agents, PacedFeed(events[:12]))
    first = [r for r in audit(tmp_path) if r["type"] == "hook"]
    assert [r["eventId"] for r in first] == [e.event_id for e in events[:12]]
    assert [r["reason"] for r in first] == [f"seen {i + 1}" for i in range(12)]
    assert {r["suppressedBy"] for r in first} == {"none"}
    assert all(r["revision"] and r["traceId"] for r in first)

    svc = await run_service(tmp_path, agents, PacedFeed(events))  # 12 again, then 4 new
    second = [r for r in audit(tmp_path) if r["type"] == "hook"][12:]
    assert [r["eventId"] for r in second] == [e.event_id for e in events[12:]]
    assert [r["reason"] for r in second] == [f"seen {i + 1}" for i in range(12, 16)]
    assert svc.status(running=False).components["delivery"]["skipped"] == 12

    (tmp_path / "state" / "audit").rename(tmp_path / "audit-1")  # the marks alone skip them
    await run_service(tmp_path, agents, PacedFeed(events[:4]))
    assert not [r for r in audit(tmp_path) if r["type"] == "hook"]

    store = HookStore(tmp_path / "state" / "hooks.sqlite3")
    assert store.reset_applied() == 1
    store.close()
    assert not (tmp_path / "state" / "audit").exists()  # no recent rows either
    await run_service(tmp_path, agents, PacedFeed(events[:4]))
    third = [r for r in audit(tmp_path) if r["type"] == "hook"]
    assert len(third) == 4 and {r["suppressedBy"] for r in third} == {"dedupe"}
    # every row says which daemon run wrote it, and `why` shows it
    runs = {r["daemonRun"] for r in first} | {r["daemonRun"] for r in third}
    assert len(runs) == 2 and None not in runs


async def test_why_shows_the_daemon_run_of_each_row(tmp_path: Path) -> None:
    """Rows of the same event from two daemon runs are told apart in `why`."""
    from daemon.audit.why import collect, explain

    agents = workspace(tmp_path, {"wake_every.py": WAKE_EVERY})
    events = [candle(0)]
    await run_service(tmp_path, agents, PacedFeed(events))
    store = HookStore(tmp_path / "state" / "hooks.sqlite3")
    store.reset_applied()
    store.close()
    await run_service(tmp_path, agents, PacedFeed(events))  # evaluated again: marks gone
    # ...except that its newest audit rows still show it evaluated: not evaluated again
    hooks = [r for r in audit(tmp_path) if r["type"] == "hook"]
    assert len(hooks) == 1
    (story,) = explain(collect(tmp_path / "state" / "audit", events[0].event_id), "q").agents
    assert story.details[0].startswith(f"[run {hooks[0]['daemonRun']}] hook wake_every")


async def test_cooldown_is_event_time_and_persisted(tmp_path: Path) -> None:
    """A 300 s cooldown silences the next four 1m candles, in this run and the next."""
    agents = workspace(tmp_path, {"wake_cool.py": COOL})
    await run_service(tmp_path, agents, PacedFeed([candle(i) for i in range(7)]))
    got = [r["suppressedBy"] for r in audit(tmp_path) if r["type"] == "hook"]
    assert got == ["none", "cooldown", "cooldown", "cooldown", "cooldown", "none", "cooldown"]
    await run_service(tmp_path, agents, PacedFeed([candle(7)]))
    assert audit(tmp_path)[-1]["suppressedBy"] == "cooldown"


async def test_hot_reload_under_a_stream_keeps_every_event(tmp_path: Path) -> None:
    """Editing a hook mid-stream switches revisions between events; a broken edit keeps the
    previous revision running; no event is lost or evaluated twice."""
    v1 = WAKE_EVERY.replace('"seen "', '"v1 "')
    agents = workspace(tmp_path, {"wake_every.py": v1})
    hook = agents / "alpha" / "hooks" / "wake_every.py"
    events = [candle(i) for i in range(60)]
    feed = PacedFeed(events, gap=0.02)

    at_15, at_35 = feed.when(15), feed.when(35)

    async def edit() -> None:
        await at_15.wait()
        hook.write_text(WAKE_EVERY.replace('"seen "', '"v2 "'))
        await at_35.wait()
        hook.write_text("def evaluate(event, state)\n    return {}\n")  # syntax error

    async with anyio.create_task_group() as tg:
        tg.start_soon(edit)
        svc = await run_service(tmp_path, agents, feed)
    hooks = [r for r in audit(tmp_path) if r["type"] == "hook"]
    assert [r["eventId"] for r in hooks] == [e.event_id for e in events]
    # status says which file is not running, and what runs instead
    stats = svc.status(running=False).hooks
    assert stats is not None
    running = hooks[-1]["revision"]
    (why,) = stats.agents["alpha"].compile_errors.values()
    assert why.startswith(f"{hook}: revision ") and "does not compile" in why, why
    assert why.endswith(f"revision {running[:8]} keeps running"), why
    versions = [r["reason"].split()[0] for r in hooks]
    assert versions[0] == "v1" and versions[-1] == "v2"
    switch = versions.index("v2")
    assert set(versions[:switch]) == {"v1"} and set(versions[switch:]) == {"v2"}
    assert len({r["revision"] for r in hooks}) == 2
    store = HookStore(tmp_path / "state" / "hooks.sqlite3")
    revs = store.revisions("alpha", "wake_every")
    store.close()
    assert len(revs) == 3 and revs[-1][2] is not None and "compile" in revs[-1][2]


async def test_a_new_revision_is_kept_from_a_worker_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keeping a revision's source syncs the file and its directory: not on the event
    loop, where an edit's reload would hold every feed for as long as the disk takes."""
    from daemon.agents import revisions

    on_loop = on_loop_calls(monkeypatch, revisions, "write_atomic")
    agents = workspace(tmp_path, {"wake_every.py": WAKE_EVERY, "wake_cool.py": COOL})
    await run_service(tmp_path, agents, PacedFeed([candle(0)]))
    assert on_loop == [False, False]
    assert len(list((tmp_path / "state" / "revisions").glob("*.py"))) == 2


@pytest.mark.parametrize("kind", ["wake", "autotrade"])
async def test_decision_not_allowed_for_kind_is_a_recorded_error(tmp_path: Path, kind: str) -> None:
    """A wake hook may not trade and an autotrade hook may not wake: recorded, not acted on."""
    wrong = "TRADE_INTENT" if kind == "wake" else "WAKE"
    src = f'def evaluate(event, state):\n    return {{"decision": "{wrong}", "reason": "x"}}\n'
    agents = workspace(tmp_path, {f"{kind}_bad.py": src})
    await run_service(tmp_path, agents, PacedFeed([candle(0)]))
    (rec,) = [r for r in audit(tmp_path) if r["type"] == "hook"]
    assert rec["decision"] is None and rec["error"]
    assert not [r for r in audit(tmp_path) if r["type"] in ("wake", "risk")]


async def test_why_links_a_wake_to_its_run(tmp_path: Path) -> None:
    """Each WAKE's trace leads `why` to the hook decision, the scheduler outcome and the run."""
    from daemon.audit.why import collect, explain

    toml = "[wake]\ndebounce_seconds = 0\ncooldown_after_run_seconds = 0\nmax_runs_per_hour = 100\n"
    agents = workspace(tmp_path, {"wake_every.py": WAKE_EVERY}, toml)
    await run_service(tmp_path, agents, PacedFeed([candle(i) for i in range(5)], gap=0.05))
    records = audit(tmp_path)
    runs = [r for r in records if r["type"] == "run" and r["status"] == "finished"]
    assert runs, "the log runner ran"
    traced = {t for r in runs for t in r["traceIds"]}
    some = min(traced)
    recs = collect(tmp_path / "state" / "audit", some)
    assert {"hook", "wake", "run"} <= {r["type"] for r in recs}
    assert recs[0]["type"] == "hook"  # cause before effect
    (story,) = explain(recs, some).agents
    assert story.outcome == "WOKE" and "finished" in story.why


async def test_failing_hook_is_paused_persisted_and_resumed_by_the_cli(tmp_path: Path) -> None:
    """Repeated failures pause a hook (persisted); `marketwake hooks resume` lifts it while
    the daemon runs, and the hook is evaluated again. The failures are visible: one
    WARNING per transition (failing, then paused, once per pause), and status counts
    per hook (an infinite loop's timeouts too)."""
    import sys

    boom = "def evaluate(event, state):\n    return 1 / 0\n"
    loop = "def evaluate(event, state):\n    while True:\n        pass\n"
    agents = workspace(tmp_path, {"wake_boom.py": boom, "wake_loop.py": loop})
    cfg = msgspec.convert(
        {
            "daemon": {"state_dir": str(tmp_path / "state")},
            "hooks": {
                "agents_dir": str(agents),
                "reload_seconds": 0.05,
                "sandbox": {"pause_after_failures": 2, "backoff_base_seconds": 0.001},
            },
        },
        Config,
    )
    feed = PacedFeed([candle(i) for i in range(40)], gap=0.03)
    paused_seen = feed.when(10)
    resumed = feed.gate(10)  # the rest of the feed waits for the CLI, however slow it starts

    async def resume() -> None:
        await paused_seen.wait()
        await anyio.run_process(
            [sys.executable, "-m", "daemon.cli", "hooks", "resume", "alpha", "wake_boom",
             "--state-dir", str(tmp_path / "state")],
            check=True,
        )  # fmt: skip
        resumed.set()

    with structlog.testing.capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            tg.start_soon(resume)
            svc = Service(cfg, lambda _: [feed], components=[open_agents])
            with anyio.fail_after(30):
                await svc.run()
    errors = [
        r["error"] or ""
        for r in audit(tmp_path)
        if r["type"] == "hook" and r["hookId"] == "wake_boom"
    ]
    first_pause = next(i for i, e in enumerate(errors) if e.startswith("paused"))
    assert all("ZeroDivisionError" in e for e in errors[:first_pause])
    # failed, timed out or paused, each event's rows say it has two
    assert {r["eventHooks"] for r in audit(tmp_path) if r["type"] == "hook"} == {2}
    assert first_pause < 10
    assert any("ZeroDivisionError" in e for e in errors[first_pause:]), "resumed"
    transitions = [
        (e["hook"], e["event"].split(":")[0])
        for e in logs
        if e["event"].startswith("hook ") and "hook" in e and e["log_level"] == "warning"
    ]
    assert transitions.count(("wake_boom", "hook failing")) == 1
    episodes = sum(
        e.startswith("paused") and (i == 0 or not errors[i - 1].startswith("paused"))
        for i, e in enumerate(errors)
    )  # a pause, and another if it failed twice again after the resume
    assert transitions.count(("wake_boom", "hook paused")) == episodes >= 1
    assert transitions.count(("wake_loop", "hook failing")) == 1
    assert transitions.count(("wake_loop", "hook paused")) == 1
    health = read_status(tmp_path / "state").hooks.agents["alpha"].hook_health  # type: ignore[union-attr]
    assert health["wake_loop"].timeouts == 2 and health["wake_loop"].state == "paused"
    assert health["wake_boom"].errors == sum(e.startswith("runtime: ZeroDivision") for e in errors)
    assert health["wake_boom"].state == "paused"
    assert health["wake_boom"].last_error is not None
    assert "ZeroDivisionError" in health["wake_boom"].last_error


async def test_a_pause_outlives_a_restart_and_an_edit_lifts_it(tmp_path: Path) -> None:
    """A hook paused for failing stays paused when the daemon restarts (each start
    lifted every pause: the same revision failed again on each restart); a new
    revision of it starts fresh."""
    boom = "def evaluate(event, state):\n    return 1 / 0\n"
    agents = workspace(tmp_path, {"wake_boom.py": boom})
    cfg = msgspec.convert(
        {
            "daemon": {"state_dir": str(tmp_path / "state")},
            "hooks": {
                "agents_dir": str(agents),
                "sandbox": {"pause_after_failures": 2, "backoff_base_seconds": 0.001},
            },
        },
        Config,
    )

    async def run(first: int, last: int) -> list[str]:
        before = len(audit(tmp_path))
        feed = PacedFeed([candle(i) for i in range(first, last)])
        with anyio.fail_after(30):
            await Service(cfg, lambda _: [feed], components=[open_agents]).run()
        return [
            str(r["error"]).split(":")[0] for r in audit(tmp_path)[before:] if r["type"] == "hook"
        ]

    first = await run(0, 6)
    assert first[:2] == ["runtime", "runtime"] and set(first[2:]) == {"paused"}, first
    assert await run(6, 10) == ["paused"] * 4  # restarted: still paused, not run
    (agents / "alpha" / "hooks" / "wake_boom.py").write_text(boom.replace("1 / 0", "2 / 0"))
    edited = await run(10, 14)
    assert edited[:2] == ["runtime", "runtime"] and set(edited[2:]) == {"paused"}, edited


async def test_absurd_cooldown_is_clamped_not_fatal(tmp_path: Path) -> None:
    """A hook asking for a 1e18 s cooldown gets a year, and the agent keeps serving."""
    src = (
        "def evaluate(event, state):\n"
        '    return {"decision": "ALERT", "reason": "x", "cooldownSeconds": 1e18}\n'
    )
    agents = workspace(tmp_path, {"wake_forever.py": src})
    await run_service(tmp_path, agents, PacedFeed([candle(i) for i in range(3)]))
    got = [r["suppressedBy"] for r in audit(tmp_path) if r["type"] == "hook"]
    assert got == ["none", "cooldown", "cooldown"]


@pytest.mark.parametrize("clock", ["event", "wall"])
async def test_a_replays_alerts_are_audited_not_posted_on_event_time(
    tmp_path: Path, clock: str
) -> None:
    """History's ALERTs go to the audit and the log; the webhook gets only the wall
    clock's (the same replay with ``clock = "wall"`` posts each one)."""
    runner, url, posted = await serve(204)
    agents = workspace(tmp_path, {"wake_alert.py": ALERT_EVERY})
    cfg = msgspec.convert(
        {
            "daemon": {"state_dir": str(tmp_path / "state"), "clock": clock},
            "hooks": {"agents_dir": str(agents), "alert_webhook": url},
        },
        Config,
    )
    try:
        feed = PacedFeed([candle(i) for i in range(3)])
        svc = Service(cfg, lambda _: [feed], components=[open_agents])
        with anyio.fail_after(30):
            await svc.run()
    finally:
        await runner.cleanup()
    alerts = [r for r in audit(tmp_path) if r["type"] == "hook" and r["decision"] == "ALERT"]
    assert len(alerts) == 3
    from click.testing import CliRunner

    from daemon.cli.run import status_command

    shown = CliRunner().invoke(status_command, ["--state-dir", str(tmp_path / "state")])
    st = read_status(tmp_path / "state").alerts
    assert st is not None and shown.exit_code == 0, shown.output
    if clock == "event":
        assert posted == [] and not st.webhook and "alert webhook" not in shown.output
    else:
        # Each once; in any order (posted by concurrent tasks).
        assert sorted(p["eventId"] for p in posted) == sorted(r["eventId"] for r in alerts)
        assert (st.webhook, st.posted, st.failed, st.down) == (True, 3, 0, False)
        assert "alert webhook: up, 3 posted, 0 not delivered" in shown.output
        assert url not in shown.output


async def test_alerts_the_webhook_missed_before_a_stop_are_posted_at_the_next_start(
    tmp_path: Path,
) -> None:
    """The endpoint is down for a whole run: its three alerts are kept in the state
    dir (alerts.sqlite3), and the next start posts them, marked redelivered, without
    evaluating their events again; ``status`` says so."""
    from tests.test_alert_outbox import script

    agents = workspace(tmp_path, {"wake_alert.py": ALERT_EVERY})

    def cfg(url: str) -> Config:
        return msgspec.convert(
            {
                "daemon": {"state_dir": str(tmp_path / "state"), "clock": "wall"},
                "hooks": {"agents_dir": str(agents), "alert_webhook": url},
            },
            Config,
        )

    events = [candle(i) for i in range(3)]
    for statuses in ([503], [204]):
        runner, url, got = await script(statuses)
        try:
            svc = Service(cfg(url), lambda _: [PacedFeed(events)], components=[open_agents])
            with anyio.fail_after(30):
                await svc.run()
        finally:
            await runner.cleanup()
        if statuses == [503]:
            assert got and all(g["status"] == 503 for g in got)
            assert not [g for g in got if g["redelivered"]]
    alerts = [r for r in audit(tmp_path) if r["type"] == "hook" and r["decision"] == "ALERT"]
    assert len(alerts) == 3  # evaluated once: the restart did not raise them again
    assert sorted(g["eventId"] for g in got) == sorted(r["eventId"] for r in alerts)
    assert all(g["redelivered"] for g in got)
    st = read_status(tmp_path / "state").alerts
    assert st is not None and (st.posted, st.reposted, st.kept) == (3, 3, 0)
    told = sorted(
        (r["eventId"], r["status"], r["redelivered"], r["kept"])
        for r in audit(tmp_path)
        if r["type"] == "alert"
    )
    assert told == sorted(
        (r["eventId"], *fate)
        for r in alerts
        for fate in (("failed", False, True), ("posted", True, False))
    )


@pytest.mark.parametrize("bad", ["garbage", "fifo", "directory"])
async def test_an_alert_outbox_that_does_not_open_costs_only_the_redelivery(
    tmp_path: Path, bad: str
) -> None:
    """alerts.sqlite3 not a database, a FIFO or a directory: the daemon starts, says so,
    and posts each alert as raised (nothing is kept for later)."""
    import os

    from tests.test_alert_outbox import script

    state = tmp_path / "state"
    state.mkdir()
    box = state / "alerts.sqlite3"
    if bad == "garbage":
        box.write_bytes(b"not a database" * 100)
    elif bad == "fifo":
        os.mkfifo(box)
    else:
        box.mkdir()
    agents = workspace(tmp_path, {"wake_alert.py": ALERT_EVERY})
    cfg = msgspec.convert(
        {
            "daemon": {"state_dir": str(state), "clock": "wall"},
            "hooks": {"agents_dir": str(agents), "alert_webhook": "http://x.invalid/"},
        },
        Config,
    )
    runner, url, got = await script([204])
    cfg = msgspec.structs.replace(cfg, hooks=msgspec.structs.replace(cfg.hooks, alert_webhook=url))
    try:
        with structlog.testing.capture_logs() as logs:
            svc = Service(cfg, lambda _: [PacedFeed([candle(i) for i in range(3)])],
                          components=[open_agents])  # fmt: skip
            with anyio.fail_after(30):
                await svc.run()
    finally:
        await runner.cleanup()
    assert len(got) == 3 and not any(g["redelivered"] for g in got)
    assert any(e["event"].startswith("alert outbox not opened") for e in logs)
    st = read_status(state).alerts
    assert st is not None and (st.posted, st.kept) == (3, None)


async def test_wakes_still_queued_when_a_replay_ends_are_run(tmp_path: Path) -> None:
    """On event time, a collect run still waiting for its debounce when the feed runs
    out starts before the daemon exits (it comes due in event time, at the end)."""
    toml = "[wake]\ndebounce_seconds = 600\n"
    agents = workspace(tmp_path, {"wake_every.py": WAKE_EVERY}, toml)
    await run_service(tmp_path, agents, PacedFeed([candle(i) for i in range(3)]))
    wakes = [r for r in audit(tmp_path) if r["type"] == "wake"]
    assert [r["outcome"] for r in wakes] == ["queued"] * 3
    (run,) = [r for r in audit(tmp_path) if r["type"] == "run" and r["status"] == "finished"]
    assert run["eventIds"] == [r["eventId"] for r in wakes]
    assert not [r for r in wakes if r["suppressedBy"] == "shutdown"]


async def test_wakes_still_queued_at_a_signal_stop_run_after_the_restart(
    tmp_path: Path,
) -> None:
    """Stopped by a signal mid-replay, a collect run that never started is kept: its
    wakes stay 'queued' (nothing is recorded as dropped), and after the restart the
    run starts with them (the next wakes join it); `why` then shows the run."""
    toml = "[wake]\ndebounce_seconds = 6000\n"
    agents = workspace(tmp_path, {"wake_every.py": WAKE_EVERY}, toml)
    feed = PacedFeed([candle(i) for i in range(40)], gap=0.05)
    svc = Service(config(tmp_path, agents), lambda _: [feed], components=[open_agents])

    async def stop() -> None:
        await feed.when(3).wait()
        svc.request_stop()

    async with anyio.create_task_group() as tg:
        tg.start_soon(stop)
        with anyio.fail_after(30):
            await svc.run()
    wakes = [r for r in audit(tmp_path) if r["type"] == "wake"]
    queued = [r["eventId"] for r in wakes if r["outcome"] == "queued"]
    assert len(queued) >= 3 and not [r for r in wakes if r["suppressedBy"] != "none"]
    assert not [r for r in audit(tmp_path) if r["type"] == "run"]

    await run_service(tmp_path, agents, PacedFeed([candle(i) for i in range(40, 42)]))
    (run,) = [r for r in audit(tmp_path) if r["type"] == "run" and r["status"] == "finished"]
    assert run["eventIds"][: len(queued)] == queued
    assert [e for e in run["eventIds"] if e not in queued] == [
        candle(40).event_id,
        candle(41).event_id,
    ]
    from daemon.audit.why import collect, explain

    (story,) = explain(collect(tmp_path / "state" / "audit", queued[0]), queued[0]).agents
    assert story.outcome != "SUPPRESSED" and run["runId"] in story.why, story


async def test_trading_state_from_config_halts_orders(tmp_path: Path) -> None:
    """[trading] state = "HALTED" rejects every intent with the HALTED code; ACTIVE fills."""
    src = (
        "def evaluate(event, state):\n"
        '    return {"decision": "TRADE_INTENT", "reason": "buy",\n'
        '            "dedupeKey": "b:" + event["eventId"],\n'
        '            "intent": {"action": "PLACE_MARKET_ORDER", "symbol": event["symbol"],\n'
        '                       "side": "buy", "volume": 0.01, "stopLoss": 50.0}}\n'
    )
    for state in ("HALTED", "ACTIVE"):
        root = tmp_path / state
        agents = workspace(root, {"autotrade_buy.py": src})
        cfg = msgspec.convert(
            {
                "daemon": {"state_dir": str(root / "state")},
                "hooks": {"agents_dir": str(agents)},
                "trading": {"state": state},
            },
            Config,
        )
        svc = Service(cfg, lambda _: [PacedFeed([candle(0), candle(1)])], components=[open_agents])
        with anyio.fail_after(30):
            await svc.run()
        risk = [r for r in audit(root) if r["type"] == "risk"]
        assert len(risk) == 2
        if state == "HALTED":
            assert all(not r["approved"] and r["reasons"][0]["code"] == "HALTED" for r in risk)
        else:
            assert all(r["approved"] for r in risk)


async def test_trading_results_do_not_depend_on_replay_speed(tmp_path: Path) -> None:
    """The broker sees the market in step with the agent: the same events give the same
    risk verdicts and order states whether replayed flat out or paced."""
    src = (
        "def evaluate(event, state):\n"
        "    c = event['payload']['close']\n"
        '    return {"decision": "TRADE_INTENT", "reason": "dip",\n'
        '            "dedupeKey": "d:" + event["eventId"], "cooldownSeconds": 120,\n'
        '            "intent": {"action": "PLACE_LIMIT_ORDER", "symbol": event["symbol"],\n'
        '                       "side": "buy", "volume": 0.01, "openPrice": c - 1.5,\n'
        '                       "stopLoss": c - 3, "takeProfit": c + 2}}\n'
    )
    outcomes = []
    for gap in (0.0, 0.01):
        root = tmp_path / str(gap)
        agents = workspace(root, {"autotrade_dip.py": src})
        await run_service(root, agents, PacedFeed([candle(i) for i in range(30)], gap=gap))
        outcomes.append(
            [
                (r["type"], r.get("approved"), r.get("status"), r.get("role"))
                for r in audit(root)
                if r["type"] in ("risk", "order")
            ]
        )
    assert outcomes[0] == outcomes[1]
    assert ("order", None, "FILLED", "entry") in outcomes[0]


async def test_a_hook_places_moves_and_cancels_its_own_order(tmp_path: Path) -> None:
    """Through the real pipeline: candle 0 rests a limit, candle 1 moves it (the hook
    finds it in state.orders), candle 2 cancels it; a malformed intent is a recorded
    invalid_result of the hook, never a trade."""
    src = (
        "def evaluate(event, state):\n"
        "    sym = event['symbol']\n"
        "    mine = [o for o in state['orders'] if o['symbol'] == sym]\n"
        "    n = len(state['candles'][sym]['1m'])\n"
        "    base = {'decision': 'TRADE_INTENT', 'reason': 'step ' + str(n)}\n"
        "    if n == 1:\n"
        "        return {**base, 'intent': {'action': 'PLACE_LIMIT_ORDER', 'symbol': sym,\n"
        "                'side': 'buy', 'volume': 0.01, 'openPrice': 98.0, 'stopLoss': 90.0}}\n"
        "    if n == 2:\n"
        "        return {**base, 'intent': {'action': 'MODIFY_ORDER', 'symbol': sym,\n"
        "                'orderId': mine[0]['clientOrderId'], 'openPrice': 97.5}}\n"
        "    if n == 3:\n"
        "        return {**base, 'intent': {'action': 'CANCEL_ORDER', 'symbol': sym,\n"
        "                'orderId': mine[0]['clientOrderId']}}\n"
        "    return {**base, 'intent': {'action': 'CANCEL_ORDER', 'symbol': sym}}\n"
    )
    agents = workspace(tmp_path, {"autotrade_steps.py": src})
    await run_service(tmp_path, agents, PacedFeed([candle(i) for i in range(4)]))
    rows = audit(tmp_path)
    risk = [(r["intent"]["action"], r["approved"]) for r in rows if r["type"] == "risk"]
    assert risk == [("PLACE_LIMIT_ORDER", True), ("MODIFY_ORDER", True), ("CANCEL_ORDER", True)]
    orders = [(o["status"], o["price"]) for o in rows if o["type"] == "order"]
    assert orders == [("OPEN", 98.0), ("OPEN", 97.5), ("CANCELED", 97.5)]
    (bad,) = [r for r in rows if r["type"] == "hook" and r.get("error")]
    assert bad["error"].startswith(
        "invalid_result: invalid TRADE_INTENT result: CANCEL_ORDER needs"
    )


async def test_a_transient_compile_failure_at_start_is_retried_not_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first compile of the agent's hook times out (a loaded machine): it is
    compiled again before the agent serves, so no event goes by unevaluated (and
    marked as done) while the hook was missing."""
    from hooks_runtime.pool import HookResult, WorkerPool

    real = WorkerPool.compile
    calls: list[int] = []

    async def flaky(self: WorkerPool, agent_id: str, hooks: list[Any]) -> list[HookResult]:
        calls.append(len(hooks))
        if len(calls) == 1:
            return [
                HookResult(hook_id=h.hook_id, kind=h.kind, revision=h.revision, runtime_ms=1000.0,
                           error_kind="timeout", error="compile overran 1000 ms")
                for h in hooks
            ]  # fmt: skip
        return await real(self, agent_id, hooks)

    monkeypatch.setattr(WorkerPool, "compile", flaky)
    agents = workspace(tmp_path, {"wake_every.py": WAKE_EVERY})
    await run_service(tmp_path, agents, PacedFeed([candle(i) for i in range(5)]))
    rows = [r for r in audit(tmp_path) if r["type"] == "hook"]
    assert [r["eventId"] for r in rows] == [candle(i).event_id for i in range(5)]
    assert calls[:2] == [1, 1]


async def test_the_broker_outbox_yields_only_when_full() -> None:
    """An account event goes into the outbox without giving the loop a turn while
    there is room (anyio's ``send`` gives one per item); a full outbox waits for
    the forwarder, and order holds; a closed outbox (a cut drain) drops the event
    without raising, so the broker goes on to audit the rest of what it did."""
    from daemon.agents.pipeline import _post

    send, receive = anyio.create_memory_object_stream[FeedEvent](2)
    ran: list[str] = []
    got: list[str] = []

    async def forward() -> None:
        async with receive:
            async for e in receive:
                got.append(e.event_id)

    async def other() -> None:
        ran.append("other task")

    async with anyio.create_task_group() as tg:
        tg.start_soon(other)  # runs at the loop's next turn
        await _post(send, candle(0))
        await _post(send, candle(1))
        assert ran == [] and got == []  # no turn was given
        tg.start_soon(forward)
        await _post(send, candle(2))  # full: waits until the forwarder takes some
        assert ran == ["other task"]
        send.close()
    assert got == [candle(i).event_id for i in range(3)]
    await _post(send, candle(3))  # closed: dropped, not raised
    assert got == [candle(i).event_id for i in range(3)]


KEYED_COOL = f"""
KEYS = ["a", "b", "b", "b"]

def evaluate(event, state):
    i = (event["payload"]["closeTimeMs"] - {T0}) // 60000 - 1
    return {{"decision": "ALERT", "reason": "k", "dedupeKey": KEYS[i], "cooldownSeconds": 90}}
"""


async def test_a_key_suppressed_by_a_cooldown_is_not_spent(tmp_path: Path) -> None:
    """A new key met during a cooldown is suppressed by the cooldown and not marked
    (it acts once the cooldown is over); a key already acted on is a dedupe, even
    during a cooldown."""
    agents = workspace(tmp_path, {"wake_keyed.py": KEYED_COOL})
    await run_service(tmp_path, agents, PacedFeed([candle(i) for i in range(4)]))
    got = [r["suppressedBy"] for r in audit(tmp_path) if r["type"] == "hook"]
    assert got == ["none", "cooldown", "none", "dedupe"]


RUN_SLOWLY = """
import os, sys, time
open(sys.argv[1], "w").close()
time.sleep(float(sys.argv[2]))
"""


@pytest.mark.parametrize("stop_timeout", [8.0, 0.3])
async def test_a_live_stop_lets_the_run_in_flight_end_within_its_timeout(
    tmp_path: Path, stop_timeout: float
) -> None:
    """Live, the daemon stops while a wake run is in flight (its program takes 1.5 s):
    within ``stop_timeout_seconds`` the run ends as it would have (``finished``);
    past it, the stop cuts it (``failed``, cancelled). No second run starts meanwhile."""
    import sys

    started, script = tmp_path / "started", tmp_path / "run.py"
    script.write_text(RUN_SLOWLY)
    toml = (
        "[wake]\ndebounce_seconds = 0\ncooldown_after_run_seconds = 0\n"
        f'[wake.runner]\nkind = "command"\n'
        f'command = ["{sys.executable}", "{script}", "{started}", "1.5"]\n'
    )
    agents = workspace(tmp_path, {"wake_every.py": WAKE_EVERY}, toml)
    cfg = msgspec.convert(
        {
            "daemon": {
                "state_dir": str(tmp_path / "state"),
                "clock": "wall",
                "stop_timeout_seconds": stop_timeout,
            },
            "hooks": {"agents_dir": str(agents)},
        },
        Config,
    )
    feed = PacedFeed([candle(0), candle(1)], hold=True)
    feed.gate(1)  # the second candle waits until the first one's run is in flight
    svc = Service(cfg, lambda _: [feed], components=[open_agents])
    async with anyio.create_task_group() as tg:
        tg.start_soon(svc.run)
        with anyio.fail_after(20):
            while not started.exists():  # noqa: ASYNC110 (the program writes it)
                await anyio.sleep(0.02)
        feed.gate(1).set()  # its wake queues behind the run in flight
        await feed.when(2).wait()
        await anyio.sleep(0.1)
        feed.release.set()  # the feed ends: the daemon stops with the run in flight
    runs = [r for r in audit(tmp_path) if r["type"] == "run"]
    assert len([r for r in runs if r["status"] == "started"]) == 1, runs
    (end,) = [r for r in runs if r["status"] != "started"]
    if stop_timeout > 1.5:
        assert end["status"] == "finished"
    else:
        assert end["status"] == "failed" and end["error"].startswith("cancelled")


SLOW_WAKE = """
def evaluate(event, state):
    n = 0
    for i in range(3000000):  # a slow hook: the stop comes while candles wait for it
        n += i
    return {"decision": "WAKE", "reason": "slow", "dedupeKey": "k:" + event["eventId"]}
"""


async def test_a_live_stop_starts_no_run_for_the_wakes_its_drain_evaluates(
    tmp_path: Path,
) -> None:
    """Live, a stop comes while the agent still holds candles (its hook is slow):
    their wakes, decided during the drain, are queued (not ``woke``) and kept for the
    next start; no run starts that the stop's deadline would likely cut."""
    toml = "[wake]\ndebounce_seconds = 0\ncooldown_after_run_seconds = 0\n"
    agents = workspace(tmp_path, {"wake_slow.py": SLOW_WAKE}, toml)
    cfg = msgspec.convert(
        {
            "daemon": {"state_dir": str(tmp_path / "state"), "clock": "wall"},
            "hooks": {"agents_dir": str(agents), "sandbox": {"timeout_ms": 20000}},
        },
        Config,
    )
    feed = PacedFeed([candle(i) for i in range(3)], hold=True)
    svc = Service(cfg, lambda _: [feed], components=[open_agents])

    async def stop() -> None:
        await feed.when(3).wait()
        svc.request_stop()  # the first candle's hook is still running

    async with anyio.create_task_group() as tg:
        tg.start_soon(stop)
        with anyio.fail_after(60):
            await svc.run()
    rows = audit(tmp_path)
    assert len([r for r in rows if r["type"] == "hook"]) == 3  # all evaluated in the drain
    assert [r["outcome"] for r in rows if r["type"] == "wake"] == ["queued"] * 3
    assert not [r for r in rows if r["type"] == "run"]
    from daemon.wake.store import RunStore

    store = RunStore.in_dir(tmp_path / "state")
    try:
        assert len(store.pending("alpha")) == 1  # one collect run, for the next start
    finally:
        store.close()
