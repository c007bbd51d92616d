"""`why` over a synthetic story written through the AuditWriter."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from daemon.audit.render import price_text
from daemon.audit.why import collect, explain
from daemon.audit.writer import AuditWriter
from daemon.cli.audit import audit_group, why_command
from tests.audit.factory import hook, opened_parts, order, risk, run, ts, wake

EVENT = "coinbase:ETH-USD:5m:1"


@pytest.fixture
def logdir(tmp_path: Path) -> Path:
    w = AuditWriter(tmp_path)
    # alpha wakes and auto-trades; the run and order records carry only the trace.
    w.write(hook(decision="WAKE", reason="two green candles"))
    w.write(
        hook(hook_id="autotrade_doji", kind="autotrade", decision="TRADE_INTENT", reason="doji")
    )
    w.write(risk(client_order_id="mw-1", hook_id="autotrade_doji", event_id=EVENT))
    w.write(order(status="OPEN"))
    w.write(order(status="FILLED"))
    w.write(wake(run_id="r1", hook_ids=["wake_two_green"], reasons=["two green candles"]))
    w.write(run(status="started"))
    w.write(run(status="finished", duration_ms=1200.0))
    # beta wakes only.
    w.write(hook(agent_id="beta", decision="WAKE", reason="breakout"))
    w.write(wake(agent_id="beta", run_id="r2"))
    # gamma would wake but is cooling down; delta ignores; eps is rejected; zeta fails.
    w.write(hook(agent_id="gamma", decision="WAKE", suppressed_by="cooldown"))
    w.write(hook(agent_id="delta", reason="one green candle"))
    w.write(hook(agent_id="eps", hook_id="autotrade_x", kind="autotrade", decision="TRADE_INTENT"))
    reasons = [{"code": "DAILY_LOSS", "message": "PnL -600 beyond -500"}]
    w.write(risk(agent_id="eps", approved=False, reasons=reasons, event_id=EVENT))
    w.write(hook(agent_id="zeta", decision=None, error="HookTimeout: overran 250 ms"))
    # another event of alpha's, which must not leak in.
    w.write(hook(event_id="other", trace_id="t2", decision="WAKE", ts=ts(sec=9)))
    w.write(run(trace_id="t2", run_id="r9", ts=ts(sec=10)))
    w.close()
    return tmp_path


EXPECTED = {
    "alpha": "TRADED",
    "beta": "WOKE",
    "gamma": "SUPPRESSED",
    "delta": "NO_WAKE",
    "eps": "TRADE_REJECTED",
    "zeta": "HOOK_ERROR",
}


@pytest.mark.parametrize("ident", [EVENT, "t1"])
def test_why_explains_each_agent(logdir: Path, ident: str) -> None:
    """By eventId or traceId, every agent gets the right outcome and its linked records."""
    exp = explain(collect(logdir, ident), ident)
    assert {s.agent_id: s.outcome for s in exp.agents} == EXPECTED
    assert exp.trace_ids == ["t1"] and exp.event_ids == [EVENT]
    alpha = next(s for s in exp.agents if s.agent_id == "alpha")
    assert len(alpha.records) == 8
    assert any("run r1 (log) finished" in d for d in alpha.details)
    assert alpha.why == "order mw-1 FILLED @ 1000"


def test_why_an_order_tells_its_agents_story(logdir: Path) -> None:
    """A clientOrderId (what status and audit tail show) gives the story of the event
    that placed the order, for the agent that placed it only (the trace is the
    event's, shared by every agent that evaluated it)."""
    exp = explain(collect(logdir, "mw-1"), "mw-1")
    [alpha] = exp.agents
    assert alpha.agent_id == "alpha" and alpha.outcome == "TRADED"
    assert alpha.why == "order mw-1 FILLED @ 1000"
    assert len(alpha.records) == 8 and exp.event_ids == [EVENT]  # the same rows as by event
    text = CliRunner().invoke(why_command, ["mw-1", "--dir", str(logdir)])
    assert text.exit_code == 0 and "agent alpha: TRADED" in text.output
    assert "agent beta" not in text.output


def test_prices_read_without_a_float_tail(tmp_path: Path) -> None:
    """`why` and `audit tail` print a fill's price with the digits that matter: an
    average of partial fills ending in ...0000000002 reads 1696.81."""
    prices = (1696.8100000000002, 65000.0, 0.00001234, 2, "n/a", 92265.66, 1.2345678901234e-05,
              123456789012345.0, 0.0, -0.5)  # fmt: skip
    assert [price_text(p) for p in prices] == [
        "1696.81", "65000", "0.00001234", "2", "n/a", "92265.66", "0.0000123456789012",
        "123456789012345", "0", "-0.5",
    ]  # fmt: skip
    w = AuditWriter(tmp_path)
    w.write(order(status="FILLED", price=1696.8100000000002))
    w.close()
    exp = explain(collect(tmp_path, "mw-1"), "mw-1")
    assert exp.agents[0].why == "order mw-1 FILLED @ 1696.81"
    tail = CliRunner().invoke(audit_group, ["tail", "--dir", str(tmp_path)])
    assert tail.exit_code == 0 and "@ 1696.81 (limit" in tail.output


def test_an_order_that_ended_unfilled_says_why(tmp_path: Path) -> None:
    """A canceled order's row says why it ended (here: a limit good till a time) in
    `why` and in `audit tail`; a filled one has no such tail."""
    expired = "expired: good till 2025-01-10T07:20:00.000Z"
    w = AuditWriter(tmp_path)
    w.write(order(status="OPEN", reason="far bid"))
    w.write(order(status="CANCELED", reason=expired))
    w.close()
    exp = explain(collect(tmp_path, "mw-1"), "mw-1")
    assert exp.agents[0].why == f"order mw-1 CANCELED @ 1000: {expired}"
    assert exp.agents[0].outcome == "NOT_FILLED"  # placed, but nothing traded
    tail = CliRunner().invoke(audit_group, ["tail", "--dir", str(tmp_path)])
    opened, canceled = tail.output.splitlines()
    assert "far bid" not in opened and f"(limit, entry) mw-1: {expired}" in canceled


def test_why_reasons_are_specific(logdir: Path) -> None:
    """The one-line why names the suppressor, the risk code, the error and the IGNORE reason."""
    why = {s.agent_id: s.why for s in explain(collect(logdir, EVENT), EVENT).agents}
    assert "cooldown" in why["gamma"]
    assert "DAILY_LOSS" in why["eps"]
    assert "HookTimeout" in why["zeta"]
    assert "one green candle" in why["delta"]
    assert "wake_two_green returned WAKE; run r2" in why["beta"]


def test_why_cli_text_json_and_missing(logdir: Path) -> None:
    """The why command prints per-agent outcomes, --json parses, an unknown id exits 1."""
    runner = CliRunner()
    text = runner.invoke(why_command, [EVENT, "--dir", str(logdir)])
    assert text.exit_code == 0, text.output
    assert "agent gamma: SUPPRESSED" in text.output and "agent alpha: TRADED" in text.output
    assert f"events {EVENT} (event time 2025-03-01T12:05:00.000Z)" in text.output
    data = json.loads(runner.invoke(why_command, ["t1", "--dir", str(logdir), "--json"]).output)
    assert {a["agentId"]: a["outcome"] for a in data["agents"]} == EXPECTED
    missing = runner.invoke(why_command, ["nope", "--dir", str(logdir)])
    assert missing.exit_code == 1 and "no audit records for nope" in missing.output


def test_why_is_also_an_audit_subcommand(logdir: Path) -> None:
    """`marketwake audit why` reaches the same command."""
    out = CliRunner().invoke(audit_group, ["why", "t1", "--dir", str(logdir)]).output
    assert "agent beta: WOKE" in out


def test_why_at_a_market_time_explains_the_first_event_then(tmp_path: Path) -> None:
    """`why --at TIME` finds the first event at or after it (of --symbol / --agent when
    given) by the hook rows' eventTs, whatever order the rows were written in."""
    from daemon.audit.why import event_at
    from daemon.events import parse_iso_ms

    w = AuditWriter(tmp_path)
    for event_id, symbol, at in [
        ("e:ETH:1205", "ETH-USD", "2025-03-01T12:05:00.000Z"),
        ("e:BTC:1200", "BTC-USD", "2025-03-01T12:00:00.000Z"),  # written later, earlier time
        ("e:ETH:1210", "ETH-USD", "2025-03-01T12:10:00.000Z"),
    ]:
        w.write(hook(event_id=event_id, symbol=symbol, event_ts=at, trace_id=event_id))
    w.close()
    noon = parse_iso_ms("2025-03-01T12:00:00Z")
    assert event_at(tmp_path, noon) == "e:BTC:1200"
    assert event_at(tmp_path, noon, symbol="ETH-USD") == "e:ETH:1205"
    assert event_at(tmp_path, noon + 6 * 60_000) == "e:ETH:1210"
    assert event_at(tmp_path, noon, agent="nobody") is None

    cli = CliRunner()
    res = cli.invoke(why_command, ["--dir", str(tmp_path), "--at", "2025-03-01T12:01"])
    assert res.exit_code == 0 and "e:ETH:1205" in res.output, res.output
    late = cli.invoke(why_command, ["--dir", str(tmp_path), "--at", "2025-03-02"])
    assert late.exit_code == 1 and "no event at or after 2025-03-02" in late.output
    for args in ([], ["e:ETH:1205", "--at", "2025-03-01"], ["e:ETH:1205", "--symbol", "ETH-USD"]):
        bad = cli.invoke(why_command, ["--dir", str(tmp_path), *args])
        assert bad.exit_code == 2, (args, bad.output)
    # Damaged rows (no event id, an odd or unparsable time, not an object) are skipped;
    # a time spelled without milliseconds still sorts by what it means.
    with (tmp_path / "audit-2025-03-01.jsonl").open("a") as f:
        f.write('{"type":"hook","ts":"2025-03-01T13:00:00.000Z","agentId":"alpha",'
                '"eventTs":"2025-03-01T11:00:00.000Z"}\n'
                '{"type":"hook","ts":"2025-03-01T13:00:00.000Z","agentId":"alpha",'
                '"eventTs":12345,"eventId":"num"}\n'
                '{"type":"hook","ts":"2025-03-01T13:00:00.000Z","agentId":"alpha",'
                '"eventTs":"2025-03-01T12:01:00Z","eventId":"e:short"}\n'
                '[1,2]\n{"type":"hook"\n')  # fmt: skip
    assert event_at(tmp_path, noon + 60_000) == "e:short"
    assert event_at(tmp_path, noon) == "e:BTC:1200"


@pytest.mark.parametrize(
    ("statuses", "outcome"),
    [
        (["PENDING_SUBMIT"], "ORDER_OPEN"),
        (["PENDING_SUBMIT", "OPEN"], "ORDER_OPEN"),
        (["OPEN", "PARTIALLY_FILLED", "CANCELED"], "TRADED"),
        (["OPEN", "FILLED"], "TRADED"),
        (["PENDING_SUBMIT", "REJECTED"], "NOT_FILLED"),
    ],
)
def test_an_order_trades_only_once_it_fills(
    tmp_path: Path, statuses: list[str], outcome: str
) -> None:
    """The agent's outcome is TRADED only once its order filled (a part is enough);
    an order still working is ORDER_OPEN, one that ended unfilled NOT_FILLED."""
    w = AuditWriter(tmp_path)
    for status in statuses:
        w.write(order(status=status))
    w.close()
    exp = explain(collect(tmp_path, "mw-1"), "mw-1")
    assert exp.agents[0].outcome == outcome
    odd = [{"type": "order", "agentId": "alpha", "clientOrderId": ["x"], "status": "OPEN"}]
    assert explain(odd, "x").agents[0].outcome == "ORDER_OPEN"  # a hand-edited row: no crash
    text = CliRunner().invoke(why_command, ["mw-1", "--dir", str(tmp_path)])
    assert text.exit_code == 0 and f"agent alpha: {outcome}" in text.output


def test_a_run_a_stop_cut_is_found_by_its_run_id(tmp_path: Path) -> None:
    """The row that ends a run a stop cut carries the run id but no trace (the run
    store keeps none): `why` of the waking event still shows how the run ended.
    A run of another event, also without a trace, stays out."""
    w = AuditWriter(tmp_path)
    w.write(hook(decision="WAKE", reason="two green candles"))
    w.write(wake(run_id="r1"))
    w.write(run(status="started"))
    w.write(run(trace_id=None, status="failed", error="interrupted: the daemon stopped",
                ts=ts(sec=30)))  # fmt: skip
    w.write(run(trace_id=None, run_id="r7", status="failed", ts=ts(sec=31)))
    w.close()
    records = collect(tmp_path, EVENT)
    assert [
        (r["type"], r.get("runId"), r.get("status")) for r in records if r["type"] == "run"
    ] == [
        ("run", "r1", "started"),
        ("run", "r1", "failed"),
    ]
    (story,) = explain(records, EVENT).agents
    assert story.outcome == "WOKE" and "run r1 failed" in story.why


def test_a_run_a_stop_cut_and_its_rerun_are_both_told(tmp_path: Path) -> None:
    """A cut run whose wakes ran again (``rerun_interrupted_within_seconds``): both runs
    carry the wake's trace, so `why` shows the cut run's end and the re-run, and says
    how the re-run ended."""
    w = AuditWriter(tmp_path)
    w.write(hook(decision="WAKE", reason="two green candles"))
    w.write(wake(run_id="r1"))
    w.write(run(status="started"))
    w.write(run(status="failed", ts=ts(sec=30),
                error="interrupted: the daemon stopped during this run; its wakes run again as r2"))  # fmt: skip
    w.write(run(run_id="r2", status="started", ts=ts(sec=31)))
    w.write(run(run_id="r2", status="finished", ts=ts(sec=40)))
    w.close()
    records = collect(tmp_path, EVENT)
    assert [(r.get("runId"), r.get("status")) for r in records if r["type"] == "run"] == [
        ("r1", "started"),
        ("r1", "failed"),
        ("r2", "started"),
        ("r2", "finished"),
    ]
    (story,) = explain(records, EVENT).agents
    assert story.outcome == "WOKE" and "run r2 finished" in story.why
    assert any("its wakes run again as r2" in line for line in story.details)


def test_an_alert_is_told_with_what_the_webhook_made_of_it(tmp_path: Path) -> None:
    """An ALERT is the agent's outcome (not "no wake"), with its fate at the webhook:
    here a failure kept for later, then the redelivery; without an alert row, it was
    only logged. ``audit tail`` shows the rows."""
    from daemon.audit.records import AlertRecord

    def alert(**kw: object) -> AlertRecord:
        base: dict[str, object] = {
            "ts": ts(sec=2), "agent_id": "alpha", "trace_id": "t1", "hook_id": "wake_crash",
            "event_id": EVENT, "status": "posted",
        }  # fmt: skip
        return AlertRecord(**(base | kw))  # type: ignore[arg-type]

    w = AuditWriter(tmp_path)
    w.write(hook(hook_id="wake_crash", decision="ALERT", reason="BTC -12% in 24h"))
    w.write(alert(status="failed", kept=True, error="HTTP 503"))
    w.write(alert(ts=ts(sec=40), redelivered=True))
    w.write(hook(agent_id="beta", hook_id="wake_crash", decision="ALERT", reason="BTC -12%"))
    w.write(hook(agent_id="gamma", hook_id="wake_crash", decision="ALERT",
                 suppressed_by="dedupe"))  # fmt: skip
    w.close()
    stories = {s.agent_id: s for s in explain(collect(tmp_path, EVENT), EVENT).agents}
    alpha, beta = stories["alpha"], stories["beta"]
    assert alpha.outcome == "ALERTED"
    assert alpha.why == (
        "wake_crash returned ALERT; webhook: posted (posted again after a restart or an outage)"
    )
    assert any("NOT DELIVERED (HTTP 503); kept, to be posted again" in d for d in alpha.details), (
        alpha.details
    )
    assert beta.outcome == "ALERTED" and "logged (no webhook" in beta.why
    assert stories["gamma"].outcome == "NO_WAKE"  # suppressed: nothing went out
    shown = CliRunner().invoke(audit_group, ["tail", "--dir", str(tmp_path), "--type", "alert"])
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert len(lines) == 2
    assert "alert FAILED wake_crash at the webhook: HTTP 503 (kept" in lines[0]
    assert "alert posted (redelivered) wake_crash" in lines[1]


def _two_days(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, older: list[Any], today: list[Any]
) -> list[str]:
    """An audit log of 2026-02-16 (``older``) and 2026-02-17 (``today``); returns the list
    the names of the files read are added to."""
    from daemon.audit.records import encode_line

    (tmp_path / "audit-2026-02-16.jsonl").write_bytes(b"".join(map(encode_line, older)))
    (tmp_path / "audit-2026-02-17.jsonl").write_bytes(b"".join(map(encode_line, today)))
    return opened_parts(monkeypatch)


def test_a_candles_rows_are_looked_for_from_its_close_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A candle's event id names its close time, and no row about it was written
    before: `why` does not open the days before it. An id whose time is after its
    rows (future-dated synthetic data) is still found, by a second pass."""
    from daemon.events import parse_iso_ms

    candle = f"replay:BTC-USD:5m:{parse_iso_ms(ts('2026-02-17', 0))}"
    future = f"replay:BTC-USD:5m:{parse_iso_ms(ts('2027-01-01', 0))}"
    older = [hook(event_id=f"old{i}", trace_id=f"o{i}", ts=ts("2026-02-16", i)) for i in range(9)]
    today = [
        hook(event_id=candle, trace_id="t-c", decision="WAKE", ts=ts("2026-02-17", 6)),
        hook(event_id=future, trace_id="t-f", ts=ts("2026-02-17", 7)),
    ]
    opened = _two_days(tmp_path, monkeypatch, older, today)
    (story,) = explain(collect(tmp_path, candle), candle).agents
    assert story.records[0]["eventId"] == candle
    assert "audit-2026-02-16.jsonl" not in opened, opened
    opened.clear()
    (story,) = explain(collect(tmp_path, future), future).agents
    assert story.records[0]["eventId"] == future
    assert opened.count("audit-2026-02-16.jsonl") == 1, opened


def test_an_events_trace_is_read_from_its_own_day_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`why <eventId>` reads the whole log once to find the event, then its trace only
    from the event's day on (a trace starts at its evaluation): an older day is opened
    once, not once per pass. An order's story still reaches back to its event."""
    older = [hook(event_id=f"old{i}", trace_id=f"o{i}", ts=ts("2026-02-16", i)) for i in range(50)]
    older.append(hook(event_id="e-order", trace_id="t-order", decision="TRADE_INTENT",
                      ts=ts("2026-02-16", 59)))  # fmt: skip
    today = [
        hook(decision="WAKE", reason="two green candles"),
        wake(run_id="r1"),
        run(status="finished", duration_ms=5.0),
        order(client_order_id="mw-9", trace_id="t-order", status="FILLED"),
    ]
    opened = _two_days(tmp_path, monkeypatch, older, today)
    (story,) = explain(collect(tmp_path, EVENT), EVENT).agents
    assert story.outcome == "WOKE" and len(story.records) == 3
    assert opened.count("audit-2026-02-16.jsonl") == 1, opened
    opened.clear()
    (story,) = explain(collect(tmp_path, "mw-9"), "mw-9").agents
    assert [r["type"] for r in story.records] == ["hook", "order"]  # its event, the day before


def test_why_a_wake_merged_into_another_events_run_finds_that_run(tmp_path: Path) -> None:
    """Collect mode merged e2's wake into the run t1's wake started: the run's rows carry
    t1's trace and list t2 among theirs. Asked about e2, `why` finds the run and says
    it answered both wakes, not that e2's wake is still queued."""
    w = AuditWriter(tmp_path)
    w.write(hook(decision="WAKE", reason="two green candles"))
    w.write(wake(run_id="r1", outcome="queued"))
    w.write(hook(event_id="e2", trace_id="t2", decision="WAKE", reason="breakout", ts=ts(sec=1)))
    w.write(wake(run_id="r1", trace_id="t2", outcome="queued", ts=ts(sec=1)))
    both = {"event_ids": [EVENT, "e2"], "trace_ids": ["t1", "t2"], "wakes": 2}
    w.write(run(run_id="r1", status="started", ts=ts(sec=3), **both))
    w.write(run(run_id="r1", status="finished", duration_ms=900.0, ts=ts(sec=9), **both))
    w.write(run(run_id="r9", trace_id="t9", status="finished", ts=ts(sec=10)))
    w.close()
    (story,) = explain(collect(tmp_path, "e2"), "e2").agents
    assert story.outcome == "WOKE", story.why
    assert "run r1 finished" in story.why and "2 wakes" in story.why
    ran = [(r["runId"], r["status"]) for r in story.records if r["type"] == "run"]
    assert ran == [("r1", "started"), ("r1", "finished")]
    hooks = [r["reason"] for r in story.records if r["type"] == "hook"]
    assert hooks == ["breakout"]  # the other event's rows are that event's story
    (first,) = explain(collect(tmp_path, EVENT), EVENT).agents
    assert first.outcome == "WOKE" and "run r1 finished" in first.why


def test_why_a_run_tells_the_wakes_that_started_it(tmp_path: Path) -> None:
    """A run's id (as `audit tail` shows it) tells the events whose wakes it took: in
    collect mode two events' traces, listed by the run's rows. Only the run's agent
    is told (another agent evaluated the same events), and another run stays out."""
    w = AuditWriter(tmp_path)
    w.write(hook(decision="WAKE", reason="two green candles"))
    w.write(hook(agent_id="beta", reason="flat"))
    w.write(wake(run_id="r1", outcome="queued"))
    w.write(hook(event_id="e2", trace_id="t2", decision="WAKE", reason="breakout", ts=ts(sec=3)))
    w.write(wake(run_id="r1", trace_id="t2", outcome="queued", ts=ts(sec=3)))
    both = {"event_ids": [EVENT, "e2"], "trace_ids": ["t1", "t2"]}
    w.write(run(run_id="r1", status="started", ts=ts(sec=5), **both))
    w.write(run(run_id="r1", status="finished", duration_ms=900.0, ts=ts(sec=9), **both))
    w.write(hook(event_id="e3", trace_id="t3", decision="WAKE", ts=ts(sec=20)))
    w.write(run(run_id="r2", trace_id="t3", status="finished", ts=ts(sec=21)))
    w.close()
    exp = explain(collect(tmp_path, "r1"), "r1")
    (story,) = exp.agents
    assert story.agent_id == "alpha"
    assert story.outcome == "WOKE" and "run r1 finished" in story.why
    assert sorted(exp.event_ids) == sorted([EVENT, "e2"])
    hooks = [r["reason"] for r in story.records if r["type"] == "hook"]
    assert hooks == ["two green candles", "breakout"]
    assert all(r.get("runId") != "r2" for r in story.records)
    shown = CliRunner().invoke(why_command, ["r1", "--dir", str(tmp_path)])
    assert shown.exit_code == 0 and "run r1 (log) finished" in shown.output, shown.output
