"""The store contract both engines implement, and the filter a query sends."""

from __future__ import annotations

from typing import Any, Protocol

import msgspec
import numpy as np
from numpy.typing import NDArray

from daemon.errors import StoreError
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


class Coverage(msgspec.Struct, frozen=True, kw_only=True):
    """What a store holds for one symbol: for ``rag.health`` and -32001's advice.

    Only complete points (funding and open interest known) are searchable;
    ``first_ms``/``last_ms`` bound the searchable bars' close times.
    """

    symbol: str
    points: int
    searchable: int
    missing_funding: int
    missing_open_interest: int
    first_ms: int | None
    last_ms: int | None


class Hit(msgspec.Struct, frozen=True):
    score: float
    payload: dict[str, Any]


def distinct(hits: list[Hit], gap_ms: int, k: int) -> list[Hit]:
    """Up to ``k`` of ``hits`` (best first), each at least ``gap_ms`` from every one
    already taken, greedy by similarity: k different moments, not one episode k times."""
    taken: list[int] = []
    out: list[Hit] = []
    for hit in hits:
        t = int(hit.payload["t_ms"])
        if all(abs(t - u) >= gap_ms for u in taken):
            taken.append(t)
            out.append(hit)
            if len(out) == k:
                break
    return out


# A remote engine is asked for this many candidates per wanted match when matches
# must be min_gap apart (an episode yields many near-identical neighbours).
CANDIDATES_PER_MATCH = 20
MAX_CANDIDATES = 1000


class Store(Protocol):
    """Embedded numpy or remote Qdrant: same columns, same answers."""

    kind: str  # "embedded" or "qdrant", named in errors

    def meta(self) -> CollectionMeta | None: ...

    def create(self, meta: CollectionMeta) -> None: ...

    def revisions(self, symbol: str, timeframe: str) -> dict[int, int]: ...

    def upsert(self, points: NDArray[np.void], vectors: dict[str, F32]) -> None: ...

    def search(
        self,
        vector: str,
        query: F32,
        flt: QueryFilter,
        limit: int,
        min_score: float,
        min_gap_ms: int = 0,
    ) -> list[Hit]:
        """Up to ``limit`` hits scoring >= ``min_score``, best first (later first on
        ties), each at least ``min_gap_ms`` from every better one taken."""
        ...

    def has_symbol(self, symbol: str) -> bool: ...

    def coverage(self) -> list[Coverage]:
        """Per symbol, sorted by symbol."""
        ...

    def count(self) -> int: ...

    def close(self) -> None: ...


def open_store(cfg: StoreSection) -> Store:
    """The engine the config names (imports the remote adapter only when asked)."""
    if cfg.kind == "qdrant":
        from daemon.rag.store_qdrant import QdrantStore

        return QdrantStore.connect(cfg)
    from daemon.rag.store_embedded import EmbeddedStore

    if not cfg.path:  # a loaded Config sets it; never a store in the working directory
        raise StoreError("[rag.store] path is not set (the embedded store's directory)")
    return EmbeddedStore(cfg.path, cfg.collection_name)
