"""Alerts: logged as raised; a webhook on loopback receives them; failures never raise
and never hold the log, the sender or the other alerts."""

from __future__ import annotations

import json
from typing import Any

import anyio
import msgspec
import pytest
import structlog
from aiohttp import web
from anyio import wait_all_tasks_blocked

from daemon.alerts import Alert, AlertQueue, WebhookNotifier

ALERT = Alert(
    agent_id="a",
    hook_id="wake_crash",
    reason="BTC -12% in 24h",
    event_id="e1",
    trace_id="t1",
    symbol="BTC-USD",
    topic="market.price.tick",
)


async def serve(status: int, hang: str = "") -> tuple[web.AppRunner, str, list[Any]]:
    """A loopback webhook answering ``status``; an alert whose reason is ``hang`` gets
    no answer at all."""
    got: list[Any] = []

    async def handler(request: web.Request) -> web.Response:
        alert = json.loads(await request.read())
        if hang and alert["reason"] == hang:
            await anyio.sleep_forever()
        got.append(alert)
        return web.Response(status=status)

    runner, url = await listen(handler)
    return runner, url, got


async def listen(handler: Any) -> tuple[web.AppRunner, str]:
    """``handler`` at ``POST /hook`` on loopback: the runner (to clean up) and the URL.
    A hanging request is cut at once at the cleanup."""
    app = web.Application()
    app.router.add_post("/hook", handler)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}/hook"


async def test_webhook_posts_camel_case_json() -> None:
    """The webhook gets the alert as camelCase JSON."""
    runner, url, got = await serve(204)
    try:
        async with WebhookNotifier(url) as notifier:
            await notifier.send(ALERT)
    finally:
        await runner.cleanup()
    assert got == [
        {
            "agentId": "a",
            "hookId": "wake_crash",
            "reason": "BTC -12% in 24h",
            "eventId": "e1",
            "traceId": "t1",
            "symbol": "BTC-USD",
            "topic": "market.price.tick",
            "ts": None,
            "redelivered": False,
            # For a chat's incoming webhook (Slack, Mattermost: text; Discord: content).
            "text": "marketwake ALERT a/wake_crash BTC-USD: BTC -12% in 24h",
            "content": "marketwake ALERT a/wake_crash BTC-USD: BTC -12% in 24h",
            "allowed_mentions": {"parse": []},
        }
    ]
    assert notifier.failures == 0


async def test_refused_or_unreachable_webhook_is_counted_and_logged_once_a_minute() -> None:
    """A 500 and a closed port both count as failures; send() returns normally; the
    log says so once a minute, with how many failed since its last line."""
    runner, url, _ = await serve(500)
    with structlog.testing.capture_logs() as logs:
        async with WebhookNotifier(url, timeout_seconds=2, retry_initial_seconds=0.01) as notifier:
            try:
                await notifier.send(ALERT)  # retried, then down: one attempt from here
                await notifier.send(ALERT)
            finally:
                await runner.cleanup()
            await notifier.send(ALERT)  # the server is gone now
            notifier._logged_at = -1e9  # a minute on: the next failure is logged
            await notifier.send(ALERT)
    assert notifier.failures == 4
    lines = [e for e in logs if e["event"] == "alert webhook failed"]
    assert (lines[0]["error"], lines[0]["failures"]) == ("HTTP 500", 1)
    assert len(lines) == 2 and lines[1]["failures"] == 3


async def test_a_hanging_webhook_holds_neither_the_log_nor_the_sender_nor_other_alerts() -> None:
    """Every alert is logged as it is sent (not when the webhook gets it); a request
    that never answers holds one posting task, the others go on; a full backlog drops
    (counted) and the sender never waits; what is left at a cut stop is said."""
    runner, url, got = await serve(204, hang="hang")
    hanging = msgspec.structs.replace(ALERT, reason="hang")
    queue = AlertQueue(WebhookNotifier(url, timeout_seconds=30), size=3, posts=2)
    try:
        with structlog.testing.capture_logs() as logs:
            async with anyio.create_task_group() as tg:
                tg.start_soon(queue.run)
                with anyio.fail_after(1):  # the sender never waits for the webhook
                    for _ in range(2):
                        await queue.send(hanging)  # holds both posting tasks
                    await wait_all_tasks_blocked()
                    for i in range(5):
                        await queue.send(msgspec.structs.replace(ALERT, event_id=f"e{i}"))
                    logged = [e for e in logs if e["event"] == "ALERT"]
                    assert len(logged) == 7  # all of them, none of them posted yet
                await anyio.sleep(0.2)
                assert got == []  # both tasks hang: the rest wait, 3 queued, 2 dropped
                assert queue.dropped == 2
                tg.cancel_scope.cancel()  # a stop past its timeout
        left = [e for e in logs if e["event"].startswith("alerts not posted")]
        assert [e["alerts"] for e in left] == [3]

        # One hanging request among others: the second posting task delivers the rest.
        queue = AlertQueue(WebhookNotifier(url, timeout_seconds=30), posts=2)
        async with anyio.create_task_group() as tg:
            tg.start_soon(queue.run)
            await queue.send(hanging)
            await wait_all_tasks_blocked()
            for i in range(5):
                await queue.send(msgspec.structs.replace(ALERT, event_id=f"e{i}"))
            for _ in range(500):  # the server's side: polled, at most 5 s
                if len(got) == 5:
                    break
                await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
        assert [a["eventId"] for a in got] == [f"e{i}" for i in range(5)]
    finally:
        await runner.cleanup()


async def test_without_a_webhook_alerts_are_logged_and_run_returns() -> None:
    """No URL: log only; nothing is queued, so run() has nothing to wait for."""
    queue = AlertQueue()
    with structlog.testing.capture_logs() as logs, anyio.fail_after(1):
        for _ in range(2000):  # past any queue size: nothing is dropped
            await queue.send(ALERT)
        await queue.run()
    assert len([e for e in logs if e["event"] == "ALERT"]) == 2000
    assert queue.dropped == 0


async def test_close_posts_what_is_queued_then_run_returns() -> None:
    """A clean stop: close() lets run() post the queued alerts, then return."""
    runner, url, got = await serve(204)
    try:
        queue = AlertQueue(WebhookNotifier(url))
        for i in range(3):
            await queue.send(msgspec.structs.replace(ALERT, event_id=f"e{i}"))
        queue.close()
        with anyio.fail_after(5):
            await queue.run()
    finally:
        await runner.cleanup()
    assert sorted(a["eventId"] for a in got) == ["e0", "e1", "e2"]


async def scripted(
    statuses: list[int], retry_after: str = ""
) -> tuple[web.AppRunner, str, list[float]]:
    """A loopback webhook answering each request with the next of ``statuses`` (the last
    one once they run out), ``Retry-After`` set on 429; returns when each came."""
    import time

    came: list[float] = []

    async def handler(request: web.Request) -> web.Response:
        await request.read()
        came.append(time.monotonic())
        status = statuses[min(len(came), len(statuses)) - 1]
        headers = {"Retry-After": retry_after} if status == 429 and retry_after else {}
        return web.Response(status=status, headers=headers)

    runner, url = await listen(handler)
    return runner, url, came


async def test_a_transient_failure_is_retried_until_the_alert_goes_through() -> None:
    """Two 503s then a 204: the alert is delivered on its third attempt, and no
    failure is counted."""
    runner, url, came = await scripted([503, 503, 204])
    try:
        async with WebhookNotifier(url, retry_initial_seconds=0.01) as notifier:
            await notifier.send(ALERT)
    finally:
        await runner.cleanup()
    assert (len(came), notifier.failures, notifier.retried, notifier.down) == (3, 0, 2, False)


async def test_a_refusal_is_not_retried() -> None:
    """A 4xx (a wrong URL, a missing token) would fail again: one attempt, counted."""
    runner, url, came = await scripted([401])
    try:
        async with WebhookNotifier(url, retry_initial_seconds=0.01) as notifier:
            await notifier.send(ALERT)
            await notifier.send(ALERT)
    finally:
        await runner.cleanup()
    assert (len(came), notifier.failures, notifier.retried) == (2, 2, 0)


async def test_an_endpoint_that_stays_down_gets_one_attempt_per_alert_until_it_is_back() -> None:
    """After an alert's retries all fail, later alerts get one attempt each (a dead
    endpoint does not hold the queue); once one goes through, retries come back."""
    statuses = [503] * 5 + [204, 503]
    runner, url, came = await scripted(statuses)
    try:
        async with WebhookNotifier(url, retries=3, retry_initial_seconds=0.01) as notifier:
            await notifier.send(ALERT)  # 4 attempts, all 503
            assert (len(came), notifier.failures, notifier.down) == (4, 1, True)
            await notifier.send(ALERT)  # one attempt: 503
            assert (len(came), notifier.failures) == (5, 2)
            await notifier.send(ALERT)  # one attempt: 204, back up
            assert (len(came), notifier.failures, notifier.down) == (6, 2, False)
            await notifier.send(ALERT)  # 503 from now on: retried again
            assert (len(came), notifier.failures) == (10, 3)
    finally:
        await runner.cleanup()


async def test_retry_after_is_respected_and_bounded() -> None:
    """A 429's ``Retry-After`` (seconds) sets the least wait before the next attempt;
    a date, garbage or a negative counts as none, and a long one is cut to 30 s."""
    from daemon.alerts import RETRY_AFTER_MAX, retry_after

    runner, url, came = await scripted([429, 204], retry_after="0.3")
    try:
        async with WebhookNotifier(url, retry_initial_seconds=0.01) as notifier:
            await notifier.send(ALERT)
    finally:
        await runner.cleanup()
    assert len(came) == 2 and came[1] - came[0] >= 0.29 and notifier.failures == 0
    assert [retry_after(v) for v in ("5", "1e9", "inf", "-3", "nan", "soon", None)] == [
        5.0,
        RETRY_AFTER_MAX,
        RETRY_AFTER_MAX,
        0.0,
        0.0,
        0.0,
        0.0,
    ]
    assert retry_after("Wed, 21 Oct 2026 07:28:00 GMT") == 0.0


async def test_a_stopping_queue_tries_each_alert_once() -> None:
    """Once the queue is closed (the daemon stops, with a deadline), an alert the
    endpoint fails is not retried."""
    runner, url, came = await scripted([503])
    queue = AlertQueue(WebhookNotifier(url, retry_initial_seconds=5))
    try:
        await queue.send(ALERT)
        queue.close()
        with anyio.fail_after(4):
            await queue.run()
    finally:
        await runner.cleanup()
    assert len(came) == 1 and queue.webhook is not None and queue.webhook.failures == 1


async def test_status_counts_the_webhook_and_no_line_shows_its_url() -> None:
    """``statistics`` (for ``status``): posted, not delivered, retries, down, the last
    error; the log line names the endpoint by scheme and host only (a webhook's path
    holds its token)."""
    from daemon.alerts import redacted

    runner, url, _ = await scripted([503, 503, 204, 401])
    queue = AlertQueue(WebhookNotifier(url, retries=1, retry_initial_seconds=0.01))
    assert queue.webhook is not None
    try:
        with structlog.testing.capture_logs() as logs:
            async with queue.webhook:
                await queue.webhook.send(ALERT)  # 503, 503: not delivered, down
                down = queue.statistics()
                await queue.webhook.send(ALERT)  # 204
                await queue.webhook.send(ALERT)  # 401
    finally:
        await runner.cleanup()
    assert (down.webhook, down.posted, down.failed, down.retried, down.down) == (
        True,
        0,
        1,
        1,
        True,
    )
    assert down.last_error == "HTTP 503"
    st = queue.statistics()
    assert (st.posted, st.failed, st.down, st.last_error) == (1, 2, False, "HTTP 401")
    (line,) = [e for e in logs if e["event"] == "alert webhook failed"]
    assert line["url"] == redacted(url) == url.removesuffix("hook") + "…"
    assert "/hook" not in str(logs)  # the path: a real webhook's token
    assert (
        redacted("https://user:pw@hooks.example.com/services/T/B/x?t=1")
        == "https://hooks.example.com/…"
    )
    bare = AlertQueue()
    assert not bare.statistics().webhook
    for q in (queue, bare):  # their streams closed
        q.close()
        await q.run()


@pytest.mark.parametrize(
    "raw",
    ["garbage", {"webhook": "yes"}, {"webhook": True, "posted": "many"}, ["x"], 7],
)
def test_a_broken_alerts_part_of_a_status_file_is_left_out(raw: object) -> None:
    """status.json is a file anyone may have edited: an ``alerts`` part that is not one
    reads as None and ``status`` prints the rest, with no webhook line."""
    from daemon.cli.run import _render_status
    from daemon.status import Status

    st = msgspec.convert(
        {
            "pid": 1, "started_at": 0.0, "written_at": 0.0, "running": False, "state": {},
            "bus": {"published": 0, "delivered": 0, "coalesced": 0, "subscriptions": []},
            "feeds": [], "components": {"alerts": raw},
        },
        Status,
    )  # fmt: skip
    assert st.alerts is None
    text = _render_status(st, None)
    assert "bus: published 0" in text and "alert webhook" not in text


def test_a_webhook_line_in_status_is_made_terminal_safe() -> None:
    """The last error is the endpoint's words (an HTTP reason, an exception): escape
    sequences in it are not sent to the operator's terminal."""
    from daemon.cli.run import _render_status
    from daemon.status import Status

    st = msgspec.convert(
        {
            "pid": 1, "started_at": 0.0, "written_at": 0.0, "running": False, "state": {},
            "bus": {"published": 0, "delivered": 0, "coalesced": 0, "subscriptions": []},
            "feeds": [],
            "components": {"alerts": {"webhook": True, "down": True,
                                      "last_error": "boom\x1b[2J\x07"}},
        },
        Status,
    )  # fmt: skip
    text = _render_status(st, None)
    assert "alert webhook: DOWN (last: boom" in text and "\x1b" not in text and "\x07" not in text


def test_status_says_how_many_alerts_are_kept_for_later() -> None:
    """With the outbox (a durable state dir), ``status`` adds what it holds, what it
    posted late and what it dropped as too old; without it, nothing of that."""
    from daemon.cli.run import _render_status
    from daemon.status import Status

    def shown(alerts: dict[str, object]) -> str:
        st = msgspec.convert(
            {
                "pid": 1, "started_at": 0.0, "written_at": 0.0, "running": False, "state": {},
                "bus": {"published": 0, "delivered": 0, "coalesced": 0, "subscriptions": []},
                "feeds": [], "components": {"alerts": alerts},
            },
            Status,
        )  # fmt: skip
        return _render_status(st, None)

    text = shown({"webhook": True, "kept": 4, "reposted": 2, "expired": 1})
    assert "; 4 kept to post again, 2 posted late, 1 too old to post" in text
    assert "kept" not in shown({"webhook": True})


def test_the_chat_line_says_who_what_when_and_stays_within_a_chat_s_limit() -> None:
    """The line names the agent and hook, the symbol, the reason and the event time,
    says when it is late, and is cut to Discord's 2,000 characters."""
    from daemon.alerts import MAX_TEXT, body_of, summary_line

    late = msgspec.structs.replace(ALERT, ts="2026-11-27T10:05:00.000Z", redelivered=True)
    assert summary_line(late) == (
        "marketwake ALERT a/wake_crash BTC-USD: BTC -12% in 24h (event time "
        "2026-11-27T10:05:00.000Z) [late: posted again after a restart or an outage]"
    )
    long = msgspec.structs.replace(ALERT, reason="x" * 10_000, symbol=None)
    line = summary_line(long)
    assert len(line) == MAX_TEXT and line.endswith("…") and "None" not in line
    body = json.loads(body_of(long))
    assert body["text"] == body["content"] == line and body["reason"] == "x" * 10_000


@pytest.mark.parametrize("status", [204, 400])
def test_config_test_alert_posts_one_and_says_what_the_endpoint_answered(
    tmp_path: Any, status: int
) -> None:
    """`marketwake config test-alert` posts one alert (one attempt) to the config's
    webhook and exits 0 when it was delivered, 1 with the endpoint's answer when not,
    never showing the URL's path (its token); with no webhook set, a usage error."""
    from click.testing import CliRunner

    from daemon.cli.run import config_group
    from tests.loopback import serve_posts

    with serve_posts(lambda _: (status, None)) as (url, got):
        cfg = tmp_path / "c.toml"
        cfg.write_text(f'[hooks]\nalert_webhook = "{url}/T0K3N"\n')
        res = CliRunner().invoke(config_group, ["test-alert", str(cfg)])
    assert len(got) == 1 and got[0]["hookId"] == "test_alert"
    assert got[0]["text"].startswith("marketwake ALERT marketwake/test_alert: a test alert")
    assert "T0K3N" not in res.output
    if status == 204:
        assert res.exit_code == 0 and "delivered to http://127.0.0.1:" in res.output
    else:
        assert res.exit_code == 1 and "not delivered to" in res.output
        assert "HTTP 400" in res.output
    (tmp_path / "none.toml").write_text("")
    res = CliRunner().invoke(config_group, ["test-alert", str(tmp_path / "none.toml")])
    assert res.exit_code == 2 and "sets no [hooks] alert_webhook" in res.output
