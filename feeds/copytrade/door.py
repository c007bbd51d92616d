"""What the copy-trade HTTP receivers share: the server's life, the inbox calls,
publishing stored signals in order, and one audit row per answer.

A receiver (the signed webhook, TradingView) subclasses :class:`SignalDoor`
with its routes and its request handling. At start, what a stop left between
an answer and its publish (and the signals of the last ``redeliver_seconds``)
goes out first; then the door opens. Every answer is a ``SignalRecord``;
refusals past ``REFUSALS_RECORDED_PER_MINUTE`` are answered and counted but
not recorded, so a flood cannot rotate the audit log away. A connection has
``REQUEST_SECONDS`` to send its headers (or, once answered, its next request)
and as long again for its body: a slow or silent client cannot hold a socket
or a handler for long. Past ``MAX_CONNECTIONS`` open at once, a new connection
is answered 503 and closed as soon as it is made: a flood costs the door, never
the daemon's file descriptors (its audit log, stores and sandbox workers need
them). A door that knows its senders' addresses (:meth:`SignalDoor.expects`)
gives the others only ``MAX_STRANGERS`` of those places, so a flood from
elsewhere never turns its senders away.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

import anyio
import anyio.abc
import structlog
from aiohttp import web
from anyio.abc import TaskStatus

from daemon.audit.records import SignalRecord
from daemon.errors import ConfigError, SignalRejected
from daemon.events import FeedEvent, Publish
from feeds.base import FeedHealth
from feeds.copytrade.inbox import Inbox
from feeds.http import BUSY_RESPONSE

log = structlog.get_logger("feeds.copytrade")
AuditSink = Callable[[SignalRecord], None]
T = TypeVar("T")
BEAT_SECONDS = 5.0  # a listening server is a live feed, however quiet its leaders
REFUSALS_RECORDED_PER_MINUTE = 60  # audit rows and log lines; every refusal still answers
PRUNE_SECONDS = 600.0  # old nonces, alerts and signal ids go at start and every 10 minutes
REQUEST_SECONDS = 10.0  # for the headers (an idle connection too), then for the body
MAX_CONNECTIONS = 128  # open at once
MAX_STRANGERS = 16  # of which from addresses the door does not expect (still answered 403)


class DoorSettings(Protocol):
    """What every receiver's config section has."""

    @property
    def host(self) -> str: ...
    @property
    def port(self) -> int: ...
    @property
    def max_body_bytes(self) -> int: ...
    @property
    def redeliver_seconds(self) -> float: ...


class SignalDoor:
    """An HTTP receiver of leader signals (see the module doc)."""

    name = "copytrade"
    what = "copytrade webhook"  # for logs and config errors
    section = "feeds.copytrade_webhook"
    inbox_file = "copytrade.sqlite3"
    inbox_type: type[Inbox] = Inbox

    def __init__(
        self,
        config: DoorSettings,
        state_dir: Path,
        *,
        audit: AuditSink | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.inbox_path = state_dir / self.inbox_file
        self.host, self.wanted_port = config.host, config.port
        self.max_body_bytes = config.max_body_bytes
        self.redeliver_seconds = config.redeliver_seconds
        self.audit = audit
        self.clock = clock
        self.port = 0  # bound port (config port 0 picks a free one)
        self.counts = {"accepted": 0, "duplicate": 0, "rejected": 0, "unrecorded": 0}
        self._minute, self._refusals = time.monotonic(), 0  # refusals recorded this minute
        self._inbox: Any = None
        self._send: anyio.abc.ObjectSendStream[FeedEvent] | None = None
        self._limiter = anyio.CapacityLimiter(1)

    # -- what a receiver defines ---------------------------------------------------

    def routes(self, app: web.Application) -> None:
        """Add the receiver's routes."""
        raise NotImplementedError

    async def before_open(self, tg: anyio.abc.TaskGroup) -> None:
        """Start what the receiver runs beside the server (before the door opens)."""

    async def prune(self) -> None:
        """Forget what is too old to matter (at start and every ``PRUNE_SECONDS``)."""

    def url(self) -> str:
        """Where the receiver listens, for the log."""
        return f"http://{self.host}:{self.port}/"

    # -- shared ------------------------------------------------------------------------

    def statistics(self) -> dict[str, int]:
        """For status: requests accepted, duplicate, rejected, and refusals past the
        per-minute audit limit."""
        return dict(self.counts)

    async def run(
        self, publish: Publish, health: FeedHealth, *, task_status: TaskStatus[None]
    ) -> None:
        """Serve until cancelled; publish what was stored but not published first."""
        inbox = self._inbox = await anyio.to_thread.run_sync(self.inbox_type, self.inbox_path)
        try:
            sock = socket.create_server((self.host, self.wanted_port), reuse_port=False)
        except OSError as exc:
            inbox.close()
            raise ConfigError(
                f"{self.section}: cannot listen on {self.host}:{self.wanted_port}: {exc.strerror}"
            ) from None
        send, receive = anyio.create_memory_object_stream[FeedEvent](1024)
        self._send = send
        app = web.Application(client_max_size=self.max_body_bytes)
        self.routes(app)
        # A stop (or a reload rebinding the port) waits at most this long for requests
        # in flight; every signal is on disk before its answer, so none is lost.
        # keepalive_timeout also bounds a connection's wait for its (first) headers.
        runner = web.AppRunner(
            app,
            access_log=None,
            handle_signals=False,
            shutdown_timeout=2.0,
            keepalive_timeout=REQUEST_SECONDS,
        )
        await runner.setup()
        listening: asyncio.AbstractServer | None = None
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._publisher, receive, publish)
                await self.before_open(tg)
                # What a stop left between an answer and its publish goes first, then
                # the door opens: a leader's signals keep their order.
                since = int((self.clock() - self.redeliver_seconds) * 1000)
                backlog = await self.run_inbox(inbox.to_publish, since)
                for event in backlog:
                    await send.send(event)
                if backlog:
                    log.info(f"{self.what} signals delivered again at start", signals=len(backlog))
                assert runner.server is not None
                listening = await self._listen(runner.server, sock)
                self.port = sock.getsockname()[1]
                log.info(f"{self.what} listening", url=self.url())
                task_status.started()
                pruned = -PRUNE_SECONDS
                while True:
                    health.beat()
                    if time.monotonic() - pruned >= PRUNE_SECONDS:
                        await self.prune()
                        pruned = time.monotonic()
                    await anyio.sleep(BEAT_SECONDS)
        finally:
            with anyio.CancelScope(shield=True):
                if listening is not None:
                    listening.close()  # no new connection; the runner ends the open ones
                await runner.cleanup()
                sock.close()
                send.close()
                receive.close()
                await self.run_inbox(inbox.close)

    def expects(self, address: str) -> bool:
        """Whether a connection from ``address`` (the peer's, not a forwarded one) is
        one of the door's senders; a door that cannot tell expects everyone."""
        return True

    async def _listen(self, server: web.Server, sock: socket.socket) -> asyncio.AbstractServer:
        """Serve ``server`` on ``sock``, turning away (503) what comes past
        ``MAX_CONNECTIONS``, or past ``MAX_STRANGERS`` for a peer the door does not
        expect (logged at most once a minute, with how many)."""
        refused, logged = 0, -60.0
        strangers: set[asyncio.Transport] = set()  # at most MAX_STRANGERS, closed ones pruned

        def admit(transport: asyncio.Transport) -> bool:
            nonlocal refused, logged, strangers
            expected = self.expects(_peer(transport))
            if not expected:
                strangers = {t for t in strangers if not t.is_closing()}
            open_now = len(server.connections)
            if open_now < MAX_CONNECTIONS and (expected or len(strangers) < MAX_STRANGERS):
                if not expected:
                    strangers.add(transport)
                return True
            refused += 1
            if time.monotonic() - logged >= 60:
                logged = time.monotonic()
                log.warning(
                    f"{self.what} connections turned away: {open_now} open, "
                    f"{len(strangers)} of them from unexpected addresses",
                    refused_since_start=refused,
                )
            return False

        return await asyncio.get_running_loop().create_server(
            lambda: _Gate(server, admit), sock=sock
        )

    async def run_inbox(self, fn: Callable[..., T], *args: object) -> T:
        """``fn`` in a worker thread, one inbox call at a time (each may fsync)."""
        return await anyio.to_thread.run_sync(fn, *args, limiter=self._limiter)

    async def publish_later(self, event: FeedEvent) -> None:
        """Queue a stored signal for publishing (in order, after those before it)."""
        assert self._send is not None
        await self._send.send(event)

    async def _publisher(
        self, receive: anyio.abc.ObjectReceiveStream[FeedEvent], publish: Publish
    ) -> None:
        """Publish stored signals in arrival order, marking each once on the bus."""
        async for event in receive:
            await publish(event)
            payload = event.payload
            await self.run_inbox(
                self._inbox.published, str(payload["leader"]), str(payload["signalId"])
            )

    async def read_body(self, request: web.Request) -> bytes:
        """The body, or :exc:`SignalRejected` 413 past ``max_body_bytes``, 408 when it
        takes longer than ``REQUEST_SECONDS`` to arrive."""
        too_big = SignalRejected(413, f"body over {self.max_body_bytes} bytes")
        if (request.content_length or 0) > self.max_body_bytes:
            raise too_big
        try:
            with anyio.fail_after(REQUEST_SECONDS):
                return await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise too_big from None
        except TimeoutError:
            raise SignalRejected(408, f"body not received within {REQUEST_SECONDS:g} s") from None

    def answer(self, record: SignalRecord) -> web.Response:
        """Count, audit and log one answer; the HTTP response that says it."""
        self.counts[record.status] += 1
        recorded = record.status != "rejected" or self._record_refusal()
        if recorded and self.audit is not None:
            self.audit(record)
        if recorded and record.status == "rejected":
            log.warning(
                f"{self.what} signal rejected",
                leader=record.leader,
                status=record.http_status,
                reason=record.reason,
                remote=record.remote,
            )
        body = {"status": record.status, "eventId": record.event_id, "reason": record.reason}
        status = record.http_status or 200  # a door's records always carry their answer
        return web.json_response({k: v for k, v in body.items() if v}, status=status)

    def _record_refusal(self) -> bool:
        """Whether this refusal gets its audit row and log line: at most
        ``REFUSALS_RECORDED_PER_MINUTE`` a minute; the rest are counted
        (``unrecorded``) and said once per minute."""
        now = time.monotonic()
        if now - self._minute >= 60:
            if self._refusals > REFUSALS_RECORDED_PER_MINUTE:
                log.warning(
                    f"{self.what} refusals not recorded",
                    unrecorded=self._refusals - REFUSALS_RECORDED_PER_MINUTE,
                    seconds=round(now - self._minute),
                )
            self._minute, self._refusals = now, 0
        self._refusals += 1
        if self._refusals > REFUSALS_RECORDED_PER_MINUTE:
            self.counts["unrecorded"] += 1
            return False
        return True


def _peer(transport: asyncio.BaseTransport) -> str:
    peer = transport.get_extra_info("peername")
    return str(peer[0]) if isinstance(peer, tuple) and peer else ""


class _Gate(asyncio.Protocol):
    """A new connection's first protocol: it hands the connection to aiohttp's handler
    when ``admit`` says so (before any byte is read), else answers 503 and closes."""

    def __init__(self, server: web.Server, admit: Callable[[asyncio.Transport], bool]) -> None:
        self._server = server
        self._admit = admit

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        if not self._admit(transport):
            transport.write(BUSY_RESPONSE)
            transport.close()
            return
        handler = self._server()
        transport.set_protocol(handler)
        handler.connection_made(transport)
