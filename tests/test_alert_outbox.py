"""The alert outbox: an alert the webhook has not taken (an outage past its retries,
a full queue, a stop) is kept on disk and posted again, marked redelivered, once the
endpoint is back or at the next start; too old ones are dropped, counted."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
import structlog
from aiohttp import web

from daemon.alert_outbox import AlertOutbox
from daemon.alerts import Alert, AlertQueue, WebhookNotifier
from daemon.audit.records import AlertRecord, AuditRecord
from daemon.errors import StoreError
from tests.test_alerts import ALERT, listen


def alert(i: int) -> Alert:
    return msgspec.structs.replace(ALERT, event_id=f"e{i}")


async def script(statuses: list[int]) -> tuple[web.AppRunner, str, list[dict[str, Any]]]:
    """A loopback webhook answering each request with the next of ``statuses`` (the
    last once they run out); returns every body it was sent, with the status given."""
    got: list[dict[str, Any]] = []

    async def handler(request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        status = statuses[min(len(got), len(statuses) - 1)]
        got.append(body | {"status": status})
        return web.Response(status=status)

    runner, url = await listen(handler)
    return runner, url, got


def outbox(tmp_path: Path, now: list[float] | None = None, **kw: Any) -> AlertOutbox:
    if now is not None:
        kw["clock"] = lambda: now[0]
    return AlertOutbox(tmp_path / "alerts.sqlite3", keep_seconds=kw.pop("keep_seconds", 3600), **kw)


async def until(done: Any, seconds: float = 5) -> None:
    """Wait until ``done()`` holds (the webhook's side: polled), at most ``seconds``."""
    for _ in range(int(seconds * 100)):
        if done():
            return
        await anyio.sleep(0.01)
    raise TimeoutError


async def run_until(queue: AlertQueue, done: Any) -> None:
    """Run ``queue`` until ``done()`` holds, then close it and let it finish."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(queue.run)
        await until(done)
        queue.close()


def told(rows: list[AuditRecord]) -> list[tuple[str, str, bool, bool, str]]:
    """The audit rows of the alerts: event, status, redelivered, kept, error."""
    alerts = [r for r in rows if isinstance(r, AlertRecord)]
    assert len(alerts) == len(rows), rows
    return [(r.event_id, r.status, r.redelivered, r.kept, r.error) for r in alerts]


def delivered(got: list[dict[str, Any]]) -> list[tuple[str, bool]]:
    return [(g["eventId"], g["redelivered"]) for g in got if g["status"] < 300]


async def test_an_alert_an_outage_failed_is_posted_again_once_the_endpoint_is_back(
    tmp_path: Path,
) -> None:
    """e0 fails its two attempts (the endpoint is down); e1 goes through, and with it
    the endpoint is known to be back: e0 is posted again, marked redelivered."""
    runner, url, got = await script([503, 503, 204])
    box = outbox(tmp_path)
    rows: list[AuditRecord] = []
    queue = AlertQueue(
        WebhookNotifier(url, retries=1, retry_initial_seconds=0.01),
        posts=1,
        outbox=box,
        sink=rows.append,
    )
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(queue.run)
            await queue.send(alert(0))
            await until(lambda: len(got) == 2 and not queue._queued)  # e0 failed, done with
            assert box.count() == 1 and queue.statistics().down
            await queue.send(alert(1))
            await until(lambda: len(got) == 4)
            queue.close()
    finally:
        await runner.cleanup()
    assert delivered(got) == [("e1", False), ("e0", True)]
    st = queue.statistics()
    assert (st.posted, st.reposted, st.kept, st.expired, st.down) == (2, 1, 0, 0, False)
    assert told(rows) == [
        ("e0", "failed", False, True, "HTTP 503"),
        ("e1", "posted", False, False, ""),
        ("e0", "posted", True, False, ""),
    ]
    box.close()


async def test_alerts_kept_at_a_stop_are_posted_at_the_next_start_unless_too_old(
    tmp_path: Path,
) -> None:
    """A stop while the endpoint is down keeps the alerts it could not post; the next
    start posts the ones raised within keep_seconds, oldest first, and drops (counts,
    logs) the older one."""
    down, url_down, _ = await script([503])
    now = [1000.0]
    box = outbox(tmp_path, now, keep_seconds=60)
    rows: list[AuditRecord] = []
    queue = AlertQueue(
        WebhookNotifier(url_down, retry_initial_seconds=5), outbox=box, sink=rows.append
    )
    try:
        await queue.send(alert(0))
        now[0] += 50
        for i in (1, 2):
            await queue.send(alert(i))
        queue.close()  # a stop: one attempt each
        with anyio.fail_after(4):
            await queue.run()
    finally:
        await down.cleanup()
    assert box.count() == 3
    box.close()

    now[0] += 30  # the restart: e0 was raised 80 s ago, e1 and e2 30 s ago
    up, url, got = await script([204])
    box = outbox(tmp_path, now, keep_seconds=60)
    queue = AlertQueue(WebhookNotifier(url), posts=1, outbox=box, sink=rows.append)
    try:
        with structlog.testing.capture_logs() as logs:
            await run_until(queue, lambda: len(got) == 2)
    finally:
        await up.cleanup()
    assert delivered(got) == [("e1", True), ("e2", True)]
    (line,) = [e for e in logs if e["event"].startswith("kept alerts dropped")]
    assert line["alerts"] == 1 and "60 s" in line["why"]
    st = queue.statistics()
    assert (st.kept, st.reposted, st.expired) == (0, 2, 1)
    assert sorted(told(rows)) == [
        ("e0", "expired", False, False, "kept over alert_webhook_keep_seconds (60)"),
        ("e0", "failed", False, True, "HTTP 503"),
        ("e1", "failed", False, True, "HTTP 503"),
        ("e1", "posted", True, False, ""),
        ("e2", "failed", False, True, "HTTP 503"),
        ("e2", "posted", True, False, ""),
    ]
    box.close()


async def test_alerts_that_find_the_queue_full_are_kept_and_posted_later(
    tmp_path: Path,
) -> None:
    """With an outbox a full queue delays an alert instead of losing it: not counted as
    dropped, posted once the queue has room."""
    runner, url, got = await script([204])
    box = outbox(tmp_path)
    queue = AlertQueue(WebhookNotifier(url), size=2, posts=1, outbox=box)
    queue._behind = False  # nothing kept from before: only the full queue may set it
    try:
        for i in range(5):
            await queue.send(alert(i))
        assert queue.dropped == 0 and box.count() == 5
        await run_until(queue, lambda: len(got) == 5)
    finally:
        await runner.cleanup()
    assert sorted(delivered(got)) == [
        ("e0", False),
        ("e1", False),
        ("e2", True),
        ("e3", True),
        ("e4", True),
    ]
    assert box.count() == 0
    box.close()


async def test_a_refused_alert_is_not_kept_and_an_unreadable_one_is_dropped(
    tmp_path: Path,
) -> None:
    """A 4xx would refuse the alert again: it leaves the outbox. A kept row that does
    not read as an alert (a damaged file) is dropped, logged; the rest go out."""
    runner, url, got = await script([401, 204])
    box = outbox(tmp_path)
    queue = AlertQueue(WebhookNotifier(url, retry_initial_seconds=0.01), posts=1, outbox=box)
    try:
        await queue.send(alert(0))
        await run_until(queue, lambda: len(got) == 1)
        assert box.count() == 0
        for body in (b"not json", b'{"agentId": 1}', msgspec.json.encode(alert(1))):
            box.add(body)
        queue = AlertQueue(WebhookNotifier(url), posts=1, outbox=box)
        with structlog.testing.capture_logs() as logs:
            await run_until(queue, lambda: len(got) == 2)
    finally:
        await runner.cleanup()
    assert delivered(got) == [("e1", True)]
    assert len([e for e in logs if e["event"] == "unreadable kept alert dropped"]) == 2
    assert box.count() == 0
    box.close()


def test_the_outbox_is_bounded_and_a_bad_file_is_a_clear_error(tmp_path: Path) -> None:
    """Past ``max_rows`` the oldest kept alerts go (counted as expired); a file that is
    not a store is an error naming it."""
    box = outbox(tmp_path, max_rows=3)
    rows = [box.add(msgspec.json.encode(alert(i))) for i in range(5)]
    kept, expired = box.due(set(), 10)
    assert [k.row for k in kept] == rows[2:] and box.expired == 2 and expired == []
    assert [k.row for k in box.due({rows[3]}, 10)[0]] == [rows[2], rows[4]]
    assert box.due(set(), 0) == ([], [])
    box.close()
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "alerts.sqlite3").write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match=r"alerts\.sqlite3"):
        AlertOutbox(tmp_path / "bad" / "alerts.sqlite3", keep_seconds=1)


async def test_a_store_that_fails_still_lets_the_alert_out(tmp_path: Path) -> None:
    """The outbox is for restarts: if it cannot write, the alert is still posted now."""
    runner, url, got = await script([204])
    box = outbox(tmp_path)
    box._db.close()  # every statement now fails
    queue = AlertQueue(WebhookNotifier(url), outbox=box)
    try:
        with structlog.testing.capture_logs() as logs:
            await queue.send(alert(0))
            await run_until(queue, lambda: len(got) == 1)
    finally:
        await runner.cleanup()
    assert delivered(got) == [("e0", False)]
    assert any(e["event"] == "alert not kept for redelivery" for e in logs)
    with pytest.raises(sqlite3.ProgrammingError):
        box._db.execute("SELECT 1")
