"""The demo replay through the whole pipeline (bus, state, sandboxed hooks, wake scheduler,
risk, paper broker, audit on), against the same replay with hooks off, in the same run;
then again with scratch stores (``[daemon] durable = false``, as a backtest's), to show
what durability costs.

    .venv/bin/python bench/pipeline_bench.py [--candles 5000]

Also prints the daemon's peak RSS and the peak RSS of its sandbox worker processes
(sampled from /proc every 50 ms while the pipeline runs).
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import threading
import time
from pathlib import Path
from typing import Self

import msgspec
from procs import children, rss_kib  # bench/ is the script's directory, first on sys.path

from daemon.app import run_daemon
from daemon.config import Config
from daemon.logs import configure
from feeds.synthetic import generate_candles

ROOT = Path(__file__).resolve().parent.parent


def config(tmp: Path, csv: Path, hooks: bool, durable: bool = True) -> Config:
    name = ("on" if hooks else "off") + ("" if durable else "-scratch")
    return msgspec.convert(
        {
            "daemon": {"state_dir": str(tmp / name), "durable": durable},
            "hooks": {"enabled": hooks, "agents_dir": str(ROOT / "agents")},
            "feeds": {
                "replay": {
                    "enabled": True,
                    "path": str(csv),
                    "format": "csv",
                    "symbol": "BTC-USD",
                    "timeframe": "1m",
                    "speed": 0.0,
                }
            },
        },
        Config,
    )


class ChildRss:
    """Peak resident set of this process's children (the sandbox workers)."""

    def __init__(self) -> None:
        self.peak_kib: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            for pid in children(os.getpid()):
                kib = rss_kib(pid)
                if kib:
                    self.peak_kib[pid] = max(self.peak_kib.get(pid, 0), kib)


def timed(cfg: Config) -> tuple[float, int]:
    start = time.perf_counter()
    status = run_daemon(cfg)
    return time.perf_counter() - start, status.bus.published


def audit_lines(tmp: Path) -> int:
    return sum(
        len(f.read_bytes().splitlines()) for f in (tmp / "on" / "audit").glob("audit-*.jsonl")
    )


def main(n: int) -> None:
    configure("console", "error")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        csv = tmp / "synthetic.csv"
        generate_candles(csv, seed=7, n=n, timeframe="1m")
        base_s, base_n = timed(config(tmp, csv, hooks=False))
        with ChildRss() as workers:
            full_s, full_n = timed(config(tmp, csv, hooks=True))
        lines = audit_lines(tmp)
        scratch_s, scratch_n = timed(config(tmp, csv, hooks=True, durable=False))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"replay, hooks off: {base_n} events in {base_s:.2f}s = {base_n / base_s:,.0f} ev/s")
    print(
        f"replay, 1 agent x 3 hooks, audit on: {full_n} events in {full_s:.2f}s = "
        f"{full_n / full_s:,.0f} ev/s ({lines} audit lines; ratio {base_s / full_s:.2f})"
    )
    print(
        f"  ... scratch stores ([daemon] durable = false, as a backtest): {scratch_n} events in "
        f"{scratch_s:.2f}s = {scratch_n / scratch_s:,.0f} ev/s (durable/scratch time "
        f"{full_s / scratch_s:.2f})"
    )
    per_worker = ", ".join(f"{k / 1024:.0f}" for k in sorted(workers.peak_kib.values()))
    print(f"daemon peak RSS {rss:.0f} MiB; sandbox workers (agent + spare) {per_worker} MiB")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--candles", type=int, default=5000)
    main(ap.parse_args().candles)
