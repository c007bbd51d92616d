"""Where ALERT decisions go: the log by default, optionally a webhook.

An alert is a message to a human, not an action: it is logged as it is raised,
and the webhook gets it from background tasks, a few requests at once, each with
a short timeout. A transient failure (no connection, a timeout, 429, 5xx) is
retried a few times with backoff (the endpoint's ``Retry-After`` respected, up
to 30 s), so a blip does not lose an alert; an endpoint that stays down gets one
attempt per alert until one goes through, so it does not hold the queue. A
failing or hanging endpoint is counted and logged, and never delays the log
line, the dispatcher or the other alerts. With a durable state dir, the alerts
not delivered yet are kept on disk and posted again after a restart or an
outage (:mod:`daemon.alert_outbox`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal, NamedTuple, Protocol, Self
from urllib.parse import urlsplit

import anyio
import msgspec
import structlog
from anyio.streams.memory import MemoryObjectReceiveStream

from daemon.alert_outbox import AlertOutbox
from daemon.audit.records import AlertRecord, AuditRecord, now_ts
from daemon.backoff import backoff_delay
from daemon.errors import StoreError
from daemon.status import AlertsStatus

if TYPE_CHECKING:
    import aiohttp

log = structlog.get_logger("alerts")
FAILURE_LOG_SECONDS = 60.0  # a failing webhook is logged at most this often (with a count)
RETRIES = 3  # more attempts at an alert the endpoint failed transiently
RETRY_AFTER_MAX = 30.0  # seconds: a longer Retry-After is cut to this


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
    # Posted again after a restart or an outage (kept in the outbox meanwhile): it may
    # be late, and it may have been delivered already (at least once).
    redelivered: bool = False


MAX_TEXT = 1900  # characters of the summary line (Discord takes 2,000 at most)


class _Posted(Alert, frozen=True, kw_only=True, rename="camel"):
    """An alert as the webhook gets it: its fields, and a line for a human under the
    names chat webhooks read (``text``: Slack, Mattermost; ``content``: Discord), so
    a chat's incoming-webhook URL works as it is."""

    text: str
    content: str
    # Discord: the line pings no one, whatever a reason holds (@everyone, a role).
    allowed_mentions: dict[str, list[str]] = msgspec.field(
        default_factory=lambda: {"parse": []}, name="allowed_mentions"
    )


def summary_line(alert: Alert) -> str:
    """The alert in one line, for a chat: who raised it, on what, why, when."""
    where = f" {alert.symbol}" if alert.symbol else ""
    when = f" (event time {alert.ts})" if alert.ts else ""
    late = " [late: posted again after a restart or an outage]" if alert.redelivered else ""
    line = f"marketwake ALERT {alert.agent_id}/{alert.hook_id}{where}: {alert.reason}{when}{late}"
    return line if len(line) <= MAX_TEXT else line[: MAX_TEXT - 1] + "…"


def body_of(alert: Alert) -> bytes:
    """The JSON an alert is posted as (:class:`_Posted`)."""
    line = summary_line(alert)
    return msgspec.json.encode(_Posted(**msgspec.structs.asdict(alert), text=line, content=line))


#: What became of one alert at the webhook: delivered, refused for good (a 4xx),
#: or not delivered after its attempts (worth another try later).
Delivery = Literal["posted", "refused", "failed"]
AlertStatus = Literal["posted", "refused", "failed", "expired"]


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
    """POSTs each alert as JSON to a URL, over one connection pool (``async with``
    closes it). A failure is counted and logged at most once a minute, with the
    count: a dead endpoint under a stream of alerts does not flood the log. The
    HTTP client is imported with the first post: a daemon without a webhook (and
    a backtest) never loads it."""

    def __init__(
        self,
        url: str,
        *,
        timeout_seconds: float = 5.0,
        retries: int = RETRIES,
        retry_initial_seconds: float = 1.0,
    ) -> None:
        self.url = url
        self.timeout_seconds = timeout_seconds
        self.retries = retries
        self.retry_initial = retry_initial_seconds
        # The last alert was not delivered after its retries: the next ones get a
        # single attempt each, until one goes through. Closing (the daemon stops, with
        # a deadline): one attempt each too.
        self.down = False
        self.closing = False
        self.failures = 0
        self.retried = 0
        self.posted = 0
        self.last_error = ""
        self._session: aiohttp.ClientSession | None = None
        self._logged_at: float | None = None  # monotonic time of the last failure line
        self._logged_failures = 0

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def send(self, alert: Alert) -> Delivery:
        """Post ``alert``, retrying a transient failure; never raises."""
        return await self.post(body_of(alert))

    async def post(self, body: bytes) -> Delivery:
        """Post an alert's JSON ``body``, retrying a transient failure; never raises."""
        attempts = 1 if self.down or self.closing else 1 + self.retries
        error = ""
        for attempt in range(attempts):
            failed, after = await self._post(body)
            if failed is None:
                self.down = False
                self.posted += 1
                return "posted"
            error = failed
            if after is None:  # refused for good (4xx): retrying would not help
                self._failed(error)
                return "refused"
            if attempt + 1 < attempts and not self.closing:
                self.retried += 1
                cap = self.retry_initial * 8
                await anyio.sleep(max(after, backoff_delay(attempt, self.retry_initial, cap)))
            else:
                self.down = True
                break
        self._failed(error)
        return "failed"

    async def _post(self, body: bytes) -> tuple[str | None, float | None]:
        """One attempt: (None, None) delivered; (error, None) refused for good;
        (error, seconds) worth another attempt after at least that long."""
        import aiohttp  # the first post loads the client (see the class)

        if self._session is None:
            timeout = aiohttp.ClientTimeout(total=self.timeout_seconds)
            self._session = aiohttp.ClientSession(timeout=timeout)
        headers = {"content-type": "application/json"}
        try:
            async with self._session.post(self.url, data=body, headers=headers) as resp:
                if resp.status < 300:
                    return None, None
                error = f"HTTP {resp.status}"
                if resp.status == 429 or resp.status >= 500:
                    return error, retry_after(resp.headers.get("Retry-After"))
                return error, None
        except (aiohttp.ClientError, TimeoutError) as exc:
            return str(exc) or type(exc).__name__, 0.0

    def _failed(self, error: str) -> None:
        self.failures += 1
        self.last_error = error
        now = time.monotonic()
        if self._logged_at is None or now - self._logged_at >= FAILURE_LOG_SECONDS:
            log.warning(
                "alert webhook failed",
                url=redacted(self.url),
                error=error,
                failures=self.failures - self._logged_failures,
            )
            self._logged_at, self._logged_failures = now, self.failures


def _read_kept(body: bytes) -> Alert | None:
    """A kept alert's body as an alert; None (logged) if it does not read."""
    try:
        return msgspec.json.decode(body, type=Alert)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        log.error("unreadable kept alert dropped", error=str(exc))
        return None


def redacted(url: str) -> str:
    """``url`` without its path and query, for logs and status: a webhook's path often
    holds its token (Slack, Discord)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}/…"


def retry_after(value: str | None) -> float:
    """Seconds a ``Retry-After`` header asks to wait (its delay-seconds form; a date
    or anything else counts as 0), at most :data:`RETRY_AFTER_MAX`."""
    try:
        seconds = float(value) if value is not None else 0.0
    except ValueError:
        return 0.0
    return min(seconds, RETRY_AFTER_MAX) if seconds > 0 else 0.0


class _Queued(NamedTuple):
    """An alert waiting for the webhook: the alert, its JSON, and its row in the outbox
    (None: not kept)."""

    alert: Alert
    body: bytes
    row: int | None = None


class AlertQueue:
    """Where the dispatcher sends alerts. Each is logged as it is raised (the log never
    waits for the webhook) and, with a webhook, handed to it from background tasks
    (:meth:`run`), ``posts`` at most at once: a slow or hanging endpoint never stalls
    the agent that raised an alert, and one hanging request does not hold the others.
    When ``size`` alerts are waiting for the webhook, new ones are not posted (still
    logged and audited), counted in ``dropped``.

    With an ``outbox`` every alert for the webhook is kept until the webhook has it:
    one the endpoint failed after its retries, or that found the queue full or the
    daemon stopping, is posted again (``redelivered``) once the endpoint takes an
    alert again, or at the next start."""

    def __init__(
        self,
        webhook: WebhookNotifier | None = None,
        *,
        size: int = 1000,
        posts: int = 4,
        outbox: AlertOutbox | None = None,
        sink: Callable[[AuditRecord], None] | None = None,
    ) -> None:
        self.log = LogNotifier()
        self.sink = sink  # the audit: what became of each alert at the webhook
        self.webhook = webhook
        self.posts = posts
        self.outbox = outbox if webhook is not None else None
        self._send, self._receive = anyio.create_memory_object_stream[_Queued](size)
        self.dropped = 0
        self.reposted = 0  # kept alerts delivered later
        self._queued: set[int] = set()  # outbox rows in the queue or being posted
        self._behind = True  # the outbox may hold alerts that are not queued

    async def send(self, alert: Alert) -> None:
        await self.log.send(alert)
        if self.webhook is None:
            return
        item = _Queued(alert, body_of(alert))
        if self.outbox is not None:
            item = item._replace(row=self._keep(self.outbox, item.body))
        try:
            self._send.send_nowait(item)
        except anyio.WouldBlock:
            if item.row is not None:  # posted once the queue has room
                self._behind = True
            else:
                self.dropped += 1
                if self.dropped == 1 or self.dropped % 100 == 0:
                    log.warning(
                        "alert webhook backlog full; alerts not posted", dropped=self.dropped
                    )
            self._record(item, "failed", "not posted: the webhook's queue was full")
            return
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            if item.row is None:
                self.dropped += 1  # the daemon is stopping: logged above, not posted
            self._record(item, "failed", "not posted: the daemon was stopping")
            return
        if item.row is not None:
            self._queued.add(item.row)

    def _record(self, item: _Queued, status: AlertStatus, error: str = "") -> None:
        """Audit what became of ``item`` at the webhook."""
        if self.sink is None:
            return
        a = item.alert
        self.sink(
            AlertRecord(
                ts=now_ts(),
                agent_id=a.agent_id,
                trace_id=a.trace_id,
                event_ts=a.ts,
                hook_id=a.hook_id,
                event_id=a.event_id,
                status=status,
                redelivered=a.redelivered,
                kept=status == "failed" and item.row is not None,
                error=error,
            )
        )

    def _keep(self, outbox: AlertOutbox, body: bytes) -> int | None:
        try:
            return outbox.add(body)
        except StoreError as exc:  # the alert still goes out; only a restart may lose it
            log.error("alert not kept for redelivery", error=str(exc))
            return None

    def _catch_up(self) -> None:
        """Queue the kept alerts that are not queued, oldest first, as far as the queue
        has room (the rest wait for the next time)."""
        if self.outbox is None or not self._behind:
            return
        stats = self._send.statistics()
        room = int(stats.max_buffer_size - stats.current_buffer_used)
        try:
            kept, expired = self.outbox.due(self._queued, room)
        except StoreError as exc:
            log.error("kept alerts not read", error=str(exc))
            return
        self._behind = len(kept) >= room
        too_old = f"kept over alert_webhook_keep_seconds ({self.outbox.keep_seconds:g})"
        for body in expired:
            alert = _read_kept(body)
            if alert is not None:
                self._record(_Queued(alert, body), "expired", too_old)
        for k in kept:
            alert = _read_kept(k.body)
            if alert is None:
                self._done(k.row)
                continue
            again = msgspec.structs.replace(alert, redelivered=True)
            try:
                self._send.send_nowait(_Queued(again, body_of(again), k.row))
            except (anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
                self._behind = True  # still kept: the next time, or the next start
                return
            self._queued.add(k.row)

    def _done(self, row: int) -> None:
        if self.outbox is None:
            return
        try:
            self.outbox.done(row)
        except StoreError as exc:  # it may be posted once more after a restart
            log.error("delivered alert not cleared", error=str(exc))

    async def run(self) -> None:
        """Post queued alerts (first those kept from before the start) until
        :meth:`close`, then post what is left; cancelled first (a stop past its
        timeout), say how many were not posted."""
        try:
            if self.webhook is None:
                return  # nothing is queued
            self._catch_up()
            async with self.webhook, anyio.create_task_group() as tg:
                for _ in range(self.posts):  # each posting task holds its own clone
                    tg.start_soon(self._post, self.webhook, self._receive.clone())
        finally:
            self._send.close()  # nobody posts any more: later alerts are logged only
            left = 0
            while True:
                try:
                    item = self._receive.receive_nowait()
                except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                    break
                left += 1
                self._record(item, "failed", "not posted: the daemon stopped first")
            self._receive.close()
            if left and self.outbox is not None:
                log.warning(
                    "alerts not posted to the webhook at the stop: kept, posted at the next start",
                    alerts=left,
                    within_seconds=self.outbox.keep_seconds,
                )
            elif left:
                log.warning(
                    "alerts not posted to the webhook at the stop (they are in the log "
                    "and the audit)",
                    alerts=left,
                )

    async def _post(
        self, webhook: WebhookNotifier, alerts: MemoryObjectReceiveStream[_Queued]
    ) -> None:
        async with alerts:
            async for item in alerts:
                delivery = await webhook.post(item.body)
                # (no await since the post returned: its error is this alert's)
                self._record(item, delivery, "" if delivery == "posted" else webhook.last_error)
                if item.row is None:
                    continue
                self._queued.discard(item.row)
                if delivery == "failed":
                    self._behind = True  # kept: posted again once the endpoint is back
                    continue
                self._done(item.row)
                if delivery == "posted":
                    self.reposted += item.alert.redelivered
                    if not webhook.closing:
                        self._catch_up()

    def statistics(self) -> AlertsStatus:
        """What ``status`` shows of the webhook."""
        w = self.webhook
        if w is None:
            return AlertsStatus(webhook=False)
        return AlertsStatus(
            webhook=True,
            posted=w.posted,
            failed=w.failures,
            retried=w.retried,
            dropped=self.dropped,
            down=w.down,
            last_error=w.last_error,
            kept=self._kept(),
            reposted=self.reposted,
            expired=self.outbox.expired if self.outbox is not None else 0,
        )

    def _kept(self) -> int | None:
        """How many alerts the outbox holds (None: no outbox, or it does not read)."""
        if self.outbox is None:
            return None
        try:
            return self.outbox.count()
        except StoreError:
            return None

    def close(self) -> None:
        """No more alerts; :meth:`run` returns once the queued ones are posted (one
        attempt each from now on: the stop has a deadline)."""
        self._send.close()
        if self.webhook is not None:
            self.webhook.closing = True
