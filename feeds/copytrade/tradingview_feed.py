"""TradingViewFeed: TradingView strategy alerts become ``copytrade.signal.*``.

``POST /tv/<hook id>`` (aiohttp, 127.0.0.1:7882 by default; TradingView only
posts to ports 80 and 443, so a reverse proxy forwards to it). A request is
checked in order: the source address against ``allowed_ips`` (403; the
address a ``trusted_proxies`` member forwards in ``X-Forwarded-For``), the
hook id, compared in constant time with every configured one (404, never
echoed: it is the secret), the body size (413), then the body
(:func:`~feeds.copytrade.tradingview.parse_alert`: 415 a text body, 400 bad
JSON, 422 an unexpanded placeholder or a bad value, 401 a wrong passphrase).
A good alert is stored and answered 200 (TradingView cancels after 3 s, so
nothing else waits); a known alert id is a duplicate (200, nothing more).
The mapper then turns stored alerts, in order, into signals (see
:mod:`feeds.copytrade.alert_inbox`). Every answer is one audit row.
"""

from __future__ import annotations

import hmac
import ipaddress
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import anyio.abc
import msgspec
import structlog
from aiohttp import web

from daemon.audit.records import SignalRecord, now_ts
from daemon.errors import NOT_JSON, SignalRejected, StoreError
from daemon.events import FeedEvent, now_ms, signal_event
from feeds.config import TradingViewHookSection, TradingViewSection
from feeds.copytrade.alert_inbox import AlertInbox
from feeds.copytrade.door import AuditSink, SignalDoor
from feeds.copytrade.tradingview import SOURCE, TvAlert, TvMapper, map_symbol, parse_alert

log = structlog.get_logger("feeds.tradingview")
_alert_decoder = msgspec.json.Decoder(TvAlert)
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _networks(values: list[str]) -> list[Network]:
    return [ipaddress.ip_network(v, strict=False) for v in values]


def _inside(address: str, networks: list[Network]) -> bool:
    try:
        ip = ipaddress.ip_address(address.strip())
    except ValueError:
        return False
    return any(ip in net for net in networks)


def client_address(remote: str, forwarded: str | None, proxies: list[Network]) -> str:
    """The address a request came from: ``remote``, or, when ``remote`` is a trusted
    proxy, the last address in ``X-Forwarded-For`` that is not one."""
    if not forwarded or not _inside(remote, proxies):
        return remote
    for hop in reversed([h.strip() for h in forwarded.split(",")]):
        if not _inside(hop, proxies):
            return hop
    return remote


class TradingViewFeed(SignalDoor):
    """The TradingView alert source (``[feeds.tradingview]``)."""

    name = "tradingview"
    what = "tradingview"
    section = "feeds.tradingview"
    inbox_file = "tradingview.sqlite3"
    inbox_type = AlertInbox
    config: TradingViewSection

    def __init__(
        self,
        config: TradingViewSection,
        state_dir: Path,
        *,
        audit: AuditSink | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(config, state_dir, audit=audit, clock=clock)
        self.allowed = _networks(config.allowed_ips)
        self.proxies = _networks(config.trusted_proxies)
        self.mapper = TvMapper()
        self.mapped = 0
        self._wake = anyio.Event()
        self._hooks = [
            (hook.id.reveal().encode(), name, hook) for name, hook in config.hooks.items()
        ]

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/tv/{hook_id}", self._handle)

    def expects(self, address: str) -> bool:
        """TradingView's addresses (``allowed_ips``), or a trusted proxy's: the rest
        get few of the door's connections (and a 403 for each request)."""
        if not self.allowed:
            return True
        return _inside(address, self.allowed) or _inside(address, self.proxies)

    def url(self) -> str:
        return f"http://{self.host}:{self.port}/tv/<hook id>"

    def statistics(self) -> dict[str, int]:
        return {**super().statistics(), "mapped": self.mapped}

    async def before_open(self, tg: anyio.abc.TaskGroup) -> None:
        state = await self.run_inbox(self._inbox.mapper_state)
        if state is not None:
            try:
                self.mapper.load(state)
            except (*NOT_JSON, msgspec.ValidationError) as exc:
                log.warning("tradingview positions unreadable; starting flat", error=str(exc))
        # alerts a stop left answered but not mapped: stored now, published with the
        # other unpublished signals when the door opens
        await self._map_stored(publish=False)
        tg.start_soon(self._mapping)

    async def prune(self) -> None:
        before = int((self.clock() - self.config.keep_days * 86400) * 1000)
        await self.run_inbox(self._inbox.prune, 0, before)
        await self.run_inbox(self._inbox.prune_alerts, before)

    # -- the mapper ------------------------------------------------------------------

    async def _mapping(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            await self._map_stored()

    async def _map_stored(self, *, publish: bool = True) -> None:
        """Map every stored alert not mapped yet, in order, and queue its signals."""
        for seq, leader, raw in await self.run_inbox(self._inbox.unmapped):
            events: list[FeedEvent] = []
            kept = self.mapper.dump()
            hook = self.config.hooks.get(leader)
            try:
                alert = _alert_decoder.decode(raw)
                symbol = map_symbol(alert.ticker, hook.symbols if hook else {})
                received = now_ms()
                events = [
                    signal_event(s, SOURCE, received)
                    for s in self.mapper.map(leader, symbol, alert)
                ]
            except (*NOT_JSON, msgspec.ValidationError, ValueError) as exc:
                log.warning("tradingview alert not mapped", leader=leader, error=str(exc))
            try:
                await self.run_inbox(self._inbox.mapped, seq, events, self.mapper.dump(), now_ms())
            except StoreError as exc:
                log.error("tradingview alert mapping not stored", error=str(exc))
                self.mapper.load(kept)
                return  # the alert stays unmapped: mapped again at the next alert or start
            self.mapped += 1
            if not events:
                log.info("tradingview alert changed no position", leader=leader, seq=seq)
            for event in events if publish else ():
                await self.publish_later(event)

    # -- the door ----------------------------------------------------------------------

    def _hook(self, hook_id: str) -> tuple[str, TradingViewHookSection] | None:
        """The leader whose id this is: every configured id is compared, in constant time."""
        given, found = hook_id.encode(), None
        for secret, name, hook in self._hooks:
            if hmac.compare_digest(given, secret):
                found = (name, hook)
        return found

    async def _handle(self, request: web.Request) -> web.Response:
        remote = client_address(
            request.remote or "", request.headers.get("X-Forwarded-For"), self.proxies
        )
        base = {"ts": now_ts(), "agent_id": "-", "source": SOURCE, "remote": remote}
        leader, alert_id = "-", None
        try:
            if self.allowed and not _inside(remote, self.allowed):
                raise SignalRejected(403, f"source address {remote[:64]} is not allowed")
            found = self._hook(request.match_info["hook_id"])
            if found is None:
                raise SignalRejected(404, "unknown hook id")
            leader, hook = found
            body = await self.read_body(request)
            alert = parse_alert(body, request.content_type, hook.passphrase.reveal())
            alert_id = alert.alert_id
            verdict = await self.run_inbox(
                self._inbox.accept_alert, leader, alert_id, msgspec.json.encode(alert), now_ms()
            )
            if verdict == "new":
                self._wake.set()
            return self.answer(
                SignalRecord(
                    **base,
                    leader=leader,
                    signal_id=alert_id,
                    status="accepted" if verdict == "new" else "duplicate",
                    http_status=200,
                )
            )
        except SignalRejected as exc:
            return self.answer(
                SignalRecord(
                    **base,
                    leader=leader,
                    signal_id=alert_id,
                    status="rejected",
                    http_status=exc.status,
                    reason=exc.reason,
                )
            )
