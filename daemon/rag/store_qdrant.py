"""A remote Qdrant server through qdrant-client, with the embedded store's schema.

Kept thin: translate our columns to payloads and our QueryFilter to a Qdrant
Filter, and turn every client exception into StoreError (wire code -32003).
Payload indexes cover what queries filter on. The collection metadata (norm
stats, embedding model) lives in a one-point side collection ``<name>__meta``.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec
import numpy as np
from numpy.typing import NDArray
from qdrant_client import QdrantClient, models

from daemon.errors import StoreError
from daemon.rag.config import StoreSection
from daemon.rag.schema import PAYLOAD_FIELDS, CollectionMeta
from daemon.rag.store import (
    CANDIDATES_PER_MATCH,
    F32,
    MAX_CANDIDATES,
    Coverage,
    Hit,
    QueryFilter,
    distinct,
)

_INDEXES: dict[str, Any] = {
    "symbol": models.PayloadSchemaType.KEYWORD,
    "timeframe": models.PayloadSchemaType.KEYWORD,
    "t_ms": models.PayloadSchemaType.INTEGER,
    "complete": models.PayloadSchemaType.BOOL,
    "oi_delta_pct": models.PayloadSchemaType.FLOAT,
    "funding_rate": models.PayloadSchemaType.FLOAT,
}


def _payload(row: np.void) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in PAYLOAD_FIELDS:
        v = row[name].item()
        out[name] = None if isinstance(v, float) and math.isnan(v) else v
    return out


def _match(key: str, value: Any) -> models.FieldCondition:
    return models.FieldCondition(key=key, match=models.MatchValue(value=value))


def _null(key: str) -> models.IsNullCondition:
    return models.IsNullCondition(is_null=models.PayloadField(key=key))


def to_filter(flt: QueryFilter) -> models.Filter:
    """Our filter as Qdrant's: symbol, complete points only, numeric ranges."""
    must: list[Any] = [_match("symbol", flt.symbol), _match("complete", True)]
    for r in flt.ranges:
        rng = models.Range(gt=r.gt, gte=r.gte, lt=r.lt, lte=r.lte)
        must.append(models.FieldCondition(key=r.field, range=rng))
    return models.Filter(must=must)


class QdrantStore:
    """One collection on a Qdrant server (or any QdrantClient, e.g. ``:memory:``)."""

    kind = "qdrant"

    def __init__(self, client: QdrantClient, collection: str) -> None:
        self._client = client
        self._name = collection
        self._meta_name = f"{collection}__meta"

    @classmethod
    def connect(cls, cfg: StoreSection) -> QdrantStore:
        """A client for ``cfg.url``; nothing is contacted until the first call."""
        try:
            client = QdrantClient(
                url=cfg.url,
                api_key=cfg.qdrant_api_key.reveal() or None,
                timeout=max(1, int(cfg.timeout_seconds)),
                check_compatibility=False,  # no blocking version probe at startup
            )
        except Exception as exc:  # noqa: BLE001 - client construction raises many types
            raise StoreError(f"qdrant {cfg.url}: {exc}") from None
        return cls(client, cfg.collection_name)

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - translate at the adapter, never deeper
            raise StoreError(f"qdrant {what} on {self._name}: {exc}") from None

    def meta(self) -> CollectionMeta | None:
        if not self._call("exists", self._client.collection_exists, self._meta_name):
            return None
        recs = self._call("retrieve", self._client.retrieve, self._meta_name, ids=[0])
        if not recs:
            return None
        return msgspec.json.decode(recs[0].payload["meta"], type=CollectionMeta)

    def create(self, meta: CollectionMeta) -> None:
        vectors = {
            n: models.VectorParams(size=d, distance=models.Distance.COSINE)
            for n, d in meta.vectors.items()
        }
        self._call("create", self._client.create_collection, self._name, vectors_config=vectors)
        for field, schema in _INDEXES.items():
            self._call("index", self._client.create_payload_index, self._name, field, schema)
        one = models.VectorParams(size=1, distance=models.Distance.DOT)
        self._call("create", self._client.create_collection, self._meta_name, vectors_config=one)
        point = models.PointStruct(
            id=0, vector=[1.0], payload={"meta": msgspec.json.encode(meta).decode()}
        )
        self._call("upsert", self._client.upsert, self._meta_name, points=[point])

    def revisions(self, symbol: str, timeframe: str) -> dict[int, int]:
        flt = models.Filter(must=[_match("symbol", symbol), _match("timeframe", timeframe)])
        out: dict[int, int] = {}
        offset: Any = None
        while True:
            recs, offset = self._call(
                "scroll",
                self._client.scroll,
                self._name,
                scroll_filter=flt,
                limit=2048,
                offset=offset,
                with_payload=["rev"],
                with_vectors=False,
            )
            out.update({int(r.id): int(r.payload["rev"]) for r in recs})
            if offset is None:
                return out

    def upsert(self, points: NDArray[np.void], vectors: dict[str, F32]) -> None:
        structs = [
            models.PointStruct(
                id=int(row["id"]),
                vector={n: v[i].tolist() for n, v in vectors.items()},
                payload=_payload(row),
            )
            for i, row in enumerate(points)
        ]
        self._call("upsert", self._client.upsert, self._name, points=structs, wait=True)

    def search(
        self,
        vector: str,
        query: F32,
        flt: QueryFilter,
        limit: int,
        min_score: float,
        min_gap_ms: int = 0,
    ) -> list[Hit]:
        wide = limit if min_gap_ms <= 0 else min(limit * CANDIDATES_PER_MATCH, MAX_CANDIDATES)
        res = self._call(
            "query",
            self._client.query_points,
            self._name,
            query=query.tolist(),
            using=vector,
            query_filter=to_filter(flt),
            limit=wide,
            score_threshold=min_score,
            with_payload=True,
        )
        hits = [Hit(float(p.score), dict(p.payload or {})) for p in res.points]
        hits.sort(key=lambda h: (-h.score, -int(h.payload["t_ms"])))
        return distinct(hits, min_gap_ms, limit) if min_gap_ms > 0 else hits

    def has_symbol(self, symbol: str) -> bool:
        if not self._call("exists", self._client.collection_exists, self._name):
            return False
        flt = models.Filter(must=[_match("symbol", symbol)])
        res = self._call("count", self._client.count, self._name, count_filter=flt, exact=True)
        return int(res.count) > 0

    def _count(self, *must: Any) -> int:
        flt = models.Filter(must=list(must))
        res = self._call("count", self._client.count, self._name, count_filter=flt, exact=True)
        return int(res.count)

    def _edge(self, symbol: str, direction: models.Direction) -> int | None:
        """The first or last searchable close time of ``symbol`` (t_ms is range-indexed)."""
        recs, _ = self._call(
            "scroll",
            self._client.scroll,
            self._name,
            scroll_filter=models.Filter(must=[_match("symbol", symbol), _match("complete", True)]),
            limit=1,
            order_by=models.OrderBy(key="t_ms", direction=direction),
            with_payload=["t_ms"],
            with_vectors=False,
        )
        return int(recs[0].payload["t_ms"]) if recs else None

    def coverage(self) -> list[Coverage]:
        if not self._call("exists", self._client.collection_exists, self._name):
            return []
        facets = self._call(
            "facet", self._client.facet, self._name, "symbol", limit=10_000, exact=True
        )
        out = []
        for symbol in sorted(str(h.value) for h in facets.hits):
            sym = _match("symbol", symbol)
            out.append(
                Coverage(
                    symbol=symbol,
                    points=self._count(sym),
                    searchable=self._count(sym, _match("complete", True)),
                    missing_funding=self._count(sym, _null("funding_rate")),
                    missing_open_interest=self._count(sym, _null("oi_delta_pct")),
                    first_ms=self._edge(symbol, models.Direction.ASC),
                    last_ms=self._edge(symbol, models.Direction.DESC),
                )
            )
        return out

    def count(self) -> int:
        if not self._call("exists", self._client.collection_exists, self._name):
            return 0
        return int(self._call("count", self._client.count, self._name, exact=True).count)

    def close(self) -> None:
        self._call("close", self._client.close)
