"""Reading the audit log back: filters, --since, torn lines, follow across rotation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from daemon.audit.reader import AuditFilter, Follower, Stats, iter_records, parse_since, tail
from daemon.audit.records import AuditRecord, HookRecord, encode_line
from daemon.audit.writer import AuditWriter
from daemon.events import parse_iso_ms
from tests.audit.factory import hook, opened_parts, order, ts, wake


@pytest.fixture
def logdir(tmp_path: Path) -> Path:
    w = AuditWriter(tmp_path)
    w.write(hook(ts=ts("2026-02-16"), reason="old"))
    w.write(hook(decision="WAKE", reason="two green"))
    w.write(
        hook(agent_id="beta", hook_id="autotrade_doji", decision="TRADE_INTENT", symbol="BTC-USD")
    )
    w.write(hook(decision=None, error="HookTimeout: 250 ms", reason=""))
    w.write(wake())
    w.write(order())
    w.close()
    return tmp_path


@pytest.mark.parametrize(
    ("flt", "expected"),
    [
        (AuditFilter(), 6),
        (AuditFilter(agent="beta"), 1),
        (AuditFilter(hook="wake_two_green"), 3),
        (AuditFilter(decision="wake"), 1),
        (AuditFilter(decision="ERROR"), 1),
        (AuditFilter(symbol="BTC-USD"), 1),
        (AuditFilter(types=frozenset({"wake", "order"})), 2),
        (AuditFilter(since_ms=parse_iso_ms("2026-02-17T00:00:00Z")), 5),
        (AuditFilter(agent="alpha", decision="IGNORE"), 1),
    ],
)
def test_filters(logdir: Path, flt: AuditFilter, expected: int) -> None:
    """Each filter keeps exactly the records it names."""
    assert len(list(iter_records(logdir, flt))) == expected


def test_tail_returns_last_n_in_order(logdir: Path) -> None:
    """tail keeps the newest n records, oldest first."""
    assert [r["type"] for r in tail(logdir, n=2)] == ["wake", "order"]


def test_tail_reads_older_parts_only_while_it_lacks_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The newest part is read first: when it holds the n newest matches no older
    part is opened; a filter the newest part does not satisfy reads back as far as
    it must, and the records come out oldest first across the parts."""
    from daemon.audit.files import list_files

    w = AuditWriter(tmp_path, flush_every=1, max_pending=1, max_file_bytes=2000)
    for i in range(60):
        w.write(hook(agent_id="beta" if i in (3, 4) else "alpha", reason=f"r{i:02d}"))
    w.close()
    parts = len(list(list_files(tmp_path)))
    assert parts > 4
    opened = opened_parts(monkeypatch)
    assert [r["reason"] for r in tail(tmp_path, None, 3)] == ["r57", "r58", "r59"]
    assert len(opened) == 1, opened
    opened.clear()
    beta = [r["reason"] for r in tail(tmp_path, AuditFilter(agent="beta"), 5)]
    assert beta == ["r03", "r04"] and len(opened) == parts
    whole = [r["reason"] for r in tail(tmp_path, None, 100)]
    assert whole == [f"r{i:02d}" for i in range(60)]
    assert [r["reason"] for r in tail(tmp_path, None, 0)] == []


def test_parse_since() -> None:
    """--since accepts durations and timestamps and rejects anything else clearly."""
    now = parse_iso_ms("2026-02-17T03:00:00Z")
    assert parse_since("15m", now) == now - 15 * 60_000
    assert parse_since("2h", now) == now - 7_200_000
    assert parse_since("1d", now) == now - 86_400_000
    assert parse_since("2026-02-17T02:00:00Z") == now - 3_600_000
    with pytest.raises(ValueError, match="expected a duration"):
        parse_since("yesterday")


def test_torn_lines_are_skipped_and_counted(logdir: Path) -> None:
    """A half-written or non-object line is skipped, counted, and reading continues."""
    path = max(logdir.iterdir())
    with path.open("ab") as fh:
        fh.write(b'[1, 2]\n{"type": "hook", "agentId"\n')
    stats = Stats()
    assert len(list(iter_records(logdir, stats=stats))) == 6
    assert stats.bad_lines == 2


def test_follower_picks_up_appends_and_new_files(tmp_path: Path) -> None:
    """Follow starts at the end, waits for a whole line, and follows into a new day's file."""
    w = AuditWriter(tmp_path, flush_every=1)
    w.write(hook(reason="before"))
    w.flush_sync()
    f = Follower(tmp_path, AuditFilter(agent="alpha"))
    assert f.poll() == []
    w.write(hook(reason="after"))
    w.write(hook(agent_id="beta"))
    w.flush_sync()
    assert [r["reason"] for r in f.poll()] == ["after"]
    path = max(tmp_path.iterdir())
    with path.open("ab") as fh:
        fh.write(b'{"type":"hook","agentId":"alpha","reason":"par')
    assert f.poll() == []
    with path.open("ab") as fh:
        fh.write(b'tial"}\n')
    assert [r["reason"] for r in f.poll()] == ["partial"]
    w.write(hook(ts=ts("2026-02-18"), reason="next day"))
    w.close()
    assert [r["reason"] for r in f.poll()] == ["next day"]


def test_follower_survives_truncation_and_deletion(tmp_path: Path) -> None:
    """A truncated file is re-read from the start; a deleted one is forgotten."""
    w = AuditWriter(tmp_path)
    w.write(hook(reason="a"))
    w.close()
    f = Follower(tmp_path)
    path = max(tmp_path.iterdir())
    path.write_bytes(b'{"type":"hook","reason":"fresh"}\n')
    assert [r["reason"] for r in f.poll()] == ["fresh"]
    path.unlink()
    assert f.poll() == []
    path.write_bytes(b'{"type":"hook","reason":"again"}\n')
    assert [r["reason"] for r in f.poll()] == ["again"]


def test_tail_then_follow_never_repeats_or_goes_back(tmp_path: Path) -> None:
    """`audit tail -f -n 5` while the daemon flushes a batch between the follower's
    start and the tail's read: the 5 newest before the start, then the batch once,
    in order. A line half written at the start is shown once, when complete."""
    w = AuditWriter(tmp_path, flush_every=1)
    for i in range(10):
        w.write(hook(reason=f"old {i}"))
    w.flush_sync()
    path = max(tmp_path.iterdir())
    with path.open("ab") as fh:
        fh.write(b'{"type":"hook","agentId":"alpha","reason":"half')
    f = Follower(tmp_path)
    with path.open("ab") as fh:
        fh.write(b'"}\n')
    for i in range(250):  # the flush that lands while tail reads
        w.write(hook(reason=f"new {i}"))
    w.flush_sync()
    shown = [r["reason"] for r in tail(tmp_path, None, 5, upto=f.offsets)]
    shown += [r["reason"] for r in f.poll()]
    w.close()
    assert shown == [f"old {i}" for i in range(5, 10)] + ["half"] + [f"new {i}" for i in range(250)]


def test_recent_rows_rebuild_each_agents_last_outputs(tmp_path: Path) -> None:
    """A row without ``output`` rebuilds {decision, reason, dedupeKey}; one with it is
    taken whole; a failed evaluation leaves the previous output in place."""
    from daemon.audit.reader import recent_evaluations

    w = AuditWriter(tmp_path)
    w.write(hook(event_id="e1", decision="WAKE", reason="first", dedupe_key="k1"))
    w.write(hook(event_id="e2", decision="WAKE", reason="second", dedupe_key="k2"))
    w.write(hook(event_id="e3", decision=None, error="HookTimeout: 250 ms", reason=""))
    full = {"decision": "IGNORE", "reason": "x", "data": {"n": 3}, "cooldownSeconds": 5.0}
    w.write(hook(agent_id="beta", hook_id="h", event_id="e1", decision="IGNORE", output=full))
    w.write(wake())
    w.close()
    recent = recent_evaluations(tmp_path)
    assert recent.evaluated == {"alpha": ["e1", "e2", "e3"], "beta": ["e1"]}
    assert recent.outputs == {
        "alpha": {"wake_two_green": {"decision": "WAKE", "reason": "second", "dedupeKey": "k2"}},
        "beta": {"h": full},
    }


def test_recent_rows_name_the_intents_a_stop_cut_short(tmp_path: Path) -> None:
    """An acted TRADE_INTENT row is cut short until a risk row of its agent, event and
    hook follows it; a suppressed one never acted, an IGNORE is no intent."""
    from daemon.audit.reader import CutIntent, recent_evaluations
    from tests.audit.factory import risk

    out = {"decision": "TRADE_INTENT", "reason": "r", "intent": {"action": "CLOSE_POSITION",
           "symbol": "ETH-USD"}}  # fmt: skip

    def intent(event_id: str, **kw: Any) -> HookRecord:
        return hook(event_id=event_id, hook_id="autotrade_x", kind="autotrade",
                    decision="TRADE_INTENT", output=out, **kw)  # fmt: skip

    w = AuditWriter(tmp_path)
    w.write(intent("e1"))
    w.write(risk(event_id="e1", hook_id="autotrade_x", client_order_id="mw-1"))  # checked
    w.write(intent("e2", suppressed_by="dedupe"))
    w.write(intent("e3"))
    w.write(risk(event_id="e3", hook_id="autotrade_other"))  # another hook's
    w.write(risk(agent_id="beta", event_id="e4", hook_id="autotrade_x"))
    w.write(intent("e4"))  # cut: the risk row above is another agent's
    w.write(hook(event_id="e5"))
    w.close()
    recent = recent_evaluations(tmp_path)
    topic = "market.candle.closed"
    assert recent.cut == {
        "alpha": [
            CutIntent("e3", topic, "autotrade_x", "t1", out),
            CutIntent("e4", topic, "autotrade_x", "t1", out),
        ]
    }
    assert recent.checked == {"mw-1"}  # a second hook's intent for it was not cut


def test_recent_rows_name_the_approvals_with_no_order_row(tmp_path: Path) -> None:
    """An approval stays unplaced until an order row of its client order id follows
    it, or a later verdict on that id; a refusal never is one, nor an approval
    after its order's rows. A hook's intent the approval checked goes with it (no
    longer cut: its risk row was written)."""
    from daemon.audit.reader import AuditedOrder, CutIntent, recent_evaluations
    from tests.audit.factory import risk

    out = {"decision": "TRADE_INTENT", "reason": "r", "intent": {"action": "CLOSE_POSITION",
           "symbol": "ETH-USD"}}  # fmt: skip
    w = AuditWriter(tmp_path)
    w.write(hook(event_id="e1", hook_id="autotrade_x", kind="autotrade",
                 decision="TRADE_INTENT", output=out))  # fmt: skip
    w.write(risk(event_id="e1", hook_id="autotrade_x", client_order_id="mw-1", intent=out))
    w.write(risk(hook_id="submit_trading_signal", client_order_id="mw-2", intent=out))
    w.write(order(client_order_id="mw-2", status="OPEN"))  # placed
    w.write(order(client_order_id="mw-2"))  # filled
    w.write(risk(hook_id="submit_trading_signal", client_order_id="mw-3", intent=out))
    w.write(risk(approved=False, client_order_id="mw-3", intent=out))  # settled later
    w.write(risk(approved=False, client_order_id="mw-4", intent=out))  # a refusal
    w.write(order(client_order_id="mw-6"))  # recovered at a start, then its approval
    w.write(risk(hook_id="autotrade_x", client_order_id="mw-6", intent=out))
    w.write(risk(agent_id="beta", hook_id="t", trace_id="t9", client_order_id="mw-5",
                 intent=out))  # fmt: skip
    w.close()
    recent = recent_evaluations(tmp_path)
    assert recent.cut == {}
    got = {a: [(u.client_order_id, u.hook_id, u.trace_id) for u in us]
           for a, us in recent.unplaced.items()}  # fmt: skip
    assert got == {"alpha": [("mw-1", "autotrade_x", "t1")], "beta": [("mw-5", "t", "t9")]}
    first = recent.unplaced["alpha"][0]
    assert first.intent == out and first.event_id == "e1"
    assert first.cut == CutIntent("e1", "market.candle.closed", "autotrade_x", "t1", out)
    assert recent.unplaced["beta"][0].cut is None
    assert recent.orders["mw-2"] == AuditedOrder("FILLED", "entry")  # its newest row


def test_an_event_whose_rows_a_kill_tore_is_not_counted_as_evaluated(tmp_path: Path) -> None:
    """A kill inside the write-ahead leaves an event's first rows whole and the next
    one torn: its decisions never acted, so it is evaluated again (not in
    ``evaluated``, its rows not in lastOutputs, its intent not cut short). Rows
    written after the torn line, or a torn row of another kind, change nothing."""
    from daemon.audit.reader import recent_evaluations
    from daemon.audit.records import encode_line
    from tests.audit.factory import risk

    trade = {"decision": "TRADE_INTENT", "reason": "buy", "intent": {
        "action": "CLOSE_POSITION", "symbol": "ETH-USD"}}  # fmt: skip
    w = AuditWriter(tmp_path)
    w.write(hook(event_id="e1", trace_id="t1", reason="one"))
    w.write(hook(event_id="e2", trace_id="t2", reason="two", hook_id="h1"))
    w.write(hook(event_id="e2", trace_id="t2", hook_id="h2", kind="autotrade",
                 decision="TRADE_INTENT", output=trade))  # fmt: skip
    w.write(hook(agent_id="beta", event_id="e2", trace_id="t2", reason="beta's"))
    w.close()
    (path,) = tmp_path.glob("audit-*.jsonl")
    whole = encode_line(wake(event_id="e2", trace_id="t2"))
    with path.open("ab") as f:
        f.write(whole[: whole.index(b"daemonRun") + 4] + b"\n")  # torn, then repaired
    recent = recent_evaluations(tmp_path)
    assert recent.evaluated == {"alpha": ["e1"], "beta": ["e2"]}
    assert recent.outputs["alpha"]["wake_two_green"]["reason"] == "one"
    assert recent.cut == {}

    w = AuditWriter(tmp_path)  # the restart evaluates e2 again, whole this time
    w.write(hook(event_id="e2", trace_id="t2", reason="two again", hook_id="h1"))
    w.write(hook(event_id="e2", trace_id="t2", hook_id="h2", kind="autotrade",
                 decision="TRADE_INTENT", output=trade))  # fmt: skip
    w.write(risk(event_id="e2", hook_id="h2", trace_id="t2"))
    w.close()
    with path.open("ab") as f:
        f.write(encode_line(risk(event_id="e3", trace_id="t2"))[:60] + b"\n")
    with path.open("ab") as f:  # bytes that are no UTF-8 where the names go
        f.write(b'{"type":"hook","ts":"x","agentId":"\xff\xfe","traceId":"\xc3"\n')
    recent = recent_evaluations(tmp_path)
    assert recent.evaluated == {"alpha": ["e1", "e2"], "beta": ["e2"]}
    assert recent.outputs["alpha"]["h1"]["reason"] == "two again" and recent.cut == {}


def test_recent_rows_survive_a_tear_at_every_byte(tmp_path: Path) -> None:
    """Whatever byte a kill tears an event's write at (between two rows too, which
    leaves no torn line; and whatever a restart appends after it), reading the
    recent rows back never raises, the event is not counted as evaluated (its
    rows say how many hook rows it has: fewer are there), and the event before
    it still is. Rows in the order the dispatcher queues them: a WAKE's wake row
    before its hook row."""
    from daemon.audit.reader import recent_evaluations
    from daemon.audit.records import encode_line
    from tests.audit.factory import risk

    trade = {"decision": "TRADE_INTENT", "reason": "é", "intent": {
        "action": "CLOSE_POSITION", "symbol": "ETH-USD"}}  # fmt: skip
    rows: list[AuditRecord] = [
        hook(event_id="e1", trace_id="t1", event_hooks=1),
        hook(event_id="e2", trace_id="t2", hook_id="h1", reason="ü" * 20, event_hooks=3),
        wake(trace_id="t2"),
        hook(event_id="e2", trace_id="t2", hook_id="h2", decision="WAKE", event_hooks=3),
        hook(
            event_id="e2",
            trace_id="t2",
            hook_id="h3",
            kind="autotrade",
            output=trade,
            decision="TRADE_INTENT",
            event_hooks=3,
        ),
        risk(event_id="e2", hook_id="h3", trace_id="t2", client_order_id="mw-1", intent=trade),
        order(client_order_id="mw-1"),
        hook(event_id="e3", trace_id="t3", event_hooks=1),
    ]
    lines = [encode_line(r) for r in rows]
    whole = b"".join(lines)
    starts = [whole.index(line) for line in lines]
    for cut in range(len(whole)):
        d = tmp_path / str(cut)
        d.mkdir()
        (d / "audit-2026-02-17.jsonl").write_bytes(whole[:cut] + b"\n" + b"\xff{" * (cut % 3))
        evaluated = recent_evaluations(d).evaluated.get("alpha", [])
        if cut >= starts[1]:
            assert evaluated[0] == "e1", cut
        if starts[1] <= cut < starts[4] + len(lines[4]) - 1:  # e2's write, cut short
            assert evaluated == ["e1"], (cut, whole[:cut][-60:])
        elif cut >= starts[5]:
            assert evaluated[:2] == ["e1", "e2"], cut


def test_odd_hook_row_counts_never_fail_the_read(tmp_path: Path) -> None:
    """``eventHooks`` comes from a file a disk or an operator can damage: a count that
    is not an integer is no count (the event's rows are whole); a huge or negative
    one costs that event an evaluation again, at most, and never the start."""
    from daemon.audit.reader import recent_evaluations
    from daemon.audit.records import encode_line

    lines = [encode_line(hook(event_id=f"e{n}", trace_id=f"t{n}")) for n in range(5)]
    odd = [b'"3"', b"true", b"1.5", b"-4", b"1" + b"0" * 40]
    with (tmp_path / "audit-2026-02-17.jsonl").open("wb") as f:
        for line, count in zip(lines, odd, strict=True):
            f.write(line.replace(b'"eventHooks":null', b'"eventHooks":' + count))
    # e4 claims more rows than any event has: evaluated again, nothing worse
    assert recent_evaluations(tmp_path).evaluated["alpha"] == ["e0", "e1", "e2", "e3"]


def test_market_time_window_selects_by_event_ts(tmp_path: Path) -> None:
    """--from/--to select rows by the market time they are about (``eventTs``), which a
    backtest writes seconds after one another for a whole year; rows without one are
    left out of a window, and every row type shows its market time when rendered."""
    from daemon.audit.render import render
    from tests.audit.factory import risk, run

    def at(hhmm: str) -> str:
        return f"2025-03-01T{hhmm}:00.000Z"

    w = AuditWriter(tmp_path)
    w.write(hook(event_ts=at("11:55"), reason="before"))
    w.write(hook(event_ts=at("12:00"), decision="WAKE", reason="first in"))
    w.write(wake(event_ts=at("12:00")))
    w.write(run(event_ts=at("12:00")))
    w.write(risk(event_ts=at("12:05")))
    w.write(order(event_ts=at("12:05")))
    w.write(wake())  # no market time: in no window
    w.write(hook(event_ts=at("12:10"), reason="at the end: out"))
    w.close()
    window = AuditFilter(from_ms=parse_iso_ms(at("12:00")), to_ms=parse_iso_ms(at("12:10")))
    got = list(iter_records(tmp_path, window))
    assert [r["type"] for r in got] == ["hook", "wake", "run", "risk", "order"]
    assert got[0]["reason"] == "first in"
    assert len(list(iter_records(tmp_path, AuditFilter(from_ms=parse_iso_ms(at("12:05")))))) == 3
    assert [
        r["reason"] for r in tail(tmp_path, AuditFilter(to_ms=parse_iso_ms(at("12:00"))), 5)
    ] == ["before"]
    for rec in got:
        assert "event 2025-03-01 12:0" in render(rec).plain, rec


def test_a_compressed_part_that_breaks_off_reads_up_to_the_break(tmp_path: Path) -> None:
    """A damaged .gz (cut short) is read up to where it breaks, with a warning: `audit
    tail` and `why` go on with the other parts (an EOFError there was click's
    "aborted", exit 130)."""
    import gzip

    import structlog.testing
    from click.testing import CliRunner

    from daemon.audit.records import encode_line
    from daemon.cli.audit import audit_group

    rows = b"".join(
        encode_line(hook(reason=f"old{i:03d}", ts=ts("2026-02-16"))) for i in range(300)
    )
    whole = gzip.compress(rows)
    (tmp_path / "audit-2026-02-16.jsonl.gz").write_bytes(whole[: len(whole) * 2 // 3])
    w = AuditWriter(tmp_path)
    w.write(hook(reason="new"))
    w.close()
    with structlog.testing.capture_logs() as logs:
        got = [r["reason"] for r in tail(tmp_path, None, 1000)]
    assert got[-1] == "new" and got[0] == "old000" and 1 < len(got) < 301
    assert any(e["event"].startswith("audit part damaged") for e in logs)
    shown = CliRunner().invoke(audit_group, ["tail", "-n", "3", "--dir", str(tmp_path)])
    assert shown.exit_code == 0 and "new" in shown.output, shown.output


def _damaged_part(path: Path) -> None:
    """A compressed part of 20,000 rows whose deflate data is damaged so that zlib,
    not gzip, raises ("invalid code lengths set")."""
    import gzip

    rows = b"".join(
        b'{"type":"hook","ts":"2026-02-16T00:00:00.000Z","agentId":"a","hookId":"h",'
        b'"eventId":"e%d","traceId":"t%d","decision":"IGNORE"}\n' % (i, i)
        for i in range(20_000)
    )
    data = bytearray(gzip.compress(rows, mtime=0))
    for i in range(len(data) // 2, len(data) // 2 + 64):
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))


def test_a_start_skips_a_damaged_compressed_part(tmp_path: Path) -> None:
    """The daemon's start reads the newest audit rows (``recent_evaluations``). A
    compressed part whose deflate data is damaged raised zlib's error there, and the
    daemon exited at every start (systemd restarting it in a loop). Now the part is
    skipped with a warning (what it decodes to before the break may be wrong), the
    rows of the others are read, and the start goes on."""
    import structlog.testing

    from daemon.audit.reader import recent_evaluations

    _damaged_part(tmp_path / "audit-2026-02-16.jsonl.gz")
    w = AuditWriter(tmp_path)
    w.write(hook(agent_id="a", event_id="newest", ts=ts("2026-02-17")))
    w.close()
    with structlog.testing.capture_logs() as logs:
        recent = recent_evaluations(tmp_path)
    assert recent.evaluated["a"] == ["newest"]
    assert any(e["event"] == "audit part unreadable: skipped" for e in logs)


def test_a_start_holds_only_the_newest_bytes_of_a_compressed_part(tmp_path: Path) -> None:
    """A closed part is up to 64 MB of rows; the start wants its last 8 MB. It is
    decompressed as a stream keeping only the tail (the whole part was held)."""
    import gzip
    import tracemalloc

    from daemon.audit.reader import recent_evaluations

    ids = [f"e{i}" for i in range(40_000)]
    rows = b"".join(encode_line(hook(agent_id="a", event_id=e, trace_id=e)) for e in ids)
    (tmp_path / "audit-2026-02-16.jsonl.gz").write_bytes(gzip.compress(rows, mtime=0))
    tracemalloc.start()
    try:
        seen = recent_evaluations(tmp_path, max_bytes=256 * 1024).evaluated["a"]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert seen == ids[-len(seen) :] and 0 < len(seen) < len(ids)
    assert len(rows) > 10 * 1024 * 1024 and peak < 4 * 1024 * 1024, (len(rows), peak)


def test_a_follower_passes_over_a_damaged_compressed_part(tmp_path: Path) -> None:
    """`audit tail -f` reads a part compressed while it follows once, whole: zlib's
    error on a damaged one ended the command; it goes on with the other parts."""
    w = AuditWriter(tmp_path)
    w.write(hook(reason="before"))
    w.close()
    follower = Follower(tmp_path, AuditFilter())
    _damaged_part(tmp_path / "audit-2026-02-15.jsonl.gz")
    w = AuditWriter(tmp_path)
    w.write(hook(reason="after"))
    w.close()
    assert [r["reason"] for r in follower.poll()] == ["after"]


def test_a_wake_dropped_when_its_run_came_due_says_so() -> None:
    """A queued wake later dropped (the agent paused before its run started) reads
    differently from one suppressed as it was decided."""
    from daemon.audit.render import render

    decided = json.loads(encode_line(wake(outcome="suppressed", suppressed_by="paused")))
    dropped = json.loads(encode_line(wake(outcome="suppressed", suppressed_by="paused", dropped=1)))
    assert "wake suppressed by paused" in render(decided).plain
    assert "dropped" not in render(decided).plain
    assert (
        "wake suppressed by paused (queued, then dropped before its run)" in render(dropped).plain
    )
