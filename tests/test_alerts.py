"""Alert notifiers: a webhook on loopback receives the alert; failures never raise."""

from __future__ import annotations

import json
from typing import Any

import anyio
from aiohttp import web
from anyio import wait_all_tasks_blocked

from daemon.alerts import Alert, LogNotifier, WebhookNotifier, build_notifier

ALERT = Alert(
    agent_id="a",
    hook_id="wake_crash",
    reason="BTC -12% in 24h",
    event_id="e1",
    trace_id="t1",
    symbol="BTC-USD",
    topic="market.price.tick",
)


async def serve(status: int) -> tuple[web.AppRunner, str, list[Any]]:
    got: list[Any] = []

    async def handler(request: web.Request) -> web.Response:
        got.append(json.loads(await request.read()))
        return web.Response(status=status)

    app = web.Application()
    app.router.add_post("/hook", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}/hook", got


async def test_webhook_posts_camel_case_json() -> None:
    """The webhook gets the alert as camelCase JSON."""
    runner, url, got = await serve(204)
    try:
        notifier = WebhookNotifier(url)
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
        }
    ]
    assert notifier.failures == 0


async def test_refused_or_unreachable_webhook_is_counted_not_raised() -> None:
    """A 500 and a closed port both count as failures; send() returns normally."""
    runner, url, _ = await serve(500)
    try:
        notifier = WebhookNotifier(url, timeout_seconds=2)
        await notifier.send(ALERT)
    finally:
        await runner.cleanup()
    await notifier.send(ALERT)  # the server is gone now
    assert notifier.failures == 2


def test_build_notifier() -> None:
    """No URL means log only."""
    assert isinstance(build_notifier(""), LogNotifier)
    assert isinstance(build_notifier("http://127.0.0.1:9/x"), WebhookNotifier)


async def test_queue_never_blocks_the_sender_and_counts_drops() -> None:
    """A hanging notifier cannot stall send(); overflow is counted; close() drains."""
    from daemon.alerts import AlertQueue

    release = anyio.Event()
    delivered: list[Alert] = []

    class Slow:
        async def send(self, alert: Alert) -> None:
            await release.wait()
            delivered.append(alert)

    queue = AlertQueue(Slow(), size=2)
    async with anyio.create_task_group() as tg:
        tg.start_soon(queue.run)
        with anyio.fail_after(1):
            await queue.send(ALERT)
            await wait_all_tasks_blocked()  # the notifier holds the first alert
            for _ in range(4):
                await queue.send(ALERT)
        release.set()
        queue.close()
    assert queue.dropped == 2  # one in the notifier, two queued, two dropped
    assert len(delivered) == 3
