"""RAG answers on the shared real data (issue 14's acceptance), not a committed test.

    .venv/bin/python bench/rag_real_check.py [--data ../shared/data/normalized]

Ingests the real Binance USD-M BTCUSDT 5m perp candles with the real 8 h
funding and the daily OI value into a temporary embedded store, then queries
at the last bar whose 24 h had passed within the OI coverage (the store's
searchable points), with the point's own stored state as ``current_state``.
Prints the matches and checks: k matches, at least 4 h apart, every outcome
known, none after the query time (minus the 24 h embargo), and, as the
baseline from the same run, how the same query answers with purge and the
gap turned off (the issue's "top 5 from one 35-minute stretch").
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import itertools

from daemon.errors import RpcError
from daemon.rag.config import RagConfig, StoreSection
from daemon.rag.datafiles import read_candles, read_funding, read_open_interest
from daemon.rag.features import STATE_COLUMNS
from daemon.rag.ingest import ingest
from daemon.rag.service import RagService
from daemon.rag.store_embedded import EmbeddedStore

H = 3_600_000


def spread_hours(times: list[int]) -> float:
    """The shortest distance between two matches, in hours."""
    ts = sorted(times)
    return min((b - a for a, b in itertools.pairwise(ts)), default=0) / H


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "normalized")
    ap.add_argument("--top-k", type=int, default=5)
    args = ap.parse_args()
    d = args.data
    candles = d / "binance_usdm_BTCUSDT_perp_5m.csv.gz"
    if not candles.exists():
        print(f"no shared data at {d}: nothing to check", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        cfg = RagConfig(store=StoreSection(path=tmp))
        store = EmbeddedStore(tmp, "trading_patterns")
        bars = read_candles(candles)
        funding = read_funding(d / "binance_usdm_BTCUSDT_funding_8h.csv.gz")
        oi = read_open_interest(d / "binance_usdm_oi_value_usd_1d.csv.gz", "BTCUSDT")
        t0 = time.perf_counter()
        report = ingest(store, "BTCUSDT", "5m", bars, funding, oi, cfg)
        print(
            f"ingest: {report.bars} bars, {report.points} points, {report.incomplete} without "
            f"funding/OI, {time.perf_counter() - t0:.1f} s"
        )
        gen = (Path(tmp) / "trading_patterns" / "CURRENT").read_text().strip()
        pts = np.load(Path(tmp) / "trading_patterns" / gen / "points.npy")
        complete = pts[pts["complete"]]
        last = complete[-1]
        query_ms = int(last["t_ms"])
        state = {c: float(last[c]) for c in STATE_COLUMNS}
        print(f"searchable points {len(complete)}, query at {query_ms} (the last complete bar)")
        svc = RagService(cfg, store)

        def ask(**qc: Any) -> dict[str, Any]:
            params = {"symbol": "BTCUSDT", "timestamp": query_ms, "current_state": state,
                      "query_config": {"lookback_days": 90, "top_k": args.top_k,
                                       "min_similarity": 0.0, **qc}}  # fmt: skip
            return svc.query_patterns(params)

        out = ask()
        times = [m["timestamp"] for m in out["matches"]]
        for m in out["matches"]:
            o = m["outcomes"]
            print(f"  {m['date']} sim {m['similarity']:.3f} 1h {o['outcome_1h']:+.2f}% "
                  f"4h {o['outcome_4h']:+.2f}% 24h {o['outcome_24h']:+.2f}%")  # fmt: skip
        known = all(v is not None for m in out["matches"] for v in m["outcomes"].values())
        purged = all(t <= query_ms - 24 * H for t in times)
        gap = spread_hours(times)
        print(f"matches {len(times)}, min gap {gap:.1f} h, all outcomes known {known}, "
              f"all at least 24 h before the query {purged}")  # fmt: skip
        cfg_off = RagConfig(
            store=StoreSection(path=tmp),
            query_defaults=cfg.query_defaults.__class__(embargo_hours=0, min_gap_hours=0),
        )
        base = RagService(cfg_off, store).query_patterns(
            {"symbol": "BTCUSDT", "timestamp": query_ms, "current_state": state,
             "query_config": {"lookback_days": 90, "top_k": args.top_k, "min_similarity": 0.0}}
        )  # fmt: skip
        bt = [m["timestamp"] for m in base["matches"]]
        nulls = sum(v is None for m in base["matches"] for v in m["outcomes"].values())
        print(f"baseline (no purge, no gap): span {(max(bt) - min(bt)) / H:.1f} h, "
              f"{nulls} null outcomes, own bar matched {query_ms in bt}")  # fmt: skip
        health = svc.health()["symbols"]["BTCUSDT"]
        print(f"rag.health BTCUSDT: {health}")
        # The seed's own example asks about 2024-01-01, before the data starts.
        try:
            ask_seed = dict(state)
            svc.query_patterns({"symbol": "BTCUSDT", "timestamp": 1_704_067_200_000,
                                "current_state": ask_seed})  # fmt: skip
            advice = ""
        except RpcError as exc:
            advice = str((exc.data or {}).get("suggestion", ""))
            print(f"seed example (2024-01-01): {exc.code} {exc.message}: {advice}")
        ok = len(times) == args.top_k and gap >= 4 and known and purged
        ok = ok and health["searchable"] == len(complete) and "starts at" in advice
        print("OK" if ok else "FAILED")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
