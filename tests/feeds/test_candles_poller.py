"""The candles poller against a loopback aiohttp server that speaks like Coinbase.

The fake serves ``/time`` (all fields strings) and
``/market/products/{id}/candles`` (newest first, string numbers, the forming
bucket included, ``end`` inclusive, >350 buckets rejected with Coinbase's
error shape). Its clock only moves when a test moves it.
"""

from __future__ import annotations

import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, BinaryIO

import anyio
import pytest
from aiohttp import web

from daemon.events import MARKET_CANDLE_CLOSED, MARKET_CANDLE_UPDATED, FeedEvent, iso_ms
from feeds.base import FeedHealth
from feeds.candles.poller import CandlesFeed
from feeds.candles.protocol import GRANULARITY
from feeds.config import CandlesSection
from tests.loopback import serve_app

ENUM_SECONDS = {
    "ONE_MINUTE": 60,
    "FIVE_MINUTE": 300,
    "FIFTEEN_MINUTE": 900,
    "THIRTY_MINUTE": 1800,
    "ONE_HOUR": 3600,
    "TWO_HOUR": 7200,
    "FOUR_HOUR": 14400,
    "SIX_HOUR": 21600,
    "ONE_DAY": 86400,
}
T0 = 1_775_520_000_000  # 2026-04-07T00:00:00Z, a day boundary
M5 = 300_000


class FakeCoinbase:
    """Coinbase's public candles API on loopback with a hand-driven clock."""

    def __init__(self) -> None:
        self.now_ms = T0
        self.advance_per_time_ms = 0  # move the clock on each /time call
        self.omit: set[int] = set()  # bucket starts with "no trades"
        self.extra_before = 0  # also return this many older buckets (sloppy window)
        self.faults: list[tuple[str, str]] = []  # (kind, arg) applied to candle requests
        self.time_faults: list[str] = []
        self.spans: list[int] = []  # buckets asked for per candles request
        self.requests = 0
        self.products = {"BTC-USD", "ETH-USD"}

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/api/v3/brokerage/time", self.time)
        app.router.add_get("/api/v3/brokerage/market/products/{product}/candles", self.candles)
        return app

    async def time(self, request: web.Request) -> web.Response:
        self.requests += 1
        if self.time_faults:
            return web.Response(body=b"<html>bad gateway", status=200)
        self.now_ms += self.advance_per_time_ms
        s = self.now_ms // 1000
        body = {"iso": iso_ms(self.now_ms), "epochSeconds": str(s), "epochMillis": str(self.now_ms)}
        return web.json_response(body)

    async def candles(self, request: web.Request) -> web.Response:
        self.requests += 1
        if self.faults:
            return self._fault(*self.faults.pop(0))
        if request.match_info["product"] not in self.products:
            product = request.match_info["product"]
            return _error(404, "NOT_FOUND", f"Product {product} not supported")
        q = request.query
        gran = ENUM_SECONDS.get(q.get("granularity", ""))
        if gran is None or "start" not in q or "end" not in q:
            return _error(400, "INVALID_ARGUMENT", "granularity, start and end are required")
        start, end, g = int(q["start"]) * 1000, int(q["end"]) * 1000, gran * 1000
        self.spans.append((end - start) // g)
        if (end - start) // g >= 350:
            return _error(
                400, "INVALID_ARGUMENT", "number of candles requested should be less than 350"
            )
        first = (start // g - self.extra_before) * g
        rows = [self._row(b, g) for b in range(first, end + 1, g) if b <= self.now_ms]
        rows = [r for r in rows if r is not None]
        return web.json_response({"candles": rows[::-1]})

    def _row(self, start: int, g: int) -> dict[str, str] | None:
        if start in self.omit:
            return None
        base = 100 + (start // g) % 37
        forming = start + g > self.now_ms
        close = base + (self.now_ms - start) / g if forming else base + 0.5
        return {
            "start": str(start // 1000),
            "low": f"{min(base, close) - 1:.2f}",
            "high": f"{max(base, close) + 1:.2f}",
            "open": f"{base:.2f}",
            "close": f"{close:.2f}",
            "volume": "12.50000000",
        }

    def _fault(self, kind: str, arg: str) -> web.Response:
        if kind == "status":
            headers = {"Retry-After": "1"} if arg == "429" else {}
            return _error(int(arg), "RATE_LIMITED" if arg == "429" else "INTERNAL", arg, headers)
        if kind == "malformed":
            return web.Response(body=b"not json at all", content_type="application/json")
        if kind == "huge":
            return web.json_response({"candles": [], "pad": "x" * 4096})
        if kind == "short":
            return web.Response(
                body=b'{"candles": [{"start": "17755', content_type="application/json"
            )
        return web.json_response({"candles": [{"start": "x", "low": "1"}]})


def _error(
    status: int, code: str, detail: str, headers: dict[str, str] | None = None
) -> web.Response:
    body = {"error": code, "error_details": detail, "message": detail}
    return web.json_response(body, status=status, headers=headers)


@pytest.fixture
async def exchange() -> AsyncIterator[tuple[FakeCoinbase, str]]:
    fake = FakeCoinbase()
    async with serve_app(fake.app()) as url:
        yield fake, f"{url}/api/v3/brokerage"


def make_feed(base_url: str, state: Path, **cfg: Any) -> CandlesFeed:
    section = CandlesSection(
        enabled=True,
        base_url=base_url,
        products=cfg.pop("products", ["BTC-USD"]),
        timeframes=cfg.pop("timeframes", ["5m"]),
        **cfg,
    )
    return CandlesFeed(section, state, backoff_initial=0.01, min_request_interval=0.0)


class Sink:
    """A publish target that records events (no checkpoint inside publish)."""

    def __init__(self) -> None:
        self.events: list[FeedEvent] = []
        self.target = 0
        self.reached = anyio.Event()

    async def __call__(self, event: FeedEvent) -> None:
        self.events.append(event)
        if self.target and len(self.closed) >= self.target:
            self.reached.set()

    @property
    def closed(self) -> list[int]:
        return [e.payload["closeTimeMs"] for e in self.events if e.topic == MARKET_CANDLE_CLOSED]


async def test_overlapping_polls_emit_each_close_once(
    exchange: tuple[FakeCoinbase, str], tmp_path: Path
) -> None:
    """Polls every 40 s, with a server that returns extra older buckets, give each close once."""
    fake, url = exchange
    fake.extra_before = 4
    fake.now_ms = T0 + 10_000
    sink, health = Sink(), FeedHealth("candles")
    async with make_feed(url, tmp_path).open() as feed:
        for _ in range(60):
            await feed.poll_once(sink, health)
            fake.now_ms += 40_000
    last_settled = (fake.now_ms - 40_000 - 2_000) // M5 * M5
    assert sink.closed == list(range(T0, last_settled + 1, M5))
    assert len({e.event_id for e in sink.events}) == len(sink.events)
    assert health.errors == 0
    stats = feed.statistics()
    assert stats["polls"] == 60 and stats["closes_published"] == len(sink.closed)
    assert stats["last_poll_ok"] is True
    ev = sink.events[0]
    assert ev.event_id == f"coinbase:BTC-USD:5m:{T0}" and ev.ts == iso_ms(T0)
    assert ev.partition_key == "coinbase:BTC-USD:5m" and ev.symbol == "BTC-USD"
    assert ev.payload["openTimeMs"] == T0 - M5 and ev.payload["close"] == pytest.approx(
        100 + 0.5 + (T0 // M5 - 1) % 37
    )


async def test_forming_candle_is_never_closed_and_updates_are_deduped(
    exchange: tuple[FakeCoinbase, str], tmp_path: Path
) -> None:
    """Mid-bucket: the previous candle closes, the forming one only appears as updated."""
    fake, url = exchange
    fake.now_ms = T0 + 100_000
    sink, health = Sink(), FeedHealth("candles")
    async with make_feed(url, tmp_path, emit_updated=True).open() as feed:
        await feed.poll_once(sink, health)
        await feed.poll_once(sink, health)  # same clock: same forming values, no new update
        fake.now_ms += 30_000
        await feed.poll_once(sink, health)
    assert sink.closed == [T0]
    updates = [e for e in sink.events if e.topic == MARKET_CANDLE_UPDATED]
    assert [u.payload["closeTimeMs"] for u in updates] == [T0 + M5, T0 + M5]
    assert updates[0].payload["close"] != updates[1].payload["close"]
    assert all(
        e.payload["closeTimeMs"] <= fake.now_ms
        for e in sink.events
        if e.topic == MARKET_CANDLE_CLOSED
    )


async def test_close_waits_for_settle_margin_on_server_clock(
    exchange: tuple[FakeCoinbase, str], tmp_path: Path
) -> None:
    """A candle 1 s past its close is not final yet; 3 s past it is (server time, not local)."""
    fake, url = exchange
    fake.now_ms = T0 + 10_000
    sink, health = Sink(), FeedHealth("candles")
    async with make_feed(url, tmp_path).open() as feed:
        await feed.poll_once(sink, health)
        fake.now_ms = T0 + M5 + 1_000
        await feed.poll_once(sink, health)
        assert sink.closed == [T0]
        fake.now_ms = T0 + M5 + 3_000
        await feed.poll_once(sink, health)
        assert (
            feed.offset_ms is not None
            and abs(feed.offset_ms - (fake.now_ms - time.time() * 1000)) < 5_000
        )
    assert sink.closed == [T0, T0 + M5]


async def test_cancel_mid_run_then_restart_backfills_gap_in_order(
    exchange: tuple[FakeCoinbase, str], tmp_path: Path
) -> None:
    """Kill the running feed, stay down 8 h, restart: every missed 1m close once, in order."""
    fake, url = exchange
    fake.now_ms = T0 + 5_000
    fake.advance_per_time_ms = 45_000
    m1 = 60_000
    sink = Sink()
    sink.target = 6
    feed = make_feed(url, tmp_path, timeframes=["1m"], poll_seconds=0.001)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(feed.run, sink, FeedHealth("candles"))
            await sink.reached.wait()
            tg.cancel_scope.cancel()
    before = list(sink.closed)
    fake.advance_per_time_ms = 0
    fake.now_ms += 8 * 3_600_000
    fake.omit = {before[-1] + 10 * m1}  # an empty bucket in the gap is not invented
    restarted = make_feed(url, tmp_path, timeframes=["1m"])
    async with restarted.open() as feed2:
        await feed2.poll_once(sink, FeedHealth("candles"))
    settled_last = (fake.now_ms - 2_000) // m1 * m1
    expected = [c for c in range(before[0], settled_last + 1, m1) if c - m1 not in fake.omit]
    assert sink.closed == expected
    assert len(sink.closed) - len(before) > 300  # needed more than one page
    assert max(fake.spans) <= 300


async def test_backfill_is_capped_by_max_backfill(
    exchange: tuple[FakeCoinbase, str], tmp_path: Path
) -> None:
    """After a long outage only the newest max_backfill closes are emitted, oldest first."""
    fake, url = exchange
    fake.now_ms = T0 + 10_000
    sink = Sink()
    async with make_feed(url, tmp_path, max_backfill=10).open() as feed:
        await feed.poll_once(sink, FeedHealth("candles"))
        fake.now_ms += 50 * M5
        await feed.poll_once(sink, FeedHealth("candles"))
    assert sink.closed == [T0, *range(T0 + 41 * M5, T0 + 51 * M5, M5)]


async def test_429_backs_off_honouring_retry_after_then_succeeds(
    exchange: tuple[FakeCoinbase, str], tmp_path: Path
) -> None:
    """A 429 with Retry-After: 1 is retried no sooner than a second later, then closes flow."""
    fake, url = exchange
    fake.now_ms = T0 + 10_000
    fake.faults = [("status", "429")]
    sink, health = Sink(), FeedHealth("candles")
    async with make_feed(url, tmp_path).open() as feed:
        started = time.monotonic()
        await feed.poll_once(sink, health)
        elapsed = time.monotonic() - started
    assert elapsed >= 0.95
    assert sink.closed == [T0]
    assert health.errors == 1


@pytest.mark.parametrize("fault", [("status", "503"), ("huge", "")])
async def test_5xx_retries_with_backoff_and_gives_up_without_crashing(
    exchange: tuple[FakeCoinbase, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fault: tuple[str, str],
) -> None:
    """Four 503s, or four answers past MAX_REST_BYTES (here 1 KiB: such a body is not
    read further), exhaust one poll's attempts (recorded); the next poll recovers."""
    from feeds.candles import poller

    monkeypatch.setattr(poller, "MAX_REST_BYTES", 1024)
    fake, url = exchange
    fake.now_ms = T0 + 10_000
    fake.faults = [fault] * 4
    sink, health = Sink(), FeedHealth("candles")
    async with make_feed(url, tmp_path).open() as feed:
        assert await feed.poll_once(sink, health) == 0
        assert health.errors == 4
        assert await feed.poll_once(sink, health) == 1
    assert sink.closed == [T0]


@pytest.mark.parametrize("kind", ["malformed", "short", "bad_candle"])
async def test_bad_bodies_are_recorded_errors_and_feed_keeps_going(
    exchange: tuple[FakeCoinbase, str], tmp_path: Path, kind: str
) -> None:
    """Non-JSON, truncated JSON or a broken candle: one recorded error, no close, next poll fine."""
    fake, url = exchange
    fake.now_ms = T0 + 10_000
    fake.faults = [(kind, "")]
    sink, health = Sink(), FeedHealth("candles")
    async with make_feed(url, tmp_path).open() as feed:
        assert await feed.poll_once(sink, health) == 0
        assert health.errors == 1
        assert await feed.poll_once(sink, health) == 1
    assert sink.closed == [T0]


async def test_without_server_time_nothing_is_emitted(
    exchange: tuple[FakeCoinbase, str], tmp_path: Path
) -> None:
    """No /time answer ever: the poller refuses to judge closes by the bare local clock."""
    fake, url = exchange
    fake.now_ms = T0 + 10_000
    fake.time_faults = ["html"]
    sink, health = Sink(), FeedHealth("candles")
    async with make_feed(url, tmp_path).open() as feed:
        assert await feed.poll_once(sink, health) == 0
    assert health.errors == 1 and sink.events == []


async def test_products_and_timeframes_are_independent_series(
    exchange: tuple[FakeCoinbase, str], tmp_path: Path
) -> None:
    """Each (product, timeframe) has its own mark, partitionKey and granularity."""
    fake, url = exchange
    fake.now_ms = T0 + 3_600_000 + 10_000
    sink = Sink()
    feed = make_feed(url, tmp_path, products=["BTC-USD", "ETH-USD"], timeframes=["5m", "1h"])
    async with feed.open():
        await feed.poll_once(sink, FeedHealth("candles"))
    keys = sorted((e.partition_key, e.payload["closeTimeMs"]) for e in sink.events)
    assert keys == [
        ("coinbase:BTC-USD:1h", T0 + 3_600_000),
        ("coinbase:BTC-USD:5m", T0 + 3_600_000),
        ("coinbase:ETH-USD:1h", T0 + 3_600_000),
        ("coinbase:ETH-USD:5m", T0 + 3_600_000),
    ]
    assert set(GRANULARITY) == {"1m", "5m", "15m", "30m", "1h", "2h", "4h", "6h", "1d"}


CHILD = """
import sys
from pathlib import Path

import anyio
import structlog

structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))

from feeds.config import CandlesSection
from daemon.events import encode
from feeds.base import FeedHealth
from feeds.candles.poller import CandlesFeed


async def publish(event):
    sys.stdout.buffer.write(encode(event) + b"\\n")
    sys.stdout.buffer.flush()


async def main():
    section = CandlesSection(
        enabled=True, base_url=sys.argv[1], products=["BTC-USD"], timeframes=["1m"],
        poll_seconds=0.001,
    )
    feed = CandlesFeed(section, Path(sys.argv[2]), min_request_interval=0.0)
    await feed.run(publish, FeedHealth("candles"))


anyio.run(main)
"""


ROOT = Path(__file__).resolve().parents[2]


def write_child(tmp_path: Path) -> tuple[Path, BinaryIO]:
    """The child script, and a file for its log lines (read them when this test fails)."""
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    return script, (tmp_path / "child.err").open("wb")


async def test_sigkill_mid_run_then_restart_emits_each_close_once(
    exchange: tuple[FakeCoinbase, str], tmp_path: Path
) -> None:
    """SIGKILL the poller process mid-run; a restart from its SQLite file resumes after the mark.

    The only duplicate allowed is the documented one: the very last close the
    killed process published, if the kill landed between publish and commit,
    and it then carries the same eventId.
    """
    import signal
    import subprocess
    import sys

    from daemon.events import decode

    fake, url = exchange
    fake.now_ms = T0 + 5_000
    fake.advance_per_time_ms = 20_000
    script, err = write_child(tmp_path)
    with anyio.fail_after(20), err:
        async with await anyio.open_process(
            [sys.executable, str(script), url, str(tmp_path)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=err,
        ) as proc:
            assert proc.stdout is not None
            buffer = b""
            async for chunk in proc.stdout:
                buffer += chunk
                if buffer.count(b"\n") >= 8 and proc.returncode is None:
                    proc.send_signal(signal.SIGKILL)
            await proc.wait()
            assert proc.returncode == -signal.SIGKILL
    lines = [line for line in buffer.split(b"\n") if line]
    before = [decode(line) for line in lines]
    fake.advance_per_time_ms = 0
    fake.now_ms += 30 * 60_000
    sink = Sink()
    async with make_feed(url, tmp_path, timeframes=["1m"]).open() as feed:
        await feed.poll_once(sink, FeedHealth("candles"))
    after = sink.events
    if after and after[0].event_id == before[-1].event_id:
        after = after[1:]  # killed between publish and commit: same id, deduped downstream
    ids = [e.event_id for e in before + after]
    closes = [e.payload["closeTimeMs"] for e in before + after]
    assert len(set(ids)) == len(ids)
    settled_last = (fake.now_ms - 2_000) // 60_000 * 60_000
    assert closes == list(range(closes[0], settled_last + 1, 60_000))
    assert len(before) >= 8 and len(after) >= 30


async def test_next_poll_comes_early_when_a_close_settles_sooner(
    exchange: tuple[FakeCoinbase, str], tmp_path: Path
) -> None:
    """1h candles poll every 300 s, but 10 s before a close the next poll is due at close + 2 s."""
    fake, url = exchange
    feed = make_feed(url, tmp_path, timeframes=["1h"])
    assert feed.next_sleep() == feed.poll_seconds == 300.0  # no server time yet
    fake.now_ms = T0 + 3_600_000 - 10_000
    async with feed.open():
        await feed.poll_once(Sink(), FeedHealth("candles"))
    assert 11.0 <= feed.next_sleep() <= 12.0
    fake.now_ms = T0 + 1_000_000
    async with feed.open():
        await feed.poll_once(Sink(), FeedHealth("candles"))
    assert feed.next_sleep() == 300.0


async def test_unknown_product_is_not_retried_and_others_still_flow(
    exchange: tuple[FakeCoinbase, str], tmp_path: Path
) -> None:
    """A 404 for one product is one recorded error per poll; the other product's closes flow."""
    fake, url = exchange
    fake.now_ms = T0 + 10_000
    sink, health = Sink(), FeedHealth("candles")
    async with make_feed(url, tmp_path, products=["NOPE-USD", "BTC-USD"]).open() as feed:
        requests = fake.requests
        assert await feed.poll_once(sink, health) == 1
        assert fake.requests - requests == 3  # /time, one 404, one good
        assert not feed.last_poll_ok
    assert health.errors == 1
    assert [e.symbol for e in sink.events] == ["BTC-USD"]


async def test_unreachable_exchange_is_recorded_not_raised(tmp_path: Path) -> None:
    """Connection refused on every attempt: errors are counted, poll_once returns 0."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again before the poll: nothing listens
    health = FeedHealth("candles")
    async with make_feed(f"http://127.0.0.1:{port}", tmp_path).open() as feed:
        assert await feed.poll_once(Sink(), health) == 0
    assert health.errors == 4  # every attempt of /time


async def test_closes_after_the_agents_marks_are_delivered_again(
    exchange: tuple[FakeCoinbase, str], tmp_path: Path
) -> None:
    """The poller's mark says what reached the bus; at start the agents' older mark wins,
    so closes a crash kept from the agents come again (same event ids), then new ones."""
    fake, url = exchange
    fake.now_ms = T0 + 10_000
    first = Sink()
    async with make_feed(url, tmp_path).open() as feed:
        for _ in range(4):
            await feed.poll_once(first, FeedHealth("candles"))
            fake.now_ms += M5
    assert len(first.closed) == 4
    again = Sink()
    restarted = make_feed(url, tmp_path)
    restarted.resume_after({"coinbase:BTC-USD:5m": first.closed[1]})
    async with restarted.open() as feed2:
        await feed2.poll_once(again, FeedHealth("candles"))
        await feed2.poll_once(again, FeedHealth("candles"))  # the store's mark again
    assert again.closed[:2] == first.closed[2:]
    assert [e.event_id for e in again.events[:2]] == [e.event_id for e in first.events[2:]]
    assert again.closed == sorted(set(again.closed)), "each close once, in order"
    assert restarted.statistics()["redelivered_series"] == 1
