"""Tick to decision, live, on loopback: a Coinbase ticker frame leaves a local WebSocket
server (Coinbase's message format) and the daemon turns it into an audited hook
decision: WebSocket pool, ticker parsing, bus, the agent's state, the sandbox round
trip, settling. Against, in the same run, the feed alone: the same frame until the
tick reaches a bus subscriber.

    .venv/bin/python bench/latency_bench.py [--ticks 2000] [--gap-ms 5]

One agent with one hook on ``market.price.tick`` (it returns IGNORE, which is audited
like any decision). The ticks are ``--gap-ms`` apart, so none is coalesced or queued
behind another: each figure is one tick's own way through an idle daemon. The first
200 ticks warm up (the worker compiles the hook) and are not counted. The decision's
time is when its audit row is handed to the audit writer.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import msgspec
from coinbase_frames import subscriptions_ack, ticker_frame  # bench/: first on sys.path
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from daemon.app import run_daemon
from daemon.audit.records import AuditRecord, HookRecord
from daemon.audit.writer import AuditWriter
from daemon.bus import Subscription
from daemon.config import Config
from daemon.events import MARKET_PRICE_TICK
from daemon.logs import configure
from daemon.service import Service

WARMUP = 200
HOOK = """
def evaluate(event, state):
    return {"decision": "IGNORE", "reason": str(event["payload"]["price"])}
"""


def price(i: int) -> str:
    """A distinct price per tick: how a decision is matched to its frame."""
    return f"{50_000 + i / 100:.2f}"


class Clocks:
    """perf_counter times per price: frame sent, tick on the bus, decision audited."""

    def __init__(self) -> None:
        self.sent: dict[float, float] = {}
        self.on_bus: dict[float, float] = {}
        self.decided: dict[float, float] = {}
        self.want = 0  # decisions to wait for
        self.all_in: anyio.Event | None = None

    def decide(self, p: float) -> None:
        self.decided.setdefault(p, time.perf_counter())
        if self.all_in is not None and len(self.decided) >= self.want:
            self.all_in.set()


class Server:
    """Acks subscriptions; once the ticker channel is subscribed, sends the ticks."""

    def __init__(self, clocks: Clocks, ticks: int, gap: float) -> None:
        self.clocks, self.ticks, self.gap = clocks, ticks, gap
        self.subscribed = anyio.Event()
        self.ws: ServerConnection | None = None
        self.seq = 0

    async def handler(self, ws: ServerConnection) -> None:
        try:
            async for text in ws:
                msg = json.loads(text)
                channel = msg.get("channel")
                self.seq += 1
                await ws.send(subscriptions_ack(self.seq, msg))
                if channel == "ticker" and msg.get("type") == "subscribe":
                    self.ws = ws
                    self.subscribed.set()
        except ConnectionClosed:
            pass

    async def run(self, service: Service) -> None:
        await self.subscribed.wait()
        assert self.ws is not None
        self.clocks.want, self.clocks.all_in = WARMUP + self.ticks, anyio.Event()
        for i in range(WARMUP + self.ticks):
            p = price(i)
            self.seq += 1
            await self.ws.send(ticker_frame(self.seq, "BTC-USD", p))
            if i >= WARMUP:  # on its way: the daemon runs only once this task waits
                self.clocks.sent[float(p)] = time.perf_counter()
            await anyio.sleep(self.gap)
        with anyio.move_on_after(10):
            await self.clocks.all_in.wait()
        service.request_stop()


def measure(ticks: int, gap_ms: float) -> Clocks:
    clocks = Clocks()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        agent = tmp / "agents" / "latency"
        (agent / "hooks").mkdir(parents=True)
        (agent / "agent.toml").write_text('topics = ["market.price.tick"]\n')
        (agent / "hooks" / "wake_tick.py").write_text(HOOK)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        server = Server(clocks, ticks, gap_ms / 1000)

        @asynccontextmanager
        async def driver(service: Service) -> AsyncIterator[None]:
            async with serve(server.handler, sock=sock), anyio.create_task_group() as tg:
                tg.start_soon(server.run, service)
                yield
                tg.cancel_scope.cancel()

        async def bus_reader(sub: Subscription) -> None:
            async for event in sub:
                if event.topic == MARKET_PRICE_TICK and isinstance(event.payload, dict):
                    clocks.on_bus.setdefault(float(event.payload["price"]), time.perf_counter())

        write = AuditWriter.write

        def audited(self: AuditWriter, record: AuditRecord) -> None:
            if isinstance(record, HookRecord) and record.hook_id == "wake_tick":
                clocks.decide(float(record.reason))
            write(self, record)

        config = msgspec.convert(
            {
                "daemon": {"state_dir": str(tmp / "state")},
                "hooks": {"agents_dir": str(tmp / "agents")},
                "feeds": {
                    "coinbase_ws": {
                        "enabled": True,
                        "url": f"ws://127.0.0.1:{port}",
                        "products": ["BTC-USD"],
                    }
                },
            },
            Config,
        )
        AuditWriter.write = audited  # type: ignore[method-assign]
        try:
            run_daemon(config, consumers=[("bench", bus_reader)], components=[driver])
        finally:
            AuditWriter.write = write  # type: ignore[method-assign]
    return clocks


def pct(xs: list[float], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))]


def line(name: str, xs: list[float]) -> str:
    us = [x * 1e6 for x in xs]
    return (
        f"{name:38} p50 {pct(us, 0.5):7.1f} us   p90 {pct(us, 0.9):7.1f}   "
        f"p99 {pct(us, 0.99):7.1f}   mean {statistics.mean(us):7.1f}   (n={len(us)})"
    )


def main(ticks: int, gap_ms: float) -> None:
    configure("console", "error")
    c = measure(ticks, gap_ms)
    both = [p for p in c.sent if p in c.on_bus and p in c.decided]
    if not both:
        sys.exit("no tick reached a decision: is the sandbox available here?")
    feed = [c.on_bus[p] - c.sent[p] for p in both]
    decision = [c.decided[p] - c.sent[p] for p in both]
    after = [c.decided[p] - c.on_bus[p] for p in both]
    print(f"{len(c.sent)} ticks sent {gap_ms:g} ms apart, {len(both)} decided\n")
    print(line("frame -> tick on the bus (baseline)", feed))
    print(line("frame -> hook decision audited", decision))
    print(line("  of which bus -> decision", after))
    ratio = pct(decision, 0.5) / pct(feed, 0.5)
    print(f"\nratio: decision p50 / feed p50 = {ratio:.1f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ticks", type=int, default=2000)
    ap.add_argument("--gap-ms", type=float, default=5.0)
    args = ap.parse_args()
    main(args.ticks, args.gap_ms)
