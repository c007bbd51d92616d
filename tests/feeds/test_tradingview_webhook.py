"""The TradingView receiver on loopback: template alerts in, signals out in order,
every refusal a 4xx with an audit row, and answers fast while the mapper is stuck."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import msgspec
import pytest

from daemon.audit.records import SignalRecord
from daemon.config import decode_hook
from daemon.events import FeedEvent
from feeds.base import FeedHealth
from feeds.config import TRADINGVIEW_IPS, TradingViewSection
from feeds.copytrade import TradingViewFeed
from tests.feeds.tradingview_client import HOOK_ID, alert, post
from tests.loopback import until_closed


def section(**changes: object) -> TradingViewSection:
    raw = {
        "enabled": True,
        "port": 0,
        "allowed_ips": ["127.0.0.1"],
        "hooks": {"tvbot": {"id": HOOK_ID, "symbols": {"BINANCE:BTCUSDT": "BTC-USD"}}},
    } | changes
    return msgspec.convert(raw, TradingViewSection, dec_hook=decode_hook)


class Harness:
    def __init__(self, state_dir: Path, cfg: TradingViewSection) -> None:
        self.events: list[FeedEvent] = []
        self.audit: list[SignalRecord] = []
        self.feed = TradingViewFeed(cfg, state_dir, audit=self.audit.append)
        self.gate = anyio.Event()
        self.gate.set()

    def url(self, hook_id: str = HOOK_ID) -> str:
        return f"http://127.0.0.1:{self.feed.port}/tv/{hook_id}"

    async def publish(self, event: FeedEvent) -> None:
        await self.gate.wait()  # closed: the bus takes nothing, the mapper is stuck
        self.events.append(event)

    async def until(self, n: int) -> None:
        with anyio.fail_after(5):
            while len(self.events) < n:  # noqa: ASYNC110 - polls what was published
                await anyio.sleep(0.02)


@asynccontextmanager
async def running(state_dir: Path, **changes: object) -> AsyncIterator[Harness]:
    h = Harness(state_dir, section(**changes))
    async with anyio.create_task_group() as tg:
        await tg.start(h.feed.run, h.publish, FeedHealth("tradingview"))
        yield h
        tg.cancel_scope.cancel()


def signals(h: Harness) -> list[tuple[str, str, object]]:
    return [(e.topic.rsplit(".", 1)[-1], e.symbol or "", e.payload["quantity"]) for e in h.events]


async def test_a_strategy_entry_add_reversal_and_exit(tmp_path: Path) -> None:
    steps = [
        alert("buy", 1, "long", "flat", "Long", timenow="2026-11-25T12:00:00Z"),
        alert("buy", 0.5, "long", "long", "Long2", timenow="2026-11-25T12:01:00Z"),
        alert("sell", 3.5, "short", "long", "Short", timenow="2026-11-25T12:02:00Z"),
        alert("buy", 2, "flat", "short", "Exit", timenow="2026-11-25T12:03:00Z"),
    ]
    async with running(tmp_path) as h:
        for body in steps:
            status, answer, _ = await post(h.url(), body)
            assert (status, answer["status"]) == (200, "accepted")
        # TradingView delivers the exit twice: the second is a no-op
        status, answer, _ = await post(h.url(), steps[-1])
        assert (status, answer["status"]) == (200, "duplicate")
        await h.until(5)
        await anyio.sleep(0.1)
    assert signals(h) == [
        ("opened", "BTC-USD", 1.0),
        ("modified", "BTC-USD", 1.5),
        ("closed", "BTC-USD", None),
        ("opened", "BTC-USD", 2.0),
        ("closed", "BTC-USD", None),
    ]
    assert {e.partition for e in h.events} == {"copytrade:tvbot"}
    assert all(e.event_id.startswith("copytrade:tvbot:") for e in h.events)
    assert [(r.status, r.http_status, r.leader) for r in h.audit] == [
        ("accepted", 200, "tvbot")
    ] * 4 + [("duplicate", 200, "tvbot")]
    assert h.feed.statistics()["mapped"] == 4


async def test_each_bad_request_is_a_4xx_with_an_audit_row_and_no_event(tmp_path: Path) -> None:
    async with running(tmp_path, trusted_proxies=["127.0.0.1"]) as h:
        bad = [
            (h.url("x" * 40), alert(), {}, "application/json", 404),
            (h.url(), b"buy BTCUSDT", {}, "text/plain", 415),
            (h.url(), b"{not json", {}, "application/json", 400),
            (h.url(), alert(action="{{strategy.order.action}}"), {}, "application/json", 422),
            (h.url(), b"x" * 20_000, {}, "application/json", 413),
            # through the proxy, from an address TradingView does not send from
            (h.url(), alert(), {"X-Forwarded-For": "6.6.6.6"}, "application/json", 403),
        ]
        for url, body, headers, content_type, want in bad:
            status, answer, _ = await post(url, body, content_type=content_type, headers=headers)
            assert status == want, (want, answer)
            assert answer["status"] == "rejected" and answer["reason"]
        # through the proxy from TradingView's address: accepted
        forwarded = {"X-Forwarded-For": TRADINGVIEW_IPS[0]}
        assert (await post(h.url(), alert(), headers=forwarded))[0] == 403  # not in our list
        await anyio.sleep(0.1)
    assert h.events == []
    rows = [(r.http_status, r.leader, r.remote) for r in h.audit]
    assert [r[0] for r in rows] == [404, 415, 400, 422, 413, 403, 403]
    assert rows[0][1] == "-" and rows[1][1] == "tvbot" and rows[5][2] == "6.6.6.6"
    assert all(
        HOOK_ID not in (r.reason or "") and "x" * 40 not in (r.reason or "") for r in h.audit
    )


async def test_the_default_allowlist_is_tradingviews(tmp_path: Path) -> None:
    cfg = section(allowed_ips=list(TRADINGVIEW_IPS), trusted_proxies=["127.0.0.1"])
    assert section().allowed_ips == ["127.0.0.1"]
    assert TradingViewSection().allowed_ips == list(TRADINGVIEW_IPS)
    h = Harness(tmp_path, cfg)
    async with anyio.create_task_group() as tg:
        await tg.start(h.feed.run, h.publish, FeedHealth("tradingview"))
        direct = await post(h.url(), alert())
        proxied = await post(h.url(), alert(), headers={"X-Forwarded-For": TRADINGVIEW_IPS[2]})
        tg.cancel_scope.cancel()
    assert direct[0] == 403 and proxied[0] == 200


async def test_answers_stay_fast_while_the_mapper_is_stuck_and_nothing_is_lost(
    tmp_path: Path,
) -> None:
    """The bus takes nothing (the mapper and publisher are blocked): 40 alerts at
    once are each answered well inside TradingView's 3 s; a stop then, and the
    next start maps and publishes every one, in order."""
    bodies = [
        alert("buy", 1, "long", "flat" if i == 0 else "long", f"L{i}",
              timenow=f"2026-11-25T12:{i // 60:02d}:{i % 60:02d}Z")
        for i in range(40)
    ]  # fmt: skip
    async with running(tmp_path) as h:
        h.gate = anyio.Event()  # closed
        answers: list[tuple[int, float]] = []

        async def send(body: bytes) -> None:
            status, _, took = await post(h.url(), body)
            answers.append((status, took))

        await send(bodies[0])  # the entry, then 39 adds at once (in any order)
        async with anyio.create_task_group() as tg:
            for body in bodies[1:]:
                tg.start_soon(send, body)
        assert [s for s, _ in answers] == [200] * 40
        slowest = max(t for _, t in answers)
        assert slowest < 3.0, slowest
        assert h.events == []
    again = Harness(tmp_path, section())
    async with anyio.create_task_group() as tg:
        await tg.start(again.feed.run, again.publish, FeedHealth("tradingview"))
        await again.until(40)
        tg.cancel_scope.cancel()
    kinds = [e.topic.rsplit(".", 1)[-1] for e in again.events]
    assert kinds == ["opened"] + ["modified"] * 39
    sizes = [e.payload["quantity"] for e in again.events]
    assert sizes == [float(i + 1) for i in range(40)]  # mapped and published in arrival order


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"hooks": {"a": {"id": "short"}}}, "at least 24"),
        ({"allowed_ips": ["tradingview.com"]}, "not an IP address"),
        ({"hooks": {"a": {"id": HOOK_ID}, "b": {"id": HOOK_ID}}}, "share an id"),
        ({"hooks": {}}, "no [feeds.tradingview.hooks"),
    ],
)
def test_bad_config_is_refused(changes: dict[str, object], message: str) -> None:
    with pytest.raises(msgspec.ValidationError, match=message.replace("[", r"\[")):
        section(**changes)


async def test_a_flood_from_elsewhere_never_turns_tradingview_away(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Connections from addresses outside allowed_ips get at most MAX_STRANGERS of the
    door's places (503 past them, before a byte is read), so TradingView's own still
    get in. Here 127.0.0.2 plays TradingView and 127.0.0.1 the flood."""
    from feeds.copytrade import door

    monkeypatch.setattr(door, "MAX_STRANGERS", 2)
    monkeypatch.setattr(door, "MAX_CONNECTIONS", 4)
    async with running(tmp_path, allowed_ips=["127.0.0.2"]) as h:
        port = h.feed.port

        async def answer(local: str) -> bytes:
            stream = await anyio.connect_tcp("127.0.0.1", port, local_host=local)
            await stream.send(b"GET /tv/nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            got = await until_closed(stream)
            await stream.aclose()
            return got

        flood = [await anyio.connect_tcp("127.0.0.1", port) for _ in range(2)]
        await anyio.sleep(0.1)
        assert (await answer("127.0.0.1")).startswith(b"HTTP/1.1 503 ")  # a third stranger
        assert (await answer("127.0.0.2")).startswith(b"HTTP/1.1 405 ")  # served (GET: 405)
        for stream in flood:
            await stream.aclose()
        await anyio.sleep(0.1)
        assert (await answer("127.0.0.1")).startswith(b"HTTP/1.1 405 ")  # room again
