"""The store contract both engines implement, and the filter a query sends."""

from __future__ import annotations

from typing import Any, Protocol

import msgspec
import numpy as np
from numpy.typing import NDArray

from daemon.rag.config import StoreSection
from daemon.rag.schema import CollectionMeta

F32 = NDArray[np.float32]


class Range(msgspec.Struct, frozen=True, kw_only=True):
    """A numeric payload condition (Qdrant's Range: any of gt/gte/lt/lte)."""

    field: str
    gt: float | None = None
    gte: float | None = None
    lt: float | None = None
    lte: float | None = None


class QueryFilter(msgspec.Struct, frozen=True, kw_only=True):
    """Only complete points of ``symbol`` with ``t_ms`` in the ranges are searched."""

    symbol: str
    ranges: tuple[Range, ...] = ()


class Hit(msgspec.Struct, frozen=True):
    score: float
    payload: dict[str, Any]


class Store(Protocol):
    """Embedded numpy or remote Qdrant: same columns, same answers."""

    def meta(self) -> CollectionMeta | None: ...

    def create(self, meta: CollectionMeta) -> None: ...

    def revisions(self, symbol: str, timeframe: str) -> dict[int, int]: ...

    def upsert(self, points: NDArray[np.void], vectors: dict[str, F32]) -> None: ...

    def search(
        self, vector: str, query: F32, flt: QueryFilter, limit: int, min_score: float
    ) -> list[Hit]: ...

    def has_symbol(self, symbol: str) -> bool: ...

    def count(self) -> int: ...

    def close(self) -> None: ...


def open_store(cfg: StoreSection) -> Store:
    """The engine the config names (imports the remote adapter only when asked)."""
    if cfg.kind == "qdrant":
        from daemon.rag.store_qdrant import QdrantStore

        return QdrantStore.connect(cfg)
    from daemon.rag.store_embedded import EmbeddedStore

    return EmbeddedStore(cfg.path, cfg.collection_name)
