"""Bus throughput and latency, against a bare asyncio.Queue measured in the same run.

    .venv/bin/python bench/bus_bench.py [--events 200000]

Targets (issue 2): >= 300k events/s to one subscriber; p99 <= 1 ms at 10k events/s.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import anyio

from daemon.bus import Bus
from daemon.events import MARKET_CANDLE_CLOSED, FeedEvent


def make_events(n: int) -> list[FeedEvent]:
    return [
        FeedEvent(
            event_id=f"e{i}",
            ts="2026-01-01T00:00:00.000Z",
            source="bench",
            topic=MARKET_CANDLE_CLOSED,
            payload={"i": i},
            partition_key=f"p{i % 4}",
        )
        for i in range(n)
    ]


async def queue_baseline(events: list[FeedEvent], consumers: int) -> float:
    queues: list[asyncio.Queue[FeedEvent | None]] = [
        asyncio.Queue(maxsize=4096) for _ in range(consumers)
    ]

    async def consume(q: asyncio.Queue[FeedEvent | None]) -> None:
        while await q.get() is not None:
            pass

    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for q in queues:
            tg.start_soon(consume, q)
        for e in events:
            for q in queues:
                await q.put(e)
        for q in queues:
            await q.put(None)
    return len(events) / (time.perf_counter() - start)


async def bus_throughput(events: list[FeedEvent], consumers: int) -> float:
    bus = Bus(queue_size=4096)
    subs = [bus.subscribe(">") for _ in range(consumers)]

    async def consume(sub: object) -> None:
        async for _ in sub:  # type: ignore[attr-defined]
            pass

    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for s in subs:
            tg.start_soon(consume, s)
        for e in events:
            await bus.publish(e)
        bus.close()
    return len(events) / (time.perf_counter() - start)


async def bus_latency(rate: int, seconds: float) -> tuple[float, float, float]:
    bus = Bus(queue_size=4096)
    sub = bus.subscribe(">")
    lat: list[float] = []
    n = int(rate * seconds)
    sent: dict[str, int] = {}

    async def consume() -> None:
        async for e in sub:
            lat.append((time.perf_counter_ns() - sent[e.event_id]) / 1e3)

    events = make_events(n)
    async with anyio.create_task_group() as tg:
        tg.start_soon(consume)
        start = time.perf_counter()
        for i, e in enumerate(events):
            target = start + i / rate
            delay = target - time.perf_counter()
            if delay > 0:
                await anyio.sleep(delay)
            sent[e.event_id] = time.perf_counter_ns()
            await bus.publish(e)
        bus.close()
    q = statistics.quantiles(lat, n=100)
    return q[49], q[98], max(lat)


async def main(n: int) -> None:
    events = make_events(n)
    for consumers in (1, 10):
        m = n if consumers == 1 else n // 5
        base = await queue_baseline(events[:m], consumers)
        ours = await bus_throughput(events[:m], consumers)
        print(
            f"1 publisher -> {consumers:2d} subscriber(s): bus {ours:,.0f} ev/s, "
            f"asyncio.Queue {base:,.0f} ev/s, ratio {ours / base:.2f}"
        )
    p50, p99, worst = await bus_latency(10_000, 3.0)
    print(f"latency at 10k ev/s: p50 {p50:.1f} us, p99 {p99:.1f} us, max {worst:.1f} us")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--events", type=int, default=200_000)
    args = ap.parse_args()
    asyncio.run(main(args.events))
