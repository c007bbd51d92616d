"""AuditWriter cost on the event loop, against a plain synchronous JSONL write.

    .venv/bin/python bench/audit_bench.py [--records 200000]

Baseline (same run): encode each record and write+flush it to an open file in
the event-loop thread, as a naive logger would. Figures:

1. loop-thread cost per record (what the dispatcher pays per audit line);
2. end-to-end records/s until everything is on disk (writer closed);
3. the worst event-loop stall a 1 ms ticker sees while a paced producer writes
   20 000 records/s for one second (what other tasks feel).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import anyio

from daemon.audit.records import HookRecord, encode_line
from daemon.audit.writer import open_audit


def make(n: int) -> list[HookRecord]:
    return [
        HookRecord(
            ts="2026-02-17T03:05:00.000Z",
            agent_id=f"agent{i % 10}",
            hook_id=f"wake_h{i % 5}",
            revision="0123456789abcdef",
            kind="wake",
            event_id=f"coinbase:ETH-USD:5m:{i}",
            topic="market.candle.closed",
            symbol="ETH-USD",
            decision="IGNORE",
            reason="one green candle",
            runtime_ms=0.08,
            trace_id=f"{i:016x}",
        )
        for i in range(n)
    ]


def baseline_sink(path: Path) -> tuple[Callable[[HookRecord], None], Callable[[], None]]:
    fh = path.open("ab")

    def write(rec: HookRecord) -> None:
        fh.write(encode_line(rec))
        fh.flush()

    return write, fh.close


async def end_to_end(records: list[HookRecord], tmp: Path) -> tuple[float, float, float, float]:
    write, close = baseline_sink(tmp / "baseline.jsonl")
    t0 = time.perf_counter()
    for rec in records:
        write(rec)
    close()
    base_total = time.perf_counter() - t0
    t0 = time.perf_counter()
    loop_time = 0.0
    async with open_audit(tmp / "audit") as audit:
        for i in range(0, len(records), 1000):
            s = time.perf_counter()
            for rec in records[i : i + 1000]:
                audit.write(rec)
            loop_time += time.perf_counter() - s
            await anyio.lowlevel.checkpoint()
    total = time.perf_counter() - t0
    n = len(records)
    return base_total / n * 1e9, loop_time / n * 1e9, n / base_total, n / total


async def paced_stall(records: list[HookRecord], write: Callable[[HookRecord], None]) -> float:
    stalls: list[float] = []
    done = anyio.Event()

    async def ticker() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await anyio.sleep(0.001)
            now = time.perf_counter()
            stalls.append(now - last)
            last = now

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        for i in range(0, min(len(records), 20_000), 20):
            for rec in records[i : i + 20]:
                write(rec)
            await anyio.sleep(0.001)
        done.set()
    return max(stalls) * 1000


async def main(n: int) -> None:
    records = make(n)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        base_ns, writer_ns, base_rate, writer_rate = await end_to_end(records, tmp)
        write, close = baseline_sink(tmp / "paced.jsonl")
        base_stall = await paced_stall(records, write)
        close()
        async with open_audit(tmp / "paced") as audit:
            writer_stall = await paced_stall(records, audit.write)
    print(f"records: {n}")
    print(
        f"loop-thread cost per record: baseline {base_ns:,.0f} ns, AuditWriter.write {writer_ns:,.0f} ns "
        f"(ratio {base_ns / writer_ns:.2f}x cheaper)"
    )
    print(
        f"end to end: baseline {base_rate:,.0f} records/s, AuditWriter {writer_rate:,.0f} records/s "
        f"(ratio {writer_rate / base_rate:.2f})"
    )
    print(
        f"max loop stall at 20k records/s: baseline {base_stall:.2f} ms, AuditWriter {writer_stall:.2f} ms"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=200_000)
    anyio.run(main, parser.parse_args().records)
