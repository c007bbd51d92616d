"""``query_patterns``: the one function both the server and in-process callers use.

Everything a client can see (matches, statistics, metadata, errors as
RpcError with the seed's codes) is decided here, so the agent's tool gets the
same answer whether it calls this directly or goes through TCP 7879.

No look-ahead at query time either: only points whose bar closed at or before
the query ``timestamp`` are searched, and an outcome is reported only if its
horizon had passed by then (otherwise ``null``).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import numpy as np

from daemon.errors import EmbeddingError, MarketwakeError, RpcError, StoreError
from daemon.rag.config import QueryDefaultsSection, RagConfig
from daemon.rag.embedding import Embedder, EmbeddingCache, make_embedder
from daemon.rag.features import DAY_MS, H4_MS, HOUR_MS
from daemon.rag.params import (
    CurrentState,
    QueryConfig,
    QueryParams,
    ignored_fields,
    parse_params,
)
from daemon.rag.schema import CollectionMeta, derive, oi_delta_pct
from daemon.rag.statistics import outcome_stats
from daemon.rag.store import Coverage, QueryFilter, Range, Store

SUGGESTION: Final = (
    "Try increasing lookback_days, reducing min_similarity or min_gap_hours, "
    "or setting include_regime_filters to false"
)
STORE_ERROR: Final = {"embedded": "Embedded store error", "qdrant": "Qdrant error"}
# When each outcome becomes known, relative to the bar close.
HORIZON_MS: Final = {
    "outcome_1h": HOUR_MS,
    "outcome_4h": H4_MS,
    "outcome_24h": DAY_MS,
    "max_runup_1h": HOUR_MS,
    "max_drawdown_1h": HOUR_MS,
    "hit_stop_loss": H4_MS,
    "hit_take_profit": H4_MS,
}


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 3)


def _iso(t_ms: int) -> str:
    return datetime.fromtimestamp(t_ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def regime_ranges(state: CurrentState, flat_band_pct: float) -> tuple[Range, Range]:
    """Same OI regime (rising / flat / falling vs 24 h avg) and same funding sign."""
    delta = float(
        oi_delta_pct(
            np.array([state.open_interest_latest]), np.array([state.open_interest_avg_24h])
        )[0]
    )
    b = flat_band_pct
    if delta > b:
        oi = Range(field="oi_delta_pct", gt=b)
    elif delta < -b:
        oi = Range(field="oi_delta_pct", lt=-b)
    else:
        oi = Range(field="oi_delta_pct", gte=-b, lte=b)
    f = state.funding_rate
    if f > 0:
        funding = Range(field="funding_rate", gt=0.0)
    elif f < 0:
        funding = Range(field="funding_rate", lt=0.0)
    else:
        funding = Range(field="funding_rate", gte=0.0, lte=0.0)
    return oi, funding


def _match(hit_score: float, p: dict[str, Any], query_ms: int) -> dict[str, Any]:
    t = int(p["t_ms"])
    outcomes: dict[str, Any] = {}
    for name, horizon in HORIZON_MS.items():
        v = p.get(name)
        known = v is not None and t + horizon <= query_ms
        outcomes[name] = (bool(v) if name.startswith("hit_") else v) if known else None
    return {
        "similarity": round(min(max(hit_score, 0.0), 1.0), 6),
        "timestamp": t,
        "date": _iso(t),
        "market_state": {
            "rsi_7": p["rsi_7"],
            "rsi_14": p["rsi_14"],
            "macd": p["macd"],
            "ema_ratio": p["ema_20_4h"] / p["ema_50_4h"],
            "oi_delta_pct": p["oi_delta_pct"],
            "funding_rate": p["funding_rate"],
        },
        "outcomes": outcomes,
    }


def _coverage(c: Coverage) -> dict[str, Any]:
    return {
        "points": c.points,
        "searchable": c.searchable,
        "incomplete": c.points - c.searchable,
        "missing_funding": c.missing_funding,
        "missing_open_interest": c.missing_open_interest,
        "first": _iso(c.first_ms) if c.first_ms is not None else None,
        "last": _iso(c.last_ms) if c.last_ms is not None else None,
    }


def advice(cov: Coverage | None, lo: int, hi: int, embargo_hours: float) -> str:
    """Which change would help, given what the store covers and the searched window."""
    if cov is None or cov.first_ms is None or cov.last_ms is None:
        return (
            "the store has no searchable points for this symbol (each needs funding, open "
            "interest and 24 h of later candles): ingest with --funding and --open-interest"
        )
    if hi < cov.first_ms:
        return (
            f"the store's searchable data for {cov.symbol} starts at {_iso(cov.first_ms)}; "
            f"query a timestamp after {_iso(cov.first_ms + int(embargo_hours * 3_600_000))} "
            "(matches must be embargo_hours before the query), or ingest older data"
        )
    if lo >= cov.last_ms:
        days = (hi - cov.last_ms) / DAY_MS
        wider = f" or raise lookback_days above {days:.0f}" if days < 365 else ""
        return (
            f"the store's searchable data for {cov.symbol} ends at {_iso(cov.last_ms)}, "
            f"before the lookback window; ingest newer data{wider}"
        )
    return SUGGESTION


@dataclass(frozen=True, slots=True)
class Knobs:
    """The query_config actually used: the request's values over the config defaults."""

    lookback_days: float
    top_k: int
    min_similarity: float
    regime: bool
    min_matches: int
    min_gap_hours: float

    @classmethod
    def resolve(cls, qc: QueryConfig | None, d: QueryDefaultsSection) -> Knobs:
        qc = qc or QueryConfig()
        return cls(
            lookback_days=d.lookback_days if qc.lookback_days is None else qc.lookback_days,
            top_k=d.top_k if qc.top_k is None else int(qc.top_k),
            min_similarity=d.min_similarity if qc.min_similarity is None else qc.min_similarity,
            regime=d.include_regime_filters
            if qc.include_regime_filters is None
            else qc.include_regime_filters,
            min_matches=d.min_matches if qc.min_matches is None else int(qc.min_matches),
            min_gap_hours=d.min_gap_hours if qc.min_gap_hours is None else qc.min_gap_hours,
        )


class RagService:
    """Holds the store, the embedder matching the collection, and the query cache."""

    def __init__(self, cfg: RagConfig, store: Store) -> None:
        self._cfg = cfg
        self._store = store
        emb = cfg.embedding
        self._cache = EmbeddingCache(emb.cache_ttl_seconds, emb.cache_max_entries)
        self._embedder: tuple[int, Embedder] | None = None
        self._lock = threading.Lock()

    def close(self) -> None:
        """Close the store."""
        self._store.close()

    @property
    def cache(self) -> EmbeddingCache:
        return self._cache

    def query_patterns(self, params: Any) -> dict[str, Any]:
        """Validate, embed, search, summarize; every failure is an RpcError."""
        try:
            return self._query(parse_params(params), ignored_fields(params))
        except RpcError:
            raise
        except StoreError as exc:
            raise self._store_error(exc) from None
        except MarketwakeError as exc:  # each error class carries its JSON-RPC code
            raise RpcError(exc.rpc_code, exc.rpc_message, {"reason": str(exc)}) from None
        except Exception as exc:  # noqa: BLE001 - a query must never take the server down
            raise RpcError(-32000, "Server error", {"reason": type(exc).__name__}) from None

    def _store_error(self, exc: StoreError) -> RpcError:
        """-32003 naming the engine, so "Qdrant error" never blames a server that is not there."""
        kind = self._store.kind
        data = {"reason": str(exc), "store": kind}
        return RpcError(exc.rpc_code, STORE_ERROR.get(kind, exc.rpc_message), data)

    def health(self, params: Any = None) -> dict[str, Any]:
        """Liveness and what is loaded and searchable (for operators; takes no params)."""
        try:
            meta = self._store.meta()
            points = self._store.count()
            covered = self._store.coverage()
        except StoreError as exc:
            raise self._store_error(exc) from None
        return {
            "status": "ok",
            "store": self._store.kind,
            "points": points,
            "searchable": sum(c.searchable for c in covered),
            "symbols": {c.symbol: _coverage(c) for c in covered},
            "embedding_model": meta.embedding_model if meta else None,
            "feature_version": meta.feature_version if meta else None,
            "cache": {"hits": self._cache.hits, "misses": self._cache.misses},
        }

    def _meta(self) -> CollectionMeta:
        meta = self._store.meta()
        if meta is None:
            raise StoreError("collection does not exist yet: run `marketwake rag ingest` first")
        if meta.embedding_model != self._cfg.embedding.model:
            raise EmbeddingError(
                f"collection was built with {meta.embedding_model!r}, "
                f"rag.embedding.model is {self._cfg.embedding.model!r}"
            )
        return meta

    def _embedder_for(self, meta: CollectionMeta) -> Embedder:
        with self._lock:
            if self._embedder is None or self._embedder[0] != meta.created_ms:
                emb = make_embedder(
                    meta.embedding_model,
                    meta.norm_mean,
                    meta.norm_std,
                    self._cfg.embedding,
                )
                self._embedder = (meta.created_ms, emb)
            return self._embedder[1]

    def _embed(self, meta: CollectionMeta, state: CurrentState) -> tuple[str, Any, bool]:
        full = state.price_change_1h is not None and state.price_change_4h is not None
        vector = "full" if full else "core"
        cols = {
            k: np.array([getattr(state, k) or 0.0], dtype=np.float64)
            for k in state.__struct_fields__
        }
        derived = derive(cols)
        key = f"{vector}:{meta.created_ms}:".encode() + derived.tobytes()
        cached = self._cache.get(key) if self._cfg.embedding.cache_embeddings else None
        if cached is not None:
            return vector, cached, True
        vec = self._embedder_for(meta).embed(derived, vector)[0]
        if self._cfg.embedding.cache_embeddings:
            self._cache.put(key, vec)
        return vector, vec, False

    def _query(self, p: QueryParams, ignored: list[str]) -> dict[str, Any]:
        started = time.perf_counter()
        knobs = Knobs.resolve(p.query_config, self._cfg.query_defaults)
        meta = self._meta()
        if not self._store.has_symbol(p.symbol):
            raise RpcError(-32002, "Symbol not found", {"symbol": p.symbol})
        t_embed = time.perf_counter()
        vector, qvec, cache_hit = self._embed(meta, p.current_state)
        t_search = time.perf_counter()
        flt, applied = self._filter(p, knobs)
        gap_ms = int(knobs.min_gap_hours * 3_600_000)
        hits = self._store.search(vector, qvec, flt, knobs.top_k, knobs.min_similarity, gap_ms)
        t_done = time.perf_counter()
        required = min(knobs.min_matches, knobs.top_k)
        if len(hits) < required:
            raise self._insufficient(p, knobs, flt, len(hits), required)
        matches = [_match(h.score, h.payload, int(p.timestamp)) for h in hits]
        metadata = {
            "query_duration_ms": _ms(time.perf_counter() - started),
            "embedding_duration_ms": _ms(t_search - t_embed),
            "retrieval_duration_ms": _ms(t_done - t_search),
            "filters_applied": applied,
            "schema_version": meta.schema_version,
            "feature_version": meta.feature_version,
            "embedding_model": meta.embedding_model,
            "vector": vector,
            "embedding_cache_hit": cache_hit,
            "embargo_hours": self._cfg.query_defaults.embargo_hours,
            "min_gap_hours": knobs.min_gap_hours,
            "ignored_fields": ignored,
        }
        return {"matches": matches, "statistics": outcome_stats(matches), "metadata": metadata}

    def _insufficient(
        self, p: QueryParams, knobs: Knobs, flt: QueryFilter, found: int, required: int
    ) -> RpcError:
        """-32001 saying what the store covers for the symbol and what would help."""
        cov = next((c for c in self._store.coverage() if c.symbol == p.symbol), None)
        window = flt.ranges[0]  # the time range, always first
        lo, hi = int(window.gt or 0), int(window.lte or 0)
        data: dict[str, Any] = {
            "matches_found": found,
            "min_required": required,
            "window": {"from": _iso(lo), "to": _iso(hi)},
            "suggestion": advice(cov, lo, hi, self._cfg.query_defaults.embargo_hours),
        }
        if cov is not None:
            data["coverage"] = _coverage(cov)
        return RpcError(-32001, "Insufficient matches found", data)

    def _filter(self, p: QueryParams, knobs: Knobs) -> tuple[QueryFilter, list[str]]:
        """Symbol, the lookback window ending at the query time, and the regime."""
        now = int(p.timestamp)
        # Purge: only points whose outcome horizons had all passed at the query time.
        known_by = now - int(self._cfg.query_defaults.embargo_hours * 3_600_000)
        ranges = [Range(field="t_ms", gt=now - knobs.lookback_days * DAY_MS, lte=known_by)]
        applied = ["symbol", "timerange"]
        if knobs.regime:
            band = self._cfg.query_defaults.oi_flat_band_pct
            ranges.extend(regime_ranges(p.current_state, band))
            applied += ["oi_delta", "funding_sign"]
        return QueryFilter(symbol=p.symbol, ranges=tuple(ranges)), applied
