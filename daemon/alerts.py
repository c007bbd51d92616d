"""Where ALERT decisions go: the log by default, optionally a webhook.

An alert is a message to a human, not an action: a failing webhook is logged
and counted, never retried forever and never allowed to stall the dispatcher
(one short timeout per alert).
"""

from __future__ import annotations

from typing import Protocol

import aiohttp
import anyio
import msgspec
import structlog

log = structlog.get_logger("alerts")


class Alert(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """One ALERT decision, as sent to a notifier (camelCase JSON for webhooks)."""

    agent_id: str
    hook_id: str
    reason: str
    event_id: str
    trace_id: str
    symbol: str | None = None
    topic: str | None = None
    ts: str | None = None


class AlertNotifier(Protocol):
    """Delivers alerts somewhere a human will see them."""

    async def send(self, alert: Alert) -> None:
        """Deliver one alert; must not raise for delivery problems."""
        ...


class LogNotifier:
    """Writes each alert as a warning log line (journald, console)."""

    def __init__(self) -> None:
        self.sent = 0

    async def send(self, alert: Alert) -> None:
        self.sent += 1
        log.warning(
            "ALERT",
            agent=alert.agent_id,
            hook=alert.hook_id,
            symbol=alert.symbol,
            reason=alert.reason,
            trace_id=alert.trace_id,
        )


class WebhookNotifier:
    """POSTs each alert as JSON to a URL (and logs it too)."""

    def __init__(self, url: str, *, timeout_seconds: float = 5.0) -> None:
        self.url = url
        self.timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self.log = LogNotifier()
        self.failures = 0

    async def send(self, alert: Alert) -> None:
        await self.log.send(alert)
        body = msgspec.json.encode(alert)
        headers = {"content-type": "application/json"}
        try:
            async with (
                aiohttp.ClientSession(timeout=self.timeout) as session,
                session.post(self.url, data=body, headers=headers) as resp,
            ):
                if resp.status >= 300:
                    self.failures += 1
                    log.warning("alert webhook refused", status=resp.status)
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.failures += 1
            log.warning("alert webhook failed", error=str(exc) or type(exc).__name__)


class AlertQueue:
    """Hands alerts to a notifier from a background task (:meth:`run`), so a slow or
    hanging endpoint never stalls the agent that raised them. When ``size`` alerts
    are already waiting, new ones are logged, counted in ``dropped`` and discarded."""

    def __init__(self, notifier: AlertNotifier, size: int = 1000) -> None:
        self.notifier = notifier
        self._send, self._receive = anyio.create_memory_object_stream[Alert](size)
        self.dropped = 0

    async def send(self, alert: Alert) -> None:
        try:
            self._send.send_nowait(alert)
        except anyio.WouldBlock:
            self.dropped += 1
            log.warning("alert queue full; alert dropped", agent=alert.agent_id, hook=alert.hook_id)

    async def run(self) -> None:
        """Deliver queued alerts until :meth:`close`, then deliver what is left."""
        async with self._receive:
            async for alert in self._receive:
                await self.notifier.send(alert)

    def close(self) -> None:
        """No more alerts; :meth:`run` returns once the queue is empty."""
        self._send.close()


def build_notifier(webhook_url: str) -> AlertNotifier:
    """A webhook notifier when a URL is configured, else the log."""
    return WebhookNotifier(webhook_url) if webhook_url else LogNotifier()
