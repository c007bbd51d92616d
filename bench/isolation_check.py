"""Real-data check: the example agent trades the same alone and beside another agent.

    .venv/bin/python bench/isolation_check.py [--rows 30000] [--data FILE]

Replays the first ``--rows`` real BTCUSDT 5m candles (``../shared/data``, not part of
the repo) at speed 0 three times: ``agents/example`` alone, then beside a quick
wake-only agent, twice. Prints the example agent's risk verdicts and order states for
each run, whether they are identical, the wall time of each run (the alone run is
the baseline), and when each agent had evaluated its last candle: past its queue a
slower agent's events wait on disk, so the other finishes at its own pace.
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec

from daemon.app import run_daemon
from daemon.audit.reader import iter_records
from daemon.config import Config
from daemon.events import now_ms, parse_iso_ms
from daemon.logs import configure

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data" / "normalized" / "binance_spot_BTCUSDT_5m.csv.gz"
WAKER = """
def evaluate(event, state):
    return {"decision": "WAKE", "reason": "quick", "dedupeKey": "w:" + event["eventId"]}
"""


LOOKAHEAD = [16]  # [hooks] lookahead_events, from --lookahead


def head(src: Path, dst: Path, rows: int) -> int:
    """The header and the first ``rows`` rows of a gzipped CSV; how many rows."""
    n = 0
    with gzip.open(src, "rt", encoding="utf-8") as fin, dst.open("w", encoding="utf-8") as out:
        for n, line in enumerate(fin):
            if n > rows:
                break
            out.write(line)
    return min(n, rows)


def run(
    root: Path, csv: Path, neighbour: bool
) -> tuple[list[tuple[Any, ...]], float, dict[str, float]]:
    agents = root / "agents"
    shutil.copytree(ROOT / "agents" / "example", agents / "example")
    if neighbour:
        (agents / "quick" / "hooks").mkdir(parents=True)
        (agents / "quick" / "hooks" / "wake_quick.py").write_text(WAKER)
    cfg = msgspec.convert(
        {
            "daemon": {"state_dir": str(root / "state")},
            "hooks": {"agents_dir": str(agents), "reload_seconds": 3600,
                      "lookahead_events": LOOKAHEAD[0]},
            "feeds": {
                "replay": {"enabled": True, "path": str(csv), "symbol": "BTCUSDT",
                           "timeframe": "5m", "speed": 0}
            },
        },
        Config,
    )  # fmt: skip
    started, wall = time.perf_counter(), now_ms()
    run_daemon(cfg)
    elapsed = time.perf_counter() - started
    rows = []
    finished: dict[str, float] = {}  # seconds from the start to the agent's last hook row
    for r in iter_records(root / "state" / "audit"):
        if r.get("type") == "hook":
            finished[str(r["agentId"])] = (parse_iso_ms(str(r["ts"])) - wall) / 1000
        if r.get("agentId") == "example" and r.get("type") in ("risk", "order"):
            codes = tuple(x["code"] for x in r.get("reasons") or ())
            rows.append(
                (r["type"], r.get("eventId"), r.get("approved"), codes, r.get("clientOrderId"),
                 r.get("status"), r.get("role"), r.get("price"))
            )  # fmt: skip
    return rows, elapsed, finished


def summary(rows: list[tuple[Any, ...]]) -> str:
    c: Counter[str] = Counter()
    for r in rows:
        if r[0] == "risk":
            c["approved" if r[2] else "rejected"] += 1
            for code in r[3]:
                c[f"  {code}"] += 1
        else:
            c[f"order {r[5]}"] += 1
    return ", ".join(f"{k.strip()} {v}" for k, v in sorted(c.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=30_000)
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--lookahead", type=int, default=16, help="[hooks] lookahead_events")
    args = ap.parse_args()
    LOOKAHEAD[0] = args.lookahead
    if not args.data.exists():
        raise SystemExit(f"{args.data} not found: this check needs ../shared/data")
    configure("console", "warning")
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        csv = base / "btc_5m.csv"
        head(args.data, csv, args.rows)
        alone, t0, _ = run(base / "alone", csv, neighbour=False)
        beside, t1, done1 = run(base / "beside", csv, neighbour=True)
        again, t2, done2 = run(base / "again", csv, neighbour=True)
    print(f"first {args.rows} rows of {args.data.name}, speed 0")
    print(f"example alone:            {summary(alone)}  ({t0:.1f}s, baseline)")
    print(f"beside a wake-only agent: {summary(beside)}  ({t1:.1f}s, ratio {t1 / t0:.2f})")
    print(f"again:                    {summary(again)}  ({t2:.1f}s, ratio {t2 / t0:.2f})")
    for label, done in (("beside", done1), ("again", done2)):
        times = ", ".join(f"{agent} {secs:.1f}s" for agent, secs in sorted(done.items()))
        print(f"last candle evaluated ({label}): {times}")
    same = alone == beside == again
    print(f"identical verdicts, orders and fills in all three runs: {same}")
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
