"""query_patterns against an independent brute-force recomputation, and its errors."""

from __future__ import annotations

import itertools
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from daemon.errors import RpcError
from daemon.rag.config import EmbeddingSection, RagConfig, StoreSection
from daemon.rag.embedding import EmbeddingCache
from daemon.rag.features import OUTCOME_COLUMNS
from daemon.rag.service import RagService
from daemon.rag.store_embedded import EmbeddedStore
from tests.rag.conftest import Collection, params_from

H = 3_600_000
DAY = 24 * H


def ref_derived(s: Any) -> np.ndarray:
    """The 10 scale-free features, written out independently of daemon.rag.schema."""
    return np.array(
        [
            s["rsi_7"],
            s["rsi_14"],
            s["macd"] / s["price"] * 100,
            (s["price"] / s["ema_20"] - 1) * 100,
            (s["price"] / s["ema_20_4h"] - 1) * 100,
            (s["ema_20_4h"] / s["ema_50_4h"] - 1) * 100,
            s["funding_rate"] * 1e4,
            (s["open_interest_latest"] / s["open_interest_avg_24h"] - 1) * 100,
            s["price_change_1h"],
            s["price_change_4h"],
        ],
        dtype=np.float64,
    )


def _meta(col: Collection) -> dict[str, Any]:
    d = col.path / "trading_patterns"
    meta: dict[str, Any] = json.loads(
        (d / (d / "CURRENT").read_text().strip() / "meta.json").read_text()
    )
    return meta


def _regime(delta: float, funding: float) -> tuple[int, int]:
    oi = 1 if delta > 1.0 else (-1 if delta < -1.0 else 0)
    return oi, int(np.sign(funding))


def expected(
    col: Collection, params: dict[str, Any], regime: bool, dims: int = 10
) -> list[tuple[int, float]]:
    """(timestamp, cosine) of the matches by brute force over the stored points: purged
    (outcomes known: t + 24 h <= timestamp), best first, at least 4 h apart."""
    meta = _meta(col)
    mean, std = np.array(meta["norm_mean"])[:dims], np.array(meta["norm_std"])[:dims]
    q = (ref_derived(params["current_state"])[:dims] - mean) / std
    q /= np.linalg.norm(q)
    ts, cfg = params["timestamp"], params["query_config"]
    qs = params["current_state"]
    q_reg = _regime(
        (qs["open_interest_latest"] / qs["open_interest_avg_24h"] - 1) * 100, qs["funding_rate"]
    )
    found = []
    for p in col.points():
        if not p["complete"] or not ts - cfg["lookback_days"] * DAY < p["t_ms"] <= ts - DAY:
            continue
        if regime and _regime(p["oi_delta_pct"], p["funding_rate"]) != q_reg:
            continue
        v = (ref_derived(p)[:dims] - mean) / std
        cos = float(v @ q / np.linalg.norm(v))
        if cos >= cfg["min_similarity"]:
            found.append((int(p["t_ms"]), cos))
    found.sort(key=lambda x: (-x[1], -x[0]))
    gap = cfg.get("min_gap_hours", 4.0) * H
    taken: list[tuple[int, float]] = []
    for t, cos in found:
        if all(abs(t - u) >= gap for u, _ in taken):
            taken.append((t, cos))
    return taken[: cfg["top_k"]]


def _query_point(col: Collection) -> np.void:
    pts = col.points()
    point: np.void = pts[np.flatnonzero(pts["complete"])[600]]
    return point


def test_norm_stats_are_feature_means(collection: Collection) -> None:
    """The stored normalization stats are the per-feature mean/std over the first ingest."""
    pts = collection.points()
    d = np.array([ref_derived(p) for p in pts])
    meta = _meta(collection)
    for k in range(10):
        col = d[:, k][np.isfinite(d[:, k])]
        assert meta["norm_mean"][k] == pytest.approx(col.mean(), rel=1e-9, abs=1e-12)
        assert meta["norm_std"][k] == pytest.approx(col.std(), rel=1e-9)


@pytest.mark.parametrize("regime", [True, False])
def test_matches_equal_brute_force(collection: Collection, regime: bool) -> None:
    """Same matches, order and similarity as an independent brute force, with/without regimes."""
    svc = RagService(collection.cfg, collection.store)
    ts = int(collection.points()["t_ms"][-1])
    params = params_from(
        _query_point(collection), ts, top_k=12, min_similarity=0.5, include_regime_filters=regime
    )
    out = svc.query_patterns(params)
    want = expected(collection, params, regime)
    assert len(want) == 12
    assert [m["timestamp"] for m in out["matches"]] == [t for t, _ in want]
    assert [m["similarity"] for m in out["matches"]] == pytest.approx(
        [c for _, c in want], abs=1e-5
    )
    filters = ["symbol", "timerange"] + (["oi_delta", "funding_sign"] if regime else [])
    assert out["metadata"]["filters_applied"] == filters


def test_statistics_recomputed(collection: Collection) -> None:
    """mean/median/p10/p90/counts/win rate and hit counts equal numpy over the match outcomes."""
    svc = RagService(collection.cfg, collection.store)
    pts = collection.points()
    ts = int(pts["t_ms"][-1])
    out = svc.query_patterns(
        params_from(_query_point(collection), ts, top_k=20, min_similarity=0.3, min_gap_hours=0)
    )
    by_t = {int(p["t_ms"]): p for p in pts}
    rows = [by_t[m["timestamp"]] for m in out["matches"]]
    o4 = np.array([r["outcome_4h"] for r in rows if np.isfinite(r["outcome_4h"])])
    st = out["statistics"]
    assert st["total_matches"] == len(rows) == 20
    assert st["outcome_4h"]["mean"] == pytest.approx(o4.mean())
    assert st["outcome_4h"]["median"] == pytest.approx(np.median(o4))
    assert st["outcome_4h"]["p10"] == pytest.approx(np.percentile(o4, 10))
    assert st["outcome_4h"]["p90"] == pytest.approx(np.percentile(o4, 90))
    assert st["outcome_4h"]["positive_count"] == int((o4 > 0).sum())
    assert st["outcome_4h"]["negative_count"] == int((o4 < 0).sum())
    assert st["outcome_4h"]["win_rate"] == pytest.approx((o4 > 0).mean())
    assert st["stop_loss_hits"] == sum(1 for r in rows if r["hit_stop_loss"] == 1.0)
    assert st["take_profit_hits"] == sum(1 for r in rows if r["hit_take_profit"] == 1.0)
    sims = [m["similarity"] for m in out["matches"]]
    assert st["avg_similarity"] == pytest.approx(np.mean(sims))
    assert st["similarity_range"] == [min(sims), max(sims)]


def test_purged_matches_have_known_outcomes_and_are_distinct(collection: Collection) -> None:
    """Purge: no candidate closer to the query time than the 24 h embargo, so every
    outcome is known (no nulls) and the query's own recent bars never match. Matches
    are at least min_gap_hours apart (4 by default; 0 turns it off)."""
    svc = RagService(collection.cfg, collection.store)
    point = _query_point(collection)
    ts = int(point["t_ms"]) + 2 * H
    wide = {"top_k": 20, "min_similarity": 0.0, "lookback_days": 8, "include_regime_filters": False}
    out = svc.query_patterns(params_from(point, ts, **wide))
    times = [m["timestamp"] for m in out["matches"]]
    assert len(times) == 20
    assert all(ts - 8 * DAY < t <= ts - DAY for t in times)
    assert all(v is not None for m in out["matches"] for v in m["outcomes"].values())
    assert min(abs(a - b) for i, a in enumerate(times) for b in times[i + 1 :]) >= 4 * H
    dense = svc.query_patterns(params_from(point, ts, **wide, min_gap_hours=0))
    spread = sorted(m["timestamp"] for m in dense["matches"])
    assert min(b - a for a, b in itertools.pairwise(spread)) < 4 * H
    assert out["metadata"]["embargo_hours"] == 24.0 and out["metadata"]["min_gap_hours"] == 4.0


def test_seed_clients_numbers_and_snapshots(collection: Collection) -> None:
    """top_k 5.0 is 5 (the seed types it as a number); a fraction is -32602; extra
    current_state members (a whole snapshot) are ignored and listed."""
    svc = RagService(collection.cfg, collection.store)
    ts = int(collection.points()["t_ms"][-1])
    params = params_from(_query_point(collection), ts, top_k=5.0, min_similarity=0.3)
    params["current_state"] |= {"volume_24h": 123.0, "symbol_name": "BTC"}
    out = svc.query_patterns(params)
    assert len(out["matches"]) == 5
    assert out["metadata"]["ignored_fields"] == ["symbol_name", "volume_24h"]
    half = params_from(_query_point(collection), ts, top_k=4.5)
    assert (_code(svc, half).code, _code(svc, half).data["field"]) == (-32602, "query_config.top_k")


def test_core_vector_without_price_changes(collection: Collection) -> None:
    """Without the optional price changes the 8-feature vector is used, matching brute force."""
    svc = RagService(collection.cfg, collection.store)
    ts = int(collection.points()["t_ms"][-1])
    params = params_from(_query_point(collection), ts, top_k=5, min_similarity=0.5)
    del params["current_state"]["price_change_1h"], params["current_state"]["price_change_4h"]
    out = svc.query_patterns(params)
    assert out["metadata"]["vector"] == "core"
    full = {
        **params,
        "current_state": {
            **params["current_state"],
            "price_change_1h": 0.0,
            "price_change_4h": 0.0,
        },
    }
    want = expected(collection, full, True, dims=8)
    assert [m["timestamp"] for m in out["matches"]] == [t for t, _ in want]


def test_response_shape_and_metadata(collection: Collection) -> None:
    """The seed's members are all there, with our versions and model."""
    svc = RagService(collection.cfg, collection.store)
    ts = int(collection.points()["t_ms"][-1])
    out = svc.query_patterns(params_from(_query_point(collection), ts, min_similarity=0.5))
    m = out["matches"][0]
    assert set(m) == {"similarity", "timestamp", "date", "market_state", "outcomes"}
    assert set(m["market_state"]) == {
        "rsi_7",
        "rsi_14",
        "macd",
        "ema_ratio",
        "oi_delta_pct",
        "funding_rate",
    }
    assert m["date"].endswith("Z") and m["date"][:4] == "2025"
    meta = out["metadata"]
    assert meta["schema_version"] == 1 and meta["embedding_model"] == "numeric"
    assert meta["feature_version"] == "v1_rsi_macd_ema4h_fund_oi"
    assert meta["query_duration_ms"] >= meta["retrieval_duration_ms"] >= 0


def _code(svc: RagService, params: Any) -> RpcError:
    with pytest.raises(RpcError) as info:
        svc.query_patterns(params)
    return info.value


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda p: p.update(symbol="btcusdt"), "symbol"),
        (lambda p: p.pop("timestamp"), "timestamp"),
        (lambda p: p.update(timestamp=1e300), "timestamp"),
        (lambda p: p["current_state"].pop("rsi_7"), "current_state.rsi_7"),
        (lambda p: p["current_state"].update(rsi_14=100.5), "current_state.rsi_14"),
        (lambda p: p["current_state"].update(price=-1), "current_state.price"),
        (lambda p: p["current_state"].update(macd="1"), "current_state.macd"),
        (lambda p: p["current_state"].update(funding_rate=True), "current_state.funding_rate"),
        (lambda p: p["query_config"].update(top_k=51), "query_config.top_k"),
        (lambda p: p["query_config"].update(lookback_days=0.5), "query_config.lookback_days"),
        (lambda p: p["query_config"].update(min_similarity=1.5), "query_config.min_similarity"),
        (lambda p: p["query_config"].update(topk=3), "query_config.topk"),
        (lambda p: p.update(current_state=[1]), "current_state"),
        (lambda p: p["current_state"].update(price=1e308), "current_state.price"),
        (lambda p: p["current_state"].update(macd=-1e300), "current_state.macd"),
        (lambda p: p["current_state"].update(funding_rate=5.0), "current_state.funding_rate"),
        (
            lambda p: p["current_state"].update(open_interest_latest=1e200),
            "current_state.open_interest_latest",
        ),
        (
            lambda p: p["current_state"].update(price_change_1h=-1e9),
            "current_state.price_change_1h",
        ),
    ],
)
def test_invalid_params_name_the_field(collection: Collection, mutate: Any, field: str) -> None:
    """-32602 names the failing field in error.data."""
    svc = RagService(collection.cfg, collection.store)
    params = params_from(_query_point(collection), 1)
    mutate(params)
    err = _code(svc, params)
    assert (err.code, err.data["field"]) == (-32602, field)


def test_invalid_params_lists_every_field(collection: Collection) -> None:
    """One -32602 names every problem, so a client fixes the request in one round trip."""
    svc = RagService(collection.cfg, collection.store)
    params = params_from(_query_point(collection), 1, top_k=2.5, topk=3)
    params["symbol"] = "btc"
    del params["current_state"]["rsi_7"]
    params["current_state"]["rsi_14"] = 101
    params["current_state"]["price"] = "1"
    params["current_state"]["note"] = "ignored, not an error"
    err = _code(svc, params)
    got = {e["field"]: e["reason"] for e in err.data["errors"]}
    assert err.code == -32602 and err.data["field"] == next(iter(got))
    assert set(got) == {
        "symbol",
        "current_state.rsi_7",
        "current_state.rsi_14",
        "current_state.price",
        "query_config.topk",
        "query_config.top_k",
    }
    assert got["current_state.rsi_7"] == "missing required field"
    assert got["query_config.topk"] == "unknown field"
    assert got["query_config.top_k"] == "must be a whole number"
    assert "<= 100" in got["current_state.rsi_14"] and "float" in got["current_state.price"]


def test_params_not_an_object(collection: Collection) -> None:
    """Positional params are -32602 too."""
    assert _code(RagService(collection.cfg, collection.store), [1, 2]).code == -32602


def test_insufficient_matches(collection: Collection) -> None:
    """Fewer than min_matches above min_similarity: -32001 with counts and a suggestion."""
    svc = RagService(collection.cfg, collection.store)
    point = _query_point(collection)
    err = _code(svc, params_from(point, int(point["t_ms"]), lookback_days=1, min_similarity=0.999))
    assert err.code == -32001 and err.message == "Insufficient matches found"
    assert err.data["min_required"] == 3 and err.data["matches_found"] < 3
    assert "lookback_days" in err.data["suggestion"]


def iso(t: int) -> str:
    return datetime.fromtimestamp(t / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _searchable_span(col: Collection) -> tuple[int, int]:
    """First and last close time of points with every feature and outcome known."""
    pts = col.points()
    outcomes = np.column_stack([pts[c] for c in OUTCOME_COLUMNS])
    ok = pts["complete"] & np.isfinite(outcomes).all(axis=1)
    assert ok.sum() < len(pts)  # warm-up without OI, and the tail awaiting outcomes
    return int(pts["t_ms"][ok].min()), int(pts["t_ms"][ok].max())


def test_no_data_in_window_says_what_the_store_covers(collection: Collection) -> None:
    """The seed's own example asks about 2024, before the data: the answer says where the
    data is and what to change, instead of "increase lookback_days"."""
    svc = RagService(collection.cfg, collection.store)
    first, last = _searchable_span(collection)
    early = _code(svc, params_from(_query_point(collection), 1_704_067_200_000))
    assert early.code == -32001 and early.data["matches_found"] == 0
    cov = early.data["coverage"]
    assert (cov["first"], cov["last"]) == (iso(first), iso(last))
    assert (
        cov["searchable"] + cov["incomplete"] == cov["points"] and cov["missing_open_interest"] > 0
    )
    assert f"starts at {iso(first)}" in early.data["suggestion"]
    assert f"after {iso(first + 24 * 3_600_000)}" in early.data["suggestion"]
    late_ts = last + 40 * 86_400_000
    late = _code(svc, params_from(_query_point(collection), late_ts, lookback_days=10))
    assert f"ends at {iso(last)}" in late.data["suggestion"]
    assert "lookback_days above 39" in late.data["suggestion"]
    assert late.data["window"]["to"] == iso(late_ts - 24 * 3_600_000)


def test_health_reports_searchable_points_per_symbol(collection: Collection) -> None:
    """rag.health separates stored from searchable points, and says why the rest are not."""
    pts = collection.points()
    first, last = _searchable_span(collection)
    health = RagService(collection.cfg, collection.store).health()
    sym = health["symbols"]["BTCUSDT"]
    assert health["store"] == "embedded" and health["points"] == len(pts) == sym["points"]
    assert health["searchable"] == sym["searchable"] == int(pts["complete"].sum())
    assert sym["missing_open_interest"] == int(np.isnan(pts["open_interest_latest"]).sum()) > 0
    assert sym["missing_funding"] == int(np.isnan(pts["funding_rate"]).sum())
    assert sym["incomplete"] >= sym["missing_open_interest"]
    assert (sym["first"], sym["last"]) == (iso(first), iso(last))


def test_zero_matches_allowed_gives_numbers_not_nulls(collection: Collection) -> None:
    """min_matches 0 and nothing found: statistics are numbers (the seed types them so)."""
    svc = RagService(collection.cfg, collection.store)
    res = svc.query_patterns(
        params_from(_query_point(collection), 1_704_067_200_000, min_matches=0)
    )
    stats = res["statistics"]
    assert res["matches"] == [] and stats["total_matches"] == 0
    assert stats["avg_similarity"] == 0.0 and stats["outcome_4h"]["count"] == 0

    def walk(x: Any) -> None:
        assert x is not None
        for v in x.values() if isinstance(x, dict) else x if isinstance(x, list) else ():
            walk(v)

    walk(stats)


def test_unknown_symbol(collection: Collection) -> None:
    """A well-formed symbol with no data: -32002."""
    params = params_from(_query_point(collection), 1)
    params["symbol"] = "ETHUSDT"
    err = _code(RagService(collection.cfg, collection.store), params)
    assert err.code == -32002 and err.data == {"symbol": "ETHUSDT"}


def test_missing_collection_is_store_error(tmp_path: Path, collection: Collection) -> None:
    """Nothing ingested yet: -32003 telling the operator to ingest."""
    cfg = RagConfig(store=StoreSection(path=str(tmp_path)))
    err = _code(
        RagService(cfg, EmbeddedStore(str(tmp_path), "x")), params_from(_query_point(collection), 1)
    )
    assert err.code == -32003 and "rag ingest" in err.data["reason"]
    assert err.message == "Embedded store error" and err.data["store"] == "embedded"


def test_corrupt_store_is_store_error(tmp_path: Path, collection: Collection) -> None:
    """A CURRENT pointing at nothing: -32003, not a crash."""
    store = EmbeddedStore(str(tmp_path), "x")
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "CURRENT").write_text("gen-000009")
    svc = RagService(RagConfig(store=StoreSection(path=str(tmp_path))), store)
    assert _code(svc, params_from(_query_point(collection), 1)).code == -32003
    # A CURRENT naming a path is refused as such (a write deletes what it names).
    (tmp_path / "keep").mkdir()
    for bad in ("../keep", "gen-1/../../keep", "\xff"):
        (tmp_path / "x" / "CURRENT").write_text(bad, encoding="utf-8", errors="surrogateescape")
        err = _code(svc, params_from(_query_point(collection), 1))
        assert err.code == -32003, bad
    assert (tmp_path / "keep").is_dir()


def test_embedding_mismatch(collection: Collection) -> None:
    """A server configured for the text model refuses a numeric collection: -32004."""
    cfg = RagConfig(embedding=EmbeddingSection(model="bge-small-en-v1.5"))
    err = _code(RagService(cfg, collection.store), params_from(_query_point(collection), 1))
    assert err.code == -32004 and "numeric" in err.data["reason"]


class _Exploding:
    def meta(self) -> Any:
        raise ZeroDivisionError


def test_unexpected_failure_is_server_error(collection: Collection) -> None:
    """An unexpected exception becomes -32000 with its type, never escapes."""
    err = _code(RagService(collection.cfg, _Exploding()), params_from(_query_point(collection), 1))  # type: ignore[arg-type]
    assert err.code == -32000 and err.data == {"reason": "ZeroDivisionError"}


def test_embedding_cache_ttl_and_bound() -> None:
    """Entries expire after the TTL and the oldest are evicted beyond the bound."""
    now = [0.0]
    cache = EmbeddingCache(10.0, 2, clock=lambda: now[0])
    v = np.ones(3, dtype=np.float32)
    cache.put(b"a", v)
    assert cache.get(b"a") is v
    now[0] = 10.5
    assert cache.get(b"a") is None
    for k in (b"x", b"y", b"z"):
        cache.put(k, v)
    assert cache.get(b"x") is None and cache.get(b"z") is v


def test_query_embedding_is_cached(collection: Collection, monkeypatch: pytest.MonkeyPatch) -> None:
    """The second identical query hits the cache; the numeric path never imports fastembed
    (an import here would fail)."""
    monkeypatch.setitem(sys.modules, "fastembed", None)
    svc = RagService(collection.cfg, collection.store)
    params = params_from(
        _query_point(collection), int(collection.points()["t_ms"][-1]), min_similarity=0.5
    )
    first, second = svc.query_patterns(params), svc.query_patterns(params)
    assert (
        not first["metadata"]["embedding_cache_hit"] and second["metadata"]["embedding_cache_hit"]
    )
    assert first["matches"] == second["matches"]


def test_unreachable_qdrant_server_is_32003(collection: Collection) -> None:
    """kind = "qdrant" with nothing listening: the query fails with -32003, naming the cause."""
    from daemon.rag.store import open_store

    store = open_store(StoreSection(kind="qdrant", url="http://127.0.0.1:9", timeout_seconds=1))
    err = _code(RagService(collection.cfg, store), params_from(_query_point(collection), 1))
    assert err.code == -32003 and "refused" in err.data["reason"].lower()
    assert err.message == "Qdrant error" and err.data["store"] == "qdrant"


@pytest.mark.parametrize("seed", range(5))
def test_spacing_equals_greedy_over_every_candidate(seed: int) -> None:
    """The store's spacing is the plain greedy over all candidates, even when one
    long episode of near-identical top scores would exhaust any candidate window."""
    from daemon.rag.store import Hit, distinct
    from daemon.rag.store_embedded import _spaced

    rng = np.random.default_rng(seed)
    t = np.arange(5000, dtype=np.float64) * 300_000
    scores = rng.uniform(0.0, 0.9, 5000).astype(np.float32)
    scores[1000:3000] = 0.99 - rng.uniform(0, 1e-3, 2000).astype(np.float32)  # one episode
    scores[4000] = scores[4100] = 0.95  # a tie: the later moment first
    gap = int(rng.choice([1, 4, 24]) * 3_600_000)
    hits = [Hit(float(scores[i]), {"t_ms": int(t[i])}) for i in range(5000) if scores[i] >= 0.5]
    hits.sort(key=lambda h: (-h.score, -h.payload["t_ms"]))
    want = [h.payload["t_ms"] for h in distinct(hits, gap, 8)]
    assert [int(t[i]) for i in _spaced(scores, t, 0.5, gap, 8)] == want
    assert len(want) == 8
