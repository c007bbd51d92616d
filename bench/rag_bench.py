"""RAG service benchmark: ingest rate, and query latency/throughput over loopback.

    .venv/bin/python bench/rag_bench.py [--bars 102500] [--requests 1000]

Builds a collection of ~100k complete patterns (generated 5m candles with
funding and OI, or ``--candles FILE`` with optional ``--funding``/``--open-interest``),
starts ``marketwake rag serve`` in a subprocess, and drives it with 1 and 4
concurrent clients, regime filters on, lookback covering the whole collection.
Baselines measured in the same run: the in-process ``query_patterns`` call
(what the server wraps) and a plain numpy brute force with no time slicing.
Seed targets: p50 < 150 ms, p99 < 500 ms, > 100 req/s. Ours (2 cores):
p50 <= 10 ms, p99 <= 50 ms, >= 500 req/s with 4 clients; ingest >= 20k bars/s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from daemon.errors import RpcError
from daemon.rag.config import RagConfig, StoreSection
from daemon.rag.datafiles import read_candles, read_funding, read_open_interest
from daemon.rag.features import STATE_COLUMNS, Bars, Observations
from daemon.rag.ingest import ingest
from daemon.rag.params import parse_params
from daemon.rag.service import RagService
from daemon.rag.store_embedded import EmbeddedStore

TF = 300_000
H = 3_600_000
T0 = 1_735_689_600_000


def synthetic(n: int) -> tuple[Bars, Observations, Observations]:
    rng = np.random.default_rng(1)
    close = 60_000 * np.exp(np.cumsum(rng.normal(0, 0.002, n)))
    open_ = np.concatenate(([60_000.0], close[:-1]))
    high = np.maximum(open_, close) * (1 + np.abs(rng.normal(0, 0.002, n)))
    low = np.minimum(open_, close) * (1 - np.abs(rng.normal(0, 0.002, n)))
    t = T0 + TF * np.arange(n)
    bars = Bars.from_rows(np.column_stack([t, open_, high, low, close, np.ones(n)]))
    ft = np.arange(T0 - 8 * H, t[-1] + TF, 8 * H)
    ot = np.arange(T0 - 24 * H, t[-1] + TF, TF)
    fund = Observations.of(ft, rng.normal(0.00005, 0.0001, len(ft)))
    oi = Observations.of(ot, 1e10 * np.exp(np.cumsum(rng.normal(0, 0.002, len(ot)))))
    return bars, fund, oi


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q))


def queries(points: np.ndarray, k: int) -> list[dict[str, Any]]:
    """k distinct realistic queries: states of random stored points, latest timestamp."""
    rng = np.random.default_rng(2)
    complete = points[points["complete"]]
    ts = int(points["t_ms"].max())
    out = []
    for row in complete[rng.choice(len(complete), size=k, replace=False)]:
        state = {c: float(row[c]) for c in STATE_COLUMNS}
        out.append(
            {
                "symbol": "BTCUSDT",
                "timestamp": ts,
                "current_state": state,
                "query_config": {"lookback_days": 365, "top_k": 5, "min_similarity": 0.7},
            }
        )
    return out


async def client(
    port: int, reqs: list[dict[str, Any]], lat: list[float], errors: list[int]
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 24)
    for i, params in enumerate(reqs):
        body = json.dumps(
            {"jsonrpc": "2.0", "id": i, "method": "rag.query_patterns", "params": params}
        )
        t = time.perf_counter()
        writer.write(body.encode() + b"\n")
        line = await reader.readline()
        lat.append((time.perf_counter() - t) * 1000)
        reply = json.loads(line)
        if "error" in reply:
            errors.append(reply["error"]["code"])
    writer.close()
    await writer.wait_closed()


async def load(
    port: int, reqs: list[dict[str, Any]], clients: int
) -> tuple[list[float], float, list[int]]:
    lat: list[float] = []
    errors: list[int] = []
    share = [reqs[i::clients] for i in range(clients)]
    t = time.perf_counter()
    await asyncio.gather(*(client(port, s, lat, errors) for s in share))
    return lat, time.perf_counter() - t, errors


def start_server(config: Path) -> tuple[subprocess.Popen[str], int]:
    cmd = [
        sys.executable,
        "-c",
        "from daemon.cli.main import main; main()",
        "rag",
        "serve",
        "--config",
        str(config),
        "--log-format",
        "json",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:  # JSON log lines: the listening one has the bound port
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("event") == "rag server listening":
            return proc, int(rec["port"])
    raise SystemExit("server did not start")


def brute_force_ms(store: EmbeddedStore, svc: RagService, reqs: list[dict[str, Any]]) -> float:
    """Baseline: filter mask over every row + one matmul over the whole matrix (no index)."""
    snap = store._reload(force=True)
    p, vec = snap.points, np.ascontiguousarray(snap.vectors["full"])
    complete = np.ascontiguousarray(p["complete"])
    funding = np.ascontiguousarray(p["funding_rate"])
    oi = np.ascontiguousarray(p["oi_delta_pct"])
    t_ms = np.ascontiguousarray(p["t_ms"])
    meta = store.meta()
    assert meta is not None
    times = []
    for params in reqs[:200]:
        q = svc._embed(meta, parse_params(params).current_state)[1]
        t = time.perf_counter()
        mask = complete & (funding > 0) & (oi > 1.0) & (t_ms <= params["timestamp"])
        scores = vec @ q
        scores[~mask] = -2.0
        np.argpartition(-scores, 5)[:5]
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def compare_engines(n_bars: int) -> None:
    """Filtered search latency of qdrant-edge and qdrant-client local mode vs ours, same data."""
    import tempfile as tf
    import warnings

    import qdrant_edge as qe
    from qdrant_client import QdrantClient

    from daemon.rag.service import Knobs
    from daemon.rag.store_qdrant import QdrantStore, _payload

    warnings.simplefilter("ignore")
    bars, fund, oi = synthetic(n_bars)
    cfg = RagConfig(store=StoreSection(path=tf.mkdtemp()))
    ours = EmbeddedStore(cfg.store.path, "tp")
    ingest(ours, "BTCUSDT", "5m", bars, fund, oi, cfg)
    snap = ours._reload(force=True)
    pts = snap.points
    svc, meta = RagService(cfg, ours), ours.meta()
    assert meta is not None
    probes = []
    for r in queries(pts, 100):
        p = parse_params(r)
        vec = svc._embed(meta, p.current_state)[1]
        probes.append((vec, svc._filter(p, Knobs.resolve(p.query_config, cfg.query_defaults))[0]))

    def timed(search: Any) -> tuple[float, float, list[list[int]]]:
        lat, found = [], []
        for vec, flt in probes:
            t = time.perf_counter()
            found.append(search(vec, flt))
            lat.append((time.perf_counter() - t) * 1000)
        return pct(lat, 50), pct(lat, 99), found

    def ours_search(vec: Any, flt: Any) -> list[int]:
        return [int(h.payload["t_ms"]) for h in ours.search("full", vec, flt, 5, 0.7)]

    base = timed(ours_search)
    print(f"engines, {len(pts)} points, regime filters on, search only:")
    print(f"  embedded numpy + partitions  p50 {base[0]:8.2f} ms  p99 {base[1]:8.2f} ms")

    params = {
        n: qe.EdgeVectorParams(size=v.shape[1], distance=qe.Distance.Cosine)
        for n, v in snap.vectors.items()
    }
    shard = qe.EdgeShard.create(tf.mkdtemp() + "/shard", qe.EdgeConfig(vectors=params))
    kinds = qe.PayloadSchemaType
    for field, kind in (("symbol", kinds.Keyword), ("t_ms", kinds.Integer), ("oi_delta_pct", kinds.Float), ("funding_rate", kinds.Float)):  # fmt: skip
        shard.update(qe.UpdateOperation.create_field_index(field, kind))
    t0 = time.perf_counter()
    for lo in range(0, len(pts), 2000):
        batch = [
            qe.Point(
                int(pts[i]["id"]),
                {n: v[i].tolist() for n, v in snap.vectors.items()},
                _payload(pts[i]),
            )
            for i in range(lo, min(lo + 2000, len(pts)))
        ]
        shard.update(qe.UpdateOperation.upsert_points(batch))
    up = len(pts) / (time.perf_counter() - t0)

    def edge_search(vec: Any, flt: Any) -> list[int]:
        # Every point is complete here (a bool MatchValue matched nothing in edge 0.9).
        must: list[Any] = [qe.FieldCondition("symbol", match=qe.MatchValue(flt.symbol))]
        for r in flt.ranges:
            must.append(
                qe.FieldCondition(
                    r.field, range=qe.RangeFloat(gt=r.gt, gte=r.gte, lt=r.lt, lte=r.lte)
                )
            )
        req = qe.QueryRequest(limit=5, query=qe.Query.Nearest(vec.tolist(), using="full"),
                              filter=qe.Filter(must=must), with_payload=True, score_threshold=0.7)  # fmt: skip
        res = sorted(shard.query(req), key=lambda x: (-x.score, -(x.payload or {})["t_ms"]))
        return [int((x.payload or {})["t_ms"]) for x in res]

    edge = timed(edge_search)
    same = sum(a == b for a, b in zip(edge[2], base[2], strict=True))
    print(f"  qdrant-edge (payload indexes) p50 {edge[0]:8.2f} ms  p99 {edge[1]:8.2f} ms  "
          f"same results {same}/{len(probes)}  upsert {up:,.0f} points/s")  # fmt: skip

    local = QdrantStore(QdrantClient(path=tf.mkdtemp()), "tp")
    t0 = time.perf_counter()
    ingest(local, "BTCUSDT", "5m", bars, fund, oi, cfg, batch_size=2000)
    up = len(pts) / (time.perf_counter() - t0)
    probes = probes[:10]
    loc = timed(
        lambda vec, flt: [int(h.payload["t_ms"]) for h in local.search("full", vec, flt, 5, 0.7)]
    )
    print(f"  qdrant-client local mode     p50 {loc[0]:8.2f} ms  p99 {loc[1]:8.2f} ms  "
          f"(10 queries)  ingest {up:,.0f} points/s")  # fmt: skip


def report(
    name: str, lat: list[float], secs: float, errors: list[int]
) -> tuple[float, float, float]:
    p50, p99, rps = pct(lat, 50), pct(lat, 99), len(lat) / secs
    print(
        f"  {name:<10} n={len(lat):5d}  p50 {p50:7.2f} ms  p99 {p99:7.2f} ms  {rps:8.0f} req/s  errors {len(errors)}"
    )
    return p50, p99, rps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bars", type=int, default=102_500)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--candles", type=Path)
    ap.add_argument("--funding", type=Path)
    ap.add_argument("--open-interest", type=Path)
    ap.add_argument("--compare-engines", type=int, default=0, metavar="BARS",
                    help="also time qdrant-edge and qdrant-client local mode on BARS bars (slow)")  # fmt: skip
    args = ap.parse_args()
    if args.compare_engines:
        compare_engines(args.compare_engines)
    tmp = Path(tempfile.mkdtemp(prefix="rag_bench_"))
    cfg = RagConfig(store=StoreSection(path=str(tmp)))
    if args.candles:
        bars = read_candles(args.candles)
        fund = read_funding(args.funding) if args.funding else None
        oi = read_open_interest(args.open_interest, "BTCUSDT") if args.open_interest else None
    else:
        bars, fund, oi = synthetic(args.bars)
    store = EmbeddedStore(str(tmp), "trading_patterns")
    rep = ingest(store, "BTCUSDT", "5m", bars, fund, oi, cfg)
    again = ingest(store, "BTCUSDT", "5m", bars, fund, oi, cfg)
    points = store._reload(force=True).points
    n_complete = int(points["complete"].sum())
    print(f"collection: {rep.points} points ({n_complete} complete) from {rep.bars} bars")
    print(f"ingest: {rep.bars / rep.seconds:,.0f} bars/s (first run, {rep.seconds:.2f} s); "
          f"re-ingest no-op {again.bars / again.seconds:,.0f} bars/s; target >= 20,000 bars/s")  # fmt: skip

    reqs = queries(points, min(args.requests, n_complete))
    svc = RagService(cfg, store)
    for r in reqs[:50]:
        svc.query_patterns(r)
    t_in: list[float] = []
    for r in reqs:
        t = time.perf_counter()
        with contextlib.suppress(RpcError):  # -32001 still costs a full query
            svc.query_patterns(r)
        t_in.append((time.perf_counter() - t) * 1000)
    bf = brute_force_ms(store, svc, reqs)
    print("baselines (same run):")
    print(f"  in-process query_patterns  p50 {pct(t_in, 50):.2f} ms  p99 {pct(t_in, 99):.2f} ms")
    print(f"  numpy brute force, no index (mask all rows + full matmul)  p50 {bf:.2f} ms")

    config = tmp / "config.toml"
    config.write_text(
        f'[rag.store]\npath = "{tmp}"\n[rag.server]\nport = 0\nrate_limit_per_second = 0.0\n'
    )
    proc, port = start_server(config)
    try:
        print(
            f"loopback JSON-RPC, {len(reqs)} distinct queries, regime filters on, lookback 365 d:"
        )
        asyncio.run(load(port, reqs[:50], 1))  # warm-up
        one = report("1 client", *asyncio.run(load(port, reqs, 1)))
        four = report("4 clients", *asyncio.run(load(port, reqs * 2, 4)))
    finally:
        proc.terminate()
        proc.wait(5)
    seed_ok = four[0] < 150 and four[1] < 500 and four[2] > 100
    ours_ok = four[0] <= 10 and four[1] <= 50 and four[2] >= 500
    print(
        f"seed targets (p50<150, p99<500, >100 req/s) with 4 clients: {'met' if seed_ok else 'MISSED'}"
    )
    print(
        f"our targets (p50<=10, p99<=50, >=500 req/s) with 4 clients: {'met' if ours_ok else 'MISSED'}"
    )
    print(f"ratio: server p50 (1 client) / in-process p50 = {one[0] / pct(t_in, 50):.2f}x; "
          f"in-process p50 / brute-force search p50 = {pct(t_in, 50) / bf:.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
