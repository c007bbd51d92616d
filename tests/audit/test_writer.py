"""AuditWriter: exact fields, batching, rotation, disk bounds, flush on close."""

from __future__ import annotations

import gzip
import json
import os
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
import structlog.testing

from daemon.agents.checkpoints import Checkpoints
from daemon.agents.store import HookStore
from daemon.audit.files import AuditFile, list_files, open_lines
from daemon.audit.records import encode_line
from daemon.audit.writer import AuditWriter, open_audit
from daemon.errors import StoreError
from daemon.trading.broker import OrderRequest
from daemon.trading.intents import RiskLimits, parse_intent
from daemon.trading.paper import PaperBroker
from daemon.trading.portfolio import PortfolioView
from daemon.trading.records import order_record, risk_record
from daemon.trading.risk import RiskEngine
from tests.audit.factory import hook, ts

DESIGN_FIELDS = {
    "ts", "agentId", "hookId", "revision", "kind", "eventId", "topic", "symbol", "decision",
    "reason", "dedupeKey", "suppressedBy", "runtimeMs", "error", "traceId",
}  # fmt: skip


def lines(directory: Path) -> list[dict[str, Any]]:
    out = []
    for f in list_files(directory):
        with open_lines(f.path) as fh:
            out += [json.loads(line) for line in fh.read().splitlines()]
    return out


def slow_first_append(w: AuditWriter, monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Make the writer's first append take 0.3 s (a slow disk); the event is set as
    it starts, so a test can act while a batch is out in the flusher's thread."""
    writing = threading.Event()
    real = w._append

    def slow(day: str, data: bytes) -> None:
        if not writing.is_set():
            writing.set()
            time.sleep(0.3)
        real(day, data)

    monkeypatch.setattr(w, "_append", slow)
    return writing


def test_hook_record_has_exactly_the_design_fields(tmp_path: Path) -> None:
    """A hook line carries design.md's fields plus type, the daemon run id, the
    event's own time, the whole decision (``output``) and the event's number of
    hook rows, nulls included; the writer stamps its run id on every record."""
    w = AuditWriter(tmp_path, run_id="20261124T000000Z-ab12")
    w.write(hook())
    w.close()
    (rec,) = lines(tmp_path)
    assert set(rec) == DESIGN_FIELDS | {"type", "daemonRun", "eventTs", "output", "eventHooks"}
    assert rec["type"] == "hook" and rec["dedupeKey"] is None and rec["suppressedBy"] == "none"
    assert rec["output"] is None
    assert rec["daemonRun"] == "20261124T000000Z-ab12"


async def test_batch_flushes_when_full(tmp_path: Path) -> None:
    """Records wait in memory until flush_every of them are queued."""
    async with open_audit(tmp_path, flush_every=3, flush_interval=3600) as w:
        w.write(hook())
        w.write(hook())
        await anyio.sleep(0.02)
        assert w.written == 0 and w.pending == 2 and lines(tmp_path) == []
        w.write(hook())
        with anyio.fail_after(5):
            await w.next_flush()
        assert len(lines(tmp_path)) == 3


async def test_batch_flushes_on_interval(tmp_path: Path) -> None:
    """A lone record reaches disk within the flush interval."""
    async with open_audit(tmp_path, flush_every=1000, flush_interval=0.02) as w:
        w.write(hook())
        with anyio.fail_after(5):
            await w.next_flush()
    assert len(lines(tmp_path)) == 1


async def test_clean_stop_loses_nothing(tmp_path: Path) -> None:
    """Leaving open_audit writes every queued record; later writes go straight to disk."""
    async with open_audit(tmp_path, flush_every=10_000, flush_interval=3600) as w:
        for i in range(500):
            w.write(hook(reason=f"r{i}"))
    assert [r["reason"] for r in lines(tmp_path)] == [f"r{i}" for i in range(500)]
    w.write(hook(reason="late"))
    assert lines(tmp_path)[-1]["reason"] == "late"


def test_daily_rotation(tmp_path: Path) -> None:
    """Records land in audit-YYYY-MM-DD.jsonl by the day of their ts; the days the
    writer has moved on from are compressed, the current one is not."""
    w = AuditWriter(tmp_path)
    for day in ("2026-02-17", "2026-02-17", "2026-02-18", "2026-02-19"):
        w.write(hook(ts=ts(day)))
    w.close()
    names = [f.path.name for f in list_files(tmp_path)]
    assert names == [
        "audit-2026-02-17.jsonl.gz", "audit-2026-02-18.jsonl.gz", "audit-2026-02-19.jsonl",
    ]  # fmt: skip
    assert len(gzip.decompress((tmp_path / names[0]).read_bytes()).splitlines()) == 2
    # no plain copy, no .tmp; each compressed part with its id index
    indexes = ["audit-2026-02-17.ids", "audit-2026-02-18.ids"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names + indexes)
    assert w.compressed_files == 2


def test_disk_bound_deletes_oldest(tmp_path: Path) -> None:
    """Total size stays under max_total_bytes + max_file_bytes; the newest records survive."""
    w = AuditWriter(
        tmp_path, flush_every=1, max_pending=1, max_total_bytes=4000, max_file_bytes=1000
    )
    for i in range(200):
        w.write(hook(reason=f"r{i:03d}"))
    w.close()
    total = sum(f.path.stat().st_size for f in list_files(tmp_path))
    assert total <= 5000 and w.deleted_files > 0
    reasons = [r["reason"] for r in lines(tmp_path)]
    assert reasons[-1] == "r199" and "r000" not in reasons
    assert reasons == sorted(reasons)  # parts are read back in write order


def test_a_directory_under_an_audit_files_name_does_not_stop_the_bounds(tmp_path: Path) -> None:
    """Directories someone made under a leftover's, an orphan index's and a part's
    index's names: the bounds went on failing (retention stopped, and the daemon
    ended with an audit error). They are left, with a warning once each; the part
    whose index cannot be written is compressed without one (read whole)."""
    from daemon.audit.ids import index_path

    stray = [tmp_path / "audit-2020-01-01.jsonl.gz.tmp", tmp_path / "audit-2020-01-02.ids"]
    first = index_path(tmp_path / "audit-2026-02-17.jsonl")  # the first part to close
    for d in (*stray, first):
        d.mkdir(parents=True)
    with structlog.testing.capture_logs() as logs:
        w = AuditWriter(
            tmp_path, flush_every=1, max_pending=1, max_total_bytes=4000, max_file_bytes=1000
        )
        for i in range(200):
            w.write(hook(reason=f"r{i:03d}", event_id=f"e{i:03d}"))
        w.close()
    assert w.deleted_files > 0 and w.compressed_files > 0
    assert sum(f.path.stat().st_size for f in list_files(tmp_path)) <= 5000
    left = [e for e in logs if e["event"].startswith("a directory in the audit dir")]
    assert sorted(e["path"] for e in left) == sorted(str(d) for d in (*stray, first))
    assert all(d.is_dir() for d in (*stray, first))
    assert any(e["event"] == "audit id index not written" for e in logs)


def test_the_bounds_are_checked_per_file_and_per_sixteenth_not_per_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A directory listing per batch cost a backtest 3% of its time: the bounds are
    checked when a file is opened and after each 1/16 of ``max_file_bytes``."""
    from daemon.audit import writer

    listings = []

    def counted(directory: Path) -> list[AuditFile]:
        listings.append(directory)
        return list_files(directory)

    monkeypatch.setattr(writer, "list_files", counted)
    w = AuditWriter(tmp_path, flush_every=1, max_pending=1, max_file_bytes=1_000_000)
    size = len(encode_line(hook(reason="r000")))
    for i in range(300):
        w.write(hook(reason=f"r{i:03d}"))
    w.close()
    checks = 1 + (300 * size) // (1_000_000 // 16)  # the file opened, then by the bytes
    # (each check lists the directory twice: closed parts to compress, then the sizes)
    assert size * 300 > 1_000_000 // 16 and len(listings) <= 2 * checks + 1 < 300


def test_max_days(tmp_path: Path) -> None:
    """Days older than max_days before the newest day are deleted."""
    w = AuditWriter(tmp_path, max_days=2)
    for d in range(10, 15):
        w.write(hook(ts=ts(f"2026-02-{d}")))
    w.close()
    assert [f.day for f in list_files(tmp_path)] == ["2026-02-13", "2026-02-14"]


def test_backpressure_flushes_inline(tmp_path: Path) -> None:
    """With no flusher running, max_pending records trigger an inline write, not a drop."""
    w = AuditWriter(tmp_path, flush_every=5, max_pending=5)
    for _ in range(5):
        w.write(hook())
    assert w.pending == 0 and w.inline_flushes == 1 and len(lines(tmp_path)) == 5
    w.close()


async def test_trading_records_round_trip(tmp_path: Path) -> None:
    """risk_record and order_record turn a verdict and a broker order into audit lines."""

    async def publish(_: object) -> None:
        return None

    intent = parse_intent(
        {"action": "PLACE_MARKET_ORDER", "symbol": "BTC", "side": "buy", "volume": 1.0}
    )
    verdict = RiskEngine(RiskLimits()).check(intent, PortfolioView(), 100.0, 0)
    broker = PaperBroker(tmp_path / "paper", publish)
    try:
        w = AuditWriter(tmp_path / "audit")
        w.write(risk_record(verdict, intent, agent_id="a", trace_id="t"))
        await broker.on_tick("BTC", 100.0, 1)
        placed = await broker.submit(
            OrderRequest(client_order_id="c1", agent_id="a", intent=intent, trace_id="t")
        )
        w.write(order_record(placed, "paper"))
        w.close()
    finally:
        broker.close()
    risk, order = lines(tmp_path / "audit")
    assert risk["approved"] is False and risk["reasons"][0]["code"] == "STOP_LOSS_REQUIRED"
    assert (order["status"], order["price"], order["traceId"]) == ("FILLED", 100.0, "t")


@asynccontextmanager
async def failed_once(tmp_path: Path) -> AsyncIterator[tuple[AuditWriter, Path]]:
    """A writer whose directory is a file: its first row ("first") has failed once.
    Unlinking the returned path heals the disk."""
    target = tmp_path / "audit"
    target.write_text("not a directory")
    async with open_audit(target, flush_every=1, flush_interval=3600) as w:
        w.write(hook(reason="first"))
        with anyio.fail_after(5):
            await w.next_flush()
        yield w, target


async def test_write_failure_keeps_records_and_retries(tmp_path: Path) -> None:
    """A failing disk is counted and retried; nothing is lost once it recovers."""
    async with failed_once(tmp_path) as (w, target):
        assert w.errors == 1 and w.pending == 1 and "cannot write audit log" in w.last_error
        target.unlink()
        w.write(hook(reason="second"))
        with anyio.fail_after(5):
            await w.next_flush()
    assert [r["reason"] for r in lines(target)] == ["first", "second"]
    assert w.dropped == 0


async def test_a_flush_that_works_ends_the_failing_streak(tmp_path: Path) -> None:
    """The checkpoints' flush drained the queue once the disk healed, while the flusher
    was backing off: the flusher then found nothing to write, so the writer stayed
    "failing" (no "recovered" line, and write_ahead skipped: actions went out before
    their rows reached the OS) until more rows came and its next retry. A flush that
    works ends the streak, and write_ahead hands rows to the OS again."""
    with structlog.testing.capture_logs() as logs:
        async with failed_once(tmp_path) as (w, target):
            w.retry_first = w.retry_most = 3600.0  # the flusher would not retry in this test
            target.unlink()
            await w.flush()
            assert any(e["event"] == "audit writes recovered" for e in logs)
            w.write(hook(reason="second"))
            w.write_ahead()
            assert w.pending == 0 and w.write_aheads == 1
    assert [r["reason"] for r in lines(target)] == ["first", "second"]


async def test_a_failing_disk_is_logged_once_backed_off_and_bounded(tmp_path: Path) -> None:
    """Disk full for a while: one warning when it starts (not one per batch, which
    were 1,961 lines in 10 s), no write attempt between retries (the producer is not
    blocked: it was an inline write per record; memory stays at max_pending, the
    oldest dropped), and one line when
    the writes work again, with nothing lost but what was dropped."""
    target = tmp_path / "audit"
    target.write_text("not a directory")
    with structlog.testing.capture_logs() as logs:
        async with open_audit(target, flush_every=2, flush_interval=0.01, max_pending=10) as w:
            w.retry_first, w.retry_most = 0.2, 0.2
            try:
                began = time.monotonic()
                for i in range(200):
                    w.write(hook(reason=f"r{i}"))
                    await anyio.sleep(0.002)
                took = time.monotonic() - began
                # one attempt per 0.2 s, by the flusher or (once it is due) a write()
                assert w.errors <= 2 * (took / 0.2 + 1)
                assert w.pending <= 10 and w.dropped >= 190
            finally:
                target.unlink()
            with anyio.fail_after(5):
                while w.pending:  # noqa: ASYNC110 - the flusher's retry empties it
                    await anyio.sleep(0.05)
    said = [(e["log_level"], e["event"]) for e in logs]
    assert said == [
        ("warning", "audit writes failing; rows are kept in memory and retried"),
        ("info", "audit writes recovered"),
    ]
    kept = [r["reason"] for r in lines(target)]
    assert kept == [f"r{i}" for i in range(200 - len(kept), 200)]
    assert len(kept) + w.dropped == 200


async def test_flush_returns_after_the_batch_the_flusher_is_writing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkpoints' stop flushes, then saves the marks of what is durable: a flush
    that returned while the flusher's own batch was still being written left those
    marks unsaved (a restart test failed under load)."""
    w = AuditWriter(tmp_path, flush_every=1, flush_interval=3600)
    writing = slow_first_append(w, monkeypatch)
    async with anyio.create_task_group() as tg:
        await tg.start(w.run)
        w.write(hook())  # the flusher takes it at once (flush_every=1)
        assert await anyio.to_thread.run_sync(writing.wait, 5)
        assert (w.pending, w.written) == (0, 0)  # in flight
        await w.flush()
        assert w.durable == 1
        tg.cancel_scope.cancel()
    w.close()


def test_a_follower_reads_the_rest_of_a_part_from_its_gz(tmp_path: Path) -> None:
    """The writer compresses a day once it moved on; what the follower had not read yet
    of that day comes from the .gz, nothing twice, in order."""
    from daemon.audit.reader import Follower

    w = AuditWriter(tmp_path, flush_every=1)
    w.write(hook(reason="a"))
    w.flush_sync()
    f = Follower(tmp_path)
    w.write(hook(reason="b"))
    w.flush_sync()
    assert [r["reason"] for r in f.poll()] == ["b"]
    w.write(hook(reason="c"))
    w.write(hook(ts=ts("2026-02-18"), reason="next day"))  # day 1 is compressed now
    w.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "audit-2026-02-17.ids", "audit-2026-02-17.jsonl.gz", "audit-2026-02-18.jsonl",
    ]  # fmt: skip
    assert [r["reason"] for r in f.poll()] == ["c", "next day"]
    assert f.poll() == []


def test_crash_leftovers_and_a_restart_on_a_compressed_day(tmp_path: Path) -> None:
    """Both forms of a part (a compression cut short after its rename): the .gz is
    read, the plain copy removed; a half-written .tmp is removed. A restart whose
    day's last part is compressed appends to a new part, never beside the .gz."""
    w = AuditWriter(tmp_path)
    w.write(hook(ts=ts("2026-02-17"), reason="one"))
    w.write(hook(ts=ts("2026-02-18"), reason="two"))
    w.close()
    gz = tmp_path / "audit-2026-02-17.jsonl.gz"
    plain = tmp_path / "audit-2026-02-17.jsonl"
    plain.write_bytes(gzip.decompress(gz.read_bytes()))
    (tmp_path / "audit-2026-02-17.jsonl.gz.tmp").write_bytes(b"\x1f\x8b torn")
    assert [f.path.name for f in list_files(tmp_path)] == [gz.name, "audit-2026-02-18.jsonl"]
    assert [r["reason"] for r in lines(tmp_path)] == ["one", "two"]
    again = AuditWriter(tmp_path)
    again.write(hook(ts=ts("2026-02-17"), reason="late"))  # back to a compressed day
    again.write(hook(ts=ts("2026-02-18"), reason="three"))
    again.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [
        "audit-2026-02-17.1.ids", "audit-2026-02-17.1.jsonl.gz", "audit-2026-02-17.ids",
        "audit-2026-02-17.jsonl.gz", "audit-2026-02-18.jsonl",
    ]  # fmt: skip
    assert [r["reason"] for r in lines(tmp_path)] == ["one", "late", "two", "three"]


def test_each_row_goes_to_its_days_file_and_a_bad_time_to_todays(tmp_path: Path) -> None:
    """The writer checks a row's day only when it changes: rows of two days
    interleaved, and a ts that is not a time (the same 10 characters twice), each land
    where they belong."""
    from daemon.audit.records import now_ts

    w = AuditWriter(tmp_path, max_days=10_000)  # (today's file must not retire February's)
    for reason, when in [("a", ts("2026-02-17")), ("b", ts("2026-02-18")), ("c", "soon-ish, maybe"),
                         ("d", "soon-ish, maybe"), ("e", ts("2026-02-17"))]:  # fmt: skip
        w.write(hook(ts=when, reason=reason))
    w.close()
    by_day: dict[str, list[object]] = {}
    for f in list_files(tmp_path):
        with open_lines(f.path) as fh:
            by_day.setdefault(f.day, []).extend(json.loads(x)["reason"] for x in fh)
    assert by_day == {"2026-02-17": ["a", "e"], "2026-02-18": ["b"], now_ts()[:10]: ["c", "d"]}


async def test_a_stop_on_a_failing_disk_says_how_many_rows_are_lost(tmp_path: Path) -> None:
    target = tmp_path / "audit"
    target.write_text("not a directory")
    w = AuditWriter(target, flush_every=100)
    for i in range(3):
        w.write(hook(reason=f"r{i}"))
    with pytest.raises(StoreError, match="3 audit rows were not written"):
        await w.aclose()
    assert w.dropped == 3 and w.durable == 3  # settled: the checkpoints do not wait on them


async def test_the_checkpoints_stop_goes_on_when_the_audit_cannot_flush(tmp_path: Path) -> None:
    """At a stop on a full disk the checkpoints log and save what is durable (nothing
    here); the rows stay held for the audit writer's own stop, which reports them."""
    target = tmp_path / "audit"
    target.write_text("not a directory")
    w = AuditWriter(target, flush_every=100)
    store = HookStore(tmp_path / "hooks.sqlite3")
    try:
        w.write(hook())
        with structlog.testing.capture_logs() as logs:
            await Checkpoints(store, w).close()
        assert [e["event"] for e in logs] == ["audit rows not written; their marks are not saved"]
        assert w.pending == 1
        with pytest.raises(StoreError, match="1 audit rows were not written"):
            await w.aclose()
    finally:
        store.close()


async def test_write_ahead_hands_the_rows_to_the_os_in_this_thread(tmp_path: Path) -> None:
    """Before an action the rows queued so far are in the file, at once: no flush
    interval, no batch size, no await (the dispatcher's write-ahead)."""
    async with open_audit(tmp_path, flush_every=1000, flush_interval=3600) as w:
        w.write(hook(reason="first"))
        w.write(hook(reason="second"))
        w.write_ahead()  # the first rows of a run: it opens the day's file
        assert [r["reason"] for r in lines(tmp_path)] == ["first", "second"]
        assert (w.durable, w.pending, w.write_aheads) == (2, 0, 2)
        for _ in range(500):  # opening a file made the bounds' check due: the
            if not w._bounds_due():  # flusher's, in its thread, with no rows to write
                break
            await anyio.sleep(0.01)
        assert not w._bounds_due()
        w.write(hook(reason="third"))
        w.write_ahead()
        assert [r["reason"] for r in lines(tmp_path)][-1] == "third"
        assert w.write_aheads == 3 and w.durable == 3
    no_flusher = AuditWriter(tmp_path / "plain")  # (a flusher is not needed)
    no_flusher.write(hook())
    no_flusher.write_ahead()
    assert no_flusher.durable == 1 and len(lines(tmp_path / "plain")) == 1
    no_flusher.close()


async def test_write_ahead_waits_for_the_batch_in_flight_and_keeps_the_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows the flusher's thread is writing go first: newer rows never overtake them."""
    w = AuditWriter(tmp_path, flush_every=1, flush_interval=3600)
    writing = slow_first_append(w, monkeypatch)
    async with anyio.create_task_group() as tg:
        await tg.start(w.run)
        w.write(hook(reason="a"))  # the flusher takes it at once (flush_every=1)
        assert await anyio.to_thread.run_sync(writing.wait, 5)
        w.write(hook(reason="b"))
        w.write_ahead()
        assert w.durable == 2 and w.write_aheads == 1
        assert [r["reason"] for r in lines(tmp_path)] == ["a", "b"]
        tg.cancel_scope.cancel()
    w.close()


async def test_write_ahead_does_not_try_a_failing_disk(tmp_path: Path) -> None:
    """While writes fail the action goes ahead at once; the rows stay queued for the
    flusher's retry, and nothing is lost once the disk is back."""
    async with failed_once(tmp_path) as (w, target):
        w.write(hook(reason="second"))
        w.write_ahead()
        assert w.pending == 2 and w.durable == 0 and w.errors == 1
        target.unlink()
    assert [r["reason"] for r in lines(target)] == ["first", "second"]


async def test_write_ahead_rolls_over_and_keeps_the_disk_bound(tmp_path: Path) -> None:
    """Rows handed over one action at a time still roll over at ``max_file_bytes``
    and stay within the total bound, in order."""
    async with open_audit(
        tmp_path, flush_every=1000, flush_interval=3600, max_total_bytes=4000, max_file_bytes=1000
    ) as w:
        for i in range(200):
            w.write(hook(reason=f"r{i:03d}"))
            w.write_ahead()
            await anyio.sleep(0.001)  # (the flusher checks the bounds meanwhile)
        assert w.durable == 200 and w.write_aheads == 200
    total = sum(f.path.stat().st_size for f in list_files(tmp_path))
    assert total <= 5000 and w.deleted_files > 0
    reasons = [r["reason"] for r in lines(tmp_path)]
    assert reasons[-1] == "r199" and reasons == sorted(reasons)


@pytest.mark.parametrize("step", ["compress", "fsync"])
async def test_write_ahead_does_not_wait_for_what_follows_a_rollover(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    """The part a rollover closed is fsynced, then compressed (a 64 MiB part takes a
    while; an fsync on a busy disk took up to 179 ms in a soak, and was done holding
    the lock write_ahead takes, so an action and the whole event loop waited for it).
    The rows of an action go to the new part meanwhile, the action does not wait."""
    from daemon.audit import files

    started = threading.Event()

    def slow(real: Any) -> Any:
        def step_slowly(*args: Any, **kw: Any) -> Any:
            if not started.is_set():
                started.set()
                time.sleep(1.0)
            return real(*args, **kw)

        return step_slowly

    if step == "compress":
        monkeypatch.setattr("daemon.audit.writer.compress", slow(files.compress))
    else:
        monkeypatch.setattr(os, "fsync", slow(os.fsync))
    async with open_audit(tmp_path, flush_every=1, flush_interval=3600, max_file_bytes=600) as w:
        w.write(hook(reason="r0"))
        w.write(hook(reason="r1"))  # the two fill the first part; the next rolls over
        with anyio.fail_after(5):
            await w.next_flush()
        w.write(hook(reason="r2"))
        assert await anyio.to_thread.run_sync(started.wait, 5)
        w.write(hook(reason="r3"))
        start = time.monotonic()
        w.write_ahead()
        assert time.monotonic() - start < 0.5 and w.write_aheads == 1
    assert [r["reason"] for r in lines(tmp_path)] == ["r0", "r1", "r2", "r3"]
    assert w.compressed_files >= 1


@pytest.mark.parametrize("seed", range(4))
async def test_rows_stay_in_order_whoever_writes_them(tmp_path: Path, seed: int) -> None:
    """Every writer at once: the flusher's thread (small batches, a slow disk now and
    then), write-aheads in the loop's thread, flushes from another task, rollovers
    and compressions of small parts: every row is written once, in order."""
    import random

    from daemon.audit import files

    rng = random.Random(seed)
    real_append, real_compress = AuditWriter._append, files.compress

    def append(self: AuditWriter, day: str, data: bytes) -> None:
        if rng.random() < 0.05:
            time.sleep(0.005)  # a slow disk: the next writer must wait its turn
        real_append(self, day, data)

    def compress(path: Path, index: bool) -> None:
        time.sleep(0.01)
        real_compress(path, index=index)

    n = 600
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(AuditWriter, "_append", append)
        mp.setattr("daemon.audit.writer.compress", compress)
        async with open_audit(
            tmp_path,
            flush_every=7,
            flush_interval=0.005,
            max_file_bytes=4000,
            max_total_bytes=10**9,
        ) as w:

            async def flusher() -> None:
                for _ in range(30):
                    await w.flush()
                    await anyio.sleep(rng.random() / 100)

            async with anyio.create_task_group() as tg:
                tg.start_soon(flusher)
                for i in range(n):
                    w.write(hook(reason=f"r{i:04d}"))
                    if rng.random() < 0.3:
                        w.write_ahead()
                    if rng.random() < 0.3:
                        await anyio.lowlevel.checkpoint()
    reasons = [r["reason"] for r in lines(tmp_path)]
    assert reasons == [f"r{i:04d}" for i in range(n)]
    assert w.durable == n and w.write_aheads > 0 and len(list_files(tmp_path)) > 3
