"""CopytradeWebhookFeed: signed leader signals over HTTP become ``copytrade.signal.*``.

``POST /copytrade/<leader>`` (aiohttp, 127.0.0.1:7881 by default). A request is
checked in order: known leader (404), body size (413), the three signature
headers (401: missing, malformed, bad signature, stale timestamp), the body
(400 not JSON, 422 not a valid signal), then the inbox: a reused nonce is a
replay (409); a signal id seen before is a duplicate (200, not published
again); a new signal is stored durably, answered 200, then published. Every
answer is one audit row (``type: signal``); no refused request ever becomes an
event. Signals stored but not published when the daemon stopped, and those of
its last ``redeliver_seconds``, are published first at the next start (see
:mod:`feeds.copytrade.inbox`).
"""

from __future__ import annotations

from aiohttp import web

from daemon.audit.records import SignalRecord, now_ts
from daemon.errors import SignalRejected
from daemon.events import now_ms, signal_event, signal_event_id
from feeds.config import CopytradeWebhookSection
from feeds.copytrade.door import SignalDoor
from feeds.copytrade.protocol import (
    NONCE_HEADER,
    SIGNATURE_HEADER,
    SOURCE,
    TIMESTAMP_HEADER,
    parse,
    verify,
)


class CopytradeWebhookFeed(SignalDoor):
    """The signed-webhook signal source (``[feeds.copytrade_webhook]``)."""

    name = "copytrade_webhook"
    what = "copytrade"
    section = "feeds.copytrade_webhook"
    config: CopytradeWebhookSection

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/copytrade/{leader}", self._handle)

    def url(self) -> str:
        return f"http://{self.host}:{self.port}/copytrade/"

    async def prune(self) -> None:
        now = self.clock()
        await self.run_inbox(
            self._inbox.prune,
            int(now - 2 * self.config.skew_seconds),
            int((now - self.config.keep_days * 86400) * 1000),
        )

    async def _handle(self, request: web.Request) -> web.Response:
        leader = request.match_info["leader"]
        base = {"ts": now_ts(), "agent_id": "-", "source": SOURCE, "leader": leader[:64]}
        remote = request.remote or ""
        signal_id: str | None = None
        try:
            secret = self.config.leaders.get(leader)
            if secret is None:
                raise SignalRejected(404, f"unknown leader {leader[:64]!r}")
            body = await self.read_body(request)
            headers = request.headers
            sent_s = verify(
                secret.secret.reveal(),
                headers.get(TIMESTAMP_HEADER),
                headers.get(NONCE_HEADER),
                headers.get(SIGNATURE_HEADER),
                body,
                now_s=self.clock(),
                skew_s=self.config.skew_seconds,
            )
            signal = parse(body, leader)
            signal_id = signal.signal_id
            received = now_ms()
            event = signal_event(signal, SOURCE, received)
            verdict = await self.run_inbox(
                self._inbox.accept,
                leader,
                signal.signal_id,
                headers[NONCE_HEADER],
                sent_s,
                event,
                received,
            )
            if verdict == "replayed":
                raise SignalRejected(409, "replayed request (this nonce was already used)")
            if verdict == "new":
                await self.publish_later(event)
            return self.answer(
                SignalRecord(
                    **base,
                    signal_id=signal_id,
                    event_id=signal_event_id(leader, signal_id),
                    status="accepted" if verdict == "new" else "duplicate",
                    http_status=200,
                    remote=remote,
                )
            )
        except SignalRejected as exc:
            return self.answer(
                SignalRecord(
                    **base,
                    signal_id=signal_id,
                    status="rejected",
                    http_status=exc.status,
                    reason=exc.reason,
                    remote=remote,
                )
            )
