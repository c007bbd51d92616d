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

import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import anyio
import structlog
from aiohttp import web
from anyio.abc import TaskStatus

from daemon.audit.records import SignalRecord, now_ts
from daemon.errors import ConfigError, SignalRejected
from daemon.events import FeedEvent, Publish, now_ms, signal_event, signal_event_id
from feeds.base import FeedHealth
from feeds.config import CopytradeWebhookSection
from feeds.copytrade.inbox import Inbox
from feeds.copytrade.protocol import (
    NONCE_HEADER,
    SIGNATURE_HEADER,
    SOURCE,
    TIMESTAMP_HEADER,
    parse,
    verify,
)

log = structlog.get_logger("feeds.copytrade")
AuditSink = Callable[[SignalRecord], None]
T = TypeVar("T")
BEAT_SECONDS = 5.0  # a listening server is a live feed, however quiet its leaders
REFUSALS_RECORDED_PER_MINUTE = 60  # audit rows and log lines; every refusal still answers
PRUNE_SECONDS = 600.0  # old nonces and signal ids go at start and every 10 minutes


class CopytradeWebhookFeed:
    """The signed-webhook signal source (``[feeds.copytrade_webhook]``)."""

    name = "copytrade_webhook"

    def __init__(
        self,
        config: CopytradeWebhookSection,
        state_dir: Path,
        *,
        audit: AuditSink | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.inbox_path = state_dir / "copytrade.sqlite3"
        self.audit = audit
        self.clock = clock
        self.port = 0  # bound port (config port 0 picks a free one)
        self.counts = {"accepted": 0, "duplicate": 0, "rejected": 0, "unrecorded": 0}
        self._minute, self._refusals = time.monotonic(), 0  # refusals recorded this minute
        self._inbox: Inbox | None = None
        self._send: anyio.abc.ObjectSendStream[FeedEvent] | None = None
        self._limiter = anyio.CapacityLimiter(1)

    def statistics(self) -> dict[str, int]:
        """For status: requests accepted, duplicate, rejected, and refusals past the
        per-minute audit limit."""
        return dict(self.counts)

    async def run(
        self, publish: Publish, health: FeedHealth, *, task_status: TaskStatus[None]
    ) -> None:
        """Serve until cancelled; publish what was stored but not published first."""
        cfg = self.config
        inbox = self._inbox = await anyio.to_thread.run_sync(Inbox, self.inbox_path)
        try:
            sock = socket.create_server((cfg.host, cfg.port), reuse_port=False)
        except OSError as exc:
            inbox.close()
            raise ConfigError(
                f"feeds.copytrade_webhook: cannot listen on {cfg.host}:{cfg.port}: {exc.strerror}"
            ) from None
        send, receive = anyio.create_memory_object_stream[FeedEvent](1024)
        self._send = send
        app = web.Application(client_max_size=cfg.max_body_bytes)
        app.router.add_post("/copytrade/{leader}", self._handle)
        # A stop (or a reload rebinding the port) waits at most this long for requests
        # in flight; every signal is on disk before its answer, so none is lost.
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=2.0)
        await runner.setup()
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._publisher, receive, publish)
                # What a stop left between an answer and its publish goes first, then
                # the door opens: a leader's signals keep their order.
                since = int((self.clock() - cfg.redeliver_seconds) * 1000)
                backlog = await self._run_inbox(inbox.to_publish, since)
                for event in backlog:
                    await send.send(event)
                if backlog:
                    log.info("copytrade signals delivered again at start", signals=len(backlog))
                await web.SockSite(runner, sock).start()
                self.port = sock.getsockname()[1]
                log.info(
                    "copytrade webhook listening", url=f"http://{cfg.host}:{self.port}/copytrade/"
                )
                task_status.started()
                pruned = -PRUNE_SECONDS
                while True:
                    health.beat()
                    if time.monotonic() - pruned >= PRUNE_SECONDS:
                        await self._prune()
                        pruned = time.monotonic()
                    await anyio.sleep(BEAT_SECONDS)
        finally:
            with anyio.CancelScope(shield=True):
                await runner.cleanup()
                sock.close()
                send.close()
                receive.close()
                await self._run_inbox(inbox.close)

    async def _run_inbox(self, fn: Callable[..., T], *args: object) -> T:
        """``fn`` in a worker thread, one inbox call at a time (each may fsync)."""
        return await anyio.to_thread.run_sync(fn, *args, limiter=self._limiter)

    async def _publisher(
        self, receive: anyio.abc.ObjectReceiveStream[FeedEvent], publish: Publish
    ) -> None:
        """Publish accepted signals in arrival order, marking each once on the bus."""
        assert self._inbox is not None
        async for event in receive:
            await publish(event)
            payload = event.payload
            await self._run_inbox(
                self._inbox.published, str(payload["leader"]), str(payload["signalId"])
            )

    async def _prune(self) -> None:
        assert self._inbox is not None
        now = self.clock()
        await self._run_inbox(
            self._inbox.prune,
            int(now - 2 * self.config.skew_seconds),
            int((now - self.config.keep_days * 86400) * 1000),
        )

    def _note(self, record: SignalRecord) -> web.Response:
        self.counts[record.status] += 1
        recorded = record.status != "rejected" or self._record_refusal()
        if recorded and self.audit is not None:
            self.audit(record)
        if recorded and record.status == "rejected":
            log.warning(
                "copytrade signal rejected",
                leader=record.leader,
                status=record.http_status,
                reason=record.reason,
                remote=record.remote,
            )
        body = {"status": record.status, "eventId": record.event_id, "reason": record.reason}
        return web.json_response({k: v for k, v in body.items() if v}, status=record.http_status)

    def _record_refusal(self) -> bool:
        """Whether this refusal gets its audit row and log line: at most
        ``REFUSALS_RECORDED_PER_MINUTE`` a minute, so a flood of bad requests cannot
        rotate the audit log away; the rest are counted (``unrecorded``) and said
        once per minute."""
        now = time.monotonic()
        if now - self._minute >= 60:
            if self._refusals > REFUSALS_RECORDED_PER_MINUTE:
                log.warning(
                    "copytrade refusals not recorded",
                    unrecorded=self._refusals - REFUSALS_RECORDED_PER_MINUTE,
                    seconds=round(now - self._minute),
                )
            self._minute, self._refusals = now, 0
        self._refusals += 1
        if self._refusals > REFUSALS_RECORDED_PER_MINUTE:
            self.counts["unrecorded"] += 1
            return False
        return True

    async def _handle(self, request: web.Request) -> web.Response:
        leader = request.match_info["leader"]
        base = {"ts": now_ts(), "agent_id": "-", "source": SOURCE, "leader": leader[:64]}
        remote = request.remote or ""
        signal_id: str | None = None
        try:
            secret = self.config.leaders.get(leader)
            if secret is None:
                raise SignalRejected(404, f"unknown leader {leader[:64]!r}")
            if (request.content_length or 0) > self.config.max_body_bytes:
                raise SignalRejected(413, f"body over {self.config.max_body_bytes} bytes")
            try:
                body = await request.read()
            except web.HTTPRequestEntityTooLarge:
                raise SignalRejected(413, f"body over {self.config.max_body_bytes} bytes") from None
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
            assert self._inbox is not None and self._send is not None
            verdict = await self._run_inbox(
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
                await self._send.send(event)
            return self._note(
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
            return self._note(
                SignalRecord(
                    **base,
                    signal_id=signal_id,
                    status="rejected",
                    http_status=exc.status,
                    reason=exc.reason,
                    remote=remote,
                )
            )
