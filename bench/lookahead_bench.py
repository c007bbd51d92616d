"""The example agent's backtest with lookahead off, then on, in the same run: time,
events/s, the ratio, and whether every audited hook decision is the same.

    .venv/bin/python bench/lookahead_bench.py [--data FILE] [--candles N] [--agent DIR] [--heavy]

Without ``--data`` it runs on generated 5m candles. ``--data`` takes the candle CSVs
the replay feed reads (the shared Binance files too, .csv.gz included); ``--candles``
keeps the first N. ``--heavy`` adds to the agent a hook that computes an RSI 40 times
over its candles (~1 ms a candle in the worker: hooks that cost more than the
dispatcher's own work per event). Each side runs twice, interleaved (off, on, off,
on); the medians are printed.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
from candles import head  # bench/ is the script's directory, first on sys.path

from daemon.app import run_daemon
from daemon.audit.reader import iter_records
from daemon.backtest.run import OUT, BacktestOptions, prepare
from daemon.logs import configure
from feeds.synthetic import generate_candles

ROOT = Path(__file__).resolve().parent.parent
# What differs between two runs of the same data: wall-clock stamps, timings, run ids.
VOLATILE = {"ts", "runtimeMs", "daemonRun"}


HEAVY = """
def rsi(closes):
    gains = losses = 0.0
    for a, b in zip(closes, closes[1:]):
        d = b - a
        if d > 0:
            gains += d
        else:
            losses -= d
    return 100.0 if losses == 0 else 100 - 100 / (1 + gains / losses)


def evaluate(event, state):
    if event["topic"] != "market.candle.closed":
        return {"decision": "IGNORE", "reason": "not a candle"}
    series = state["candles"].get(event.get("symbol"), {}).get(event.get("timeframe"), ())
    closes = [c["close"] for c in series]
    values = [rsi(closes[i:]) for i in range(40)]
    if values and min(values) < 20:
        return {"decision": "WAKE", "reason": "oversold"}
    return {"decision": "IGNORE", "reason": f"rsi {values[-1] if values else 0:.1f}"}
"""


def run(opts: BacktestOptions, lookahead: int) -> tuple[float, list[dict[str, Any]]]:
    with OUT.claim(opts.out):  # as run_backtest holds it
        config = prepare(opts)
        hooks = msgspec.structs.replace(config.hooks, lookahead_events=lookahead)
        config = msgspec.structs.replace(config, hooks=hooks)
        started = time.perf_counter()
        run_daemon(config)
        seconds = time.perf_counter() - started
    rows = [
        {k: v for k, v in r.items() if k not in VOLATILE}
        for r in iter_records(opts.out / "state" / "audit")
        if r.get("type") == "hook"
    ]
    return seconds, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path)
    parser.add_argument("--candles", type=int, default=10_000)
    parser.add_argument("--agent", type=Path, default=ROOT / "agents" / "example")
    parser.add_argument("--symbol", default="BTCUSDT")
    parser.add_argument("--lookahead", type=int, default=16)
    parser.add_argument("--heavy", action="store_true", help="add a ~1 ms hook")
    args = parser.parse_args()
    configure(level="error", fmt="console")
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        if args.heavy:
            agent = tmp / "agents" / f"{args.agent.name}_heavy"
            shutil.copytree(args.agent, agent)
            (agent / "hooks" / "wake_heavy_rsi.py").write_text(HEAVY)
            args.agent = agent
        csv = tmp / "candles.csv"
        if args.data:
            head(args.data, csv, args.candles)
        else:
            generate_candles(csv, seed=7, n=args.candles, timeframe="5m")
        times: dict[int, list[float]] = {0: [], args.lookahead: []}
        rows: dict[int, list[dict[str, Any]]] = {}
        for _ in range(2):
            for lookahead, taken in times.items():
                opts = BacktestOptions(
                    agent_dir=args.agent, data=csv, out=tmp / f"out{lookahead}",
                    symbol=args.symbol, timeframe="5m", state_dir=tmp / "state",
                )  # fmt: skip
                seconds, rows[lookahead] = run(opts, lookahead)
                taken.append(seconds)
        events = len(rows[0]) // max(1, len({r["hookId"] for r in rows[0]}))
        off, on = (statistics.median(taken) for taken in times.values())
        print(f"{events} events, agent {args.agent.name}")
        print(f"lookahead off: {off:6.2f} s  {events / off:8,.0f} events/s")
        print(f"lookahead {args.lookahead:>3}: {on:6.2f} s  {events / on:8,.0f} events/s")
        print(f"ratio on/off: {off / on:.2f}x")
        same = rows[0] == rows[args.lookahead]
        print(f"hook rows: {len(rows[0])}, identical: {same}")
        if not same:
            raise SystemExit("lookahead changed the audited decisions")


if __name__ == "__main__":
    main()
