"""The default store: numpy arrays on disk, memory-mapped, brute-force cosine.

Why not qdrant-client's local mode: it evaluates payload filters in Python
(~350 ms at 50k points, design.md). A filtered brute force over a (n, 10)
float32 matrix is a few boolean masks and one small matmul: ~1 ms at 100k.

Layout: ``<path>/<collection>/gen-<n>/`` holds ``points.npy`` (structured, see
schema.POINT_DTYPE), ``vec_<name>.npy`` and ``meta.json``; ``CURRENT`` names the
live generation and is replaced atomically, so a reader never sees half a write.
A server notices a newer generation on its next query and reloads.
"""

from __future__ import annotations

import itertools
import math
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import numpy as np
from numpy.typing import NDArray

from daemon.errors import NOT_JSON, StoreError
from daemon.rag.schema import PAYLOAD_FIELDS, POINT_DTYPE, VECTORS, CollectionMeta
from daemon.rag.store import F32, Coverage, Hit, QueryFilter, Range

_FILTERABLE = ("t_ms", "oi_delta_pct", "funding_rate")
_RECHECK_SECONDS = 0.25
_GENERATION = re.compile(r"gen-[0-9]{6,}")  # what CURRENT may name
_MAX_PARTITIONS = 64
_OPS = {
    "gt": np.greater,
    "gte": np.greater_equal,
    "lt": np.less,
    "lte": np.less_equal,
}


def _row_payload(row: np.void) -> dict[str, object]:
    out: dict[str, object] = {}
    for name in PAYLOAD_FIELDS:
        v = row[name].item()
        out[name] = None if isinstance(v, float) and math.isnan(v) else v
    return out


@dataclass(frozen=True, slots=True)
class _Partition:
    rows: NDArray[np.int64]
    t: NDArray[np.float64]
    vectors: dict[str, F32]


@dataclass(frozen=True, slots=True)
class _Snapshot:
    gen: str
    meta: CollectionMeta | None
    points: NDArray[np.void]
    vectors: dict[str, F32]
    # Rows are sorted by (symbol, t_ms): a symbol is a slice, a time range a sub-slice.
    slices: dict[str, tuple[int, int]]
    # Contiguous in-RAM copies of the filtered columns (strided record access is slow).
    cols: dict[str, NDArray[np.float64]]
    complete: NDArray[np.bool_]
    partitions: dict[tuple[str, tuple[Range, ...]], _Partition] = field(default_factory=dict)
    covered: list[Coverage] = field(default_factory=list)  # computed on first ask

    @classmethod
    def empty(cls) -> _Snapshot:
        none = np.zeros(0, dtype=np.bool_)
        return cls("", None, np.zeros(0, dtype=POINT_DTYPE), {}, {}, {}, none)

    @classmethod
    def of(
        cls, gen: str, meta: CollectionMeta, points: NDArray[np.void], vectors: dict[str, F32]
    ) -> _Snapshot:
        """Index a loaded generation (raises StoreError if rows are out of order)."""
        sym = points["symbol"]
        t = np.ascontiguousarray(points["t_ms"])
        change = np.flatnonzero(sym[1:] != sym[:-1]) + 1
        bounds = [0, *change.tolist(), len(points)]
        slices = {str(sym[lo]): (lo, hi) for lo, hi in itertools.pairwise(bounds) if hi > lo}
        for lo, hi in slices.values():
            if len(slices) != len(np.unique(sym)) or (np.diff(t[lo:hi]) < 0).any():
                raise StoreError(f"generation {gen}: points are not sorted by symbol, time")
        cols = {f: np.ascontiguousarray(points[f]).astype(np.float64) for f in _FILTERABLE}
        complete = np.ascontiguousarray(points["complete"])
        return cls(gen, meta, points, vectors, slices, cols, complete)


def _narrow(t: NDArray[np.float64], r: Range, lo: int, hi: int) -> tuple[int, int]:
    """Shrink [lo, hi) of the sorted ``t`` to the rows inside the range."""
    if r.gt is not None:
        lo = max(lo, int(np.searchsorted(t, r.gt, side="right")))
    if r.gte is not None:
        lo = max(lo, int(np.searchsorted(t, r.gte, side="left")))
    if r.lt is not None:
        hi = min(hi, int(np.searchsorted(t, r.lt, side="left")))
    if r.lte is not None:
        hi = min(hi, int(np.searchsorted(t, r.lte, side="right")))
    return lo, hi


def _best(scores: F32, t: NDArray[np.float64], min_score: float, k: int) -> list[int]:
    """Indices of the top ``k`` scores >= ``min_score``, best first, later first on ties."""
    sel = np.flatnonzero(scores >= min_score)
    if len(sel) > k:
        sel = sel[np.argpartition(-scores[sel], k - 1)[:k]]
    return [int(i) for i in sel[np.lexsort((-t[sel], -scores[sel]))]]


def _spaced(
    scores: F32, t: NDArray[np.float64], min_score: float, gap_ms: int, k: int
) -> list[int]:
    """Greedy by score: the best remaining point, then nothing within ``gap_ms`` of it.

    ``t`` is sorted, so the points a pick rules out are one slice: k argmax
    passes over the scores and no candidate window that a long episode of
    near-identical neighbours could exhaust. Scanned latest first, so on equal
    scores the later moment wins.
    """
    n = len(scores)
    rev = np.where(scores >= min_score, scores, -np.inf)[::-1].copy()
    picked: list[int] = []
    while len(picked) < k:
        r = int(np.argmax(rev))
        if rev[r] == -np.inf:
            break
        i = n - 1 - r
        picked.append(i)
        a = int(np.searchsorted(t, t[i] - gap_ms, side="right"))
        b = int(np.searchsorted(t, t[i] + gap_ms, side="left"))
        rev[n - b : n - a] = -np.inf
    return picked


class EmbeddedStore:
    """One collection in a directory; whole-collection rewrite per upsert."""

    kind = "embedded"

    def __init__(self, path: str, collection: str) -> None:
        self._dir = Path(path) / collection
        self._snap = _Snapshot.empty()
        self._checked = 0.0
        self._reload(force=True)

    # --- reading -----------------------------------------------------------

    def _current(self) -> str:
        try:
            gen = (self._dir / "CURRENT").read_text().strip()
        except FileNotFoundError:
            return ""
        except (OSError, UnicodeDecodeError) as exc:
            raise StoreError(f"{self._dir}: cannot read CURRENT: {exc}") from None
        if not _GENERATION.fullmatch(gen):
            # Never a path: the next write deletes the generation it names.
            raise StoreError(f"{self._dir}: CURRENT names no generation ({gen[:40]!r})")
        return gen

    def _reload(self, force: bool = False) -> _Snapshot:
        """The current snapshot, loading a newer generation if one was written."""
        now = time.monotonic()
        if not force and now - self._checked < _RECHECK_SECONDS:
            return self._snap
        self._checked = now
        gen = self._current()
        if gen == self._snap.gen:
            return self._snap
        d = self._dir / gen
        try:
            meta = msgspec.json.decode((d / "meta.json").read_bytes(), type=CollectionMeta)
            # asarray drops the np.memmap subclass (slow __getitem__), keeps the mapping.
            points = np.asarray(np.load(d / "points.npy", mmap_mode="r"))
            vectors = {n: np.asarray(np.load(d / f"vec_{n}.npy", mmap_mode="r")) for n in VECTORS}
        except (OSError, ValueError, *NOT_JSON) as exc:
            raise StoreError(f"{d}: cannot load collection: {exc}") from None
        # One reference swap: concurrent readers see either snapshot, never a mix.
        self._snap = _Snapshot.of(gen, meta, points, vectors)
        return self._snap

    def meta(self) -> CollectionMeta | None:
        return self._reload().meta

    def count(self) -> int:
        return len(self._reload().points)

    def has_symbol(self, symbol: str) -> bool:
        return symbol in self._reload().slices

    def coverage(self) -> list[Coverage]:
        snap = self._reload()
        if not snap.covered:
            for symbol, (lo, hi) in sorted(snap.slices.items()):
                done = np.flatnonzero(snap.complete[lo:hi]) + lo
                t = snap.cols["t_ms"]
                cov = Coverage(
                    symbol=symbol,
                    points=hi - lo,
                    searchable=len(done),
                    missing_funding=int(np.isnan(snap.cols["funding_rate"][lo:hi]).sum()),
                    missing_open_interest=int(np.isnan(snap.cols["oi_delta_pct"][lo:hi]).sum()),
                    first_ms=int(t[done[0]]) if len(done) else None,
                    last_ms=int(t[done[-1]]) if len(done) else None,
                )
                snap.covered.append(cov)
        return list(snap.covered)

    def revisions(self, symbol: str, timeframe: str) -> dict[int, int]:
        p = self._reload().points
        sel = (p["symbol"] == symbol) & (p["timeframe"] == timeframe)
        return dict(zip(p["id"][sel].tolist(), p["rev"][sel].tolist(), strict=True))

    def _partition(self, snap: _Snapshot, symbol: str, ranges: tuple[Range, ...]) -> _Partition:
        """Complete rows of ``symbol`` passing the non-time ranges, built once per filter.

        This is the embedded store's payload index: a regime filter (funding
        sign x OI regime) picks one of a handful of partitions, each with its
        own contiguous vectors, so a query is a slice and one small matmul.
        """
        key = (symbol, ranges)
        part = snap.partitions.get(key)
        if part is not None:
            return part
        lo, hi = snap.slices[symbol]
        mask = snap.complete[lo:hi].copy()
        for r in ranges:
            col = snap.cols[r.field][lo:hi]
            for op, bound in (("gt", r.gt), ("gte", r.gte), ("lt", r.lt), ("lte", r.lte)):
                if bound is not None:
                    mask &= _OPS[op](col, bound)
        rows = np.flatnonzero(mask) + lo
        vectors = {n: np.ascontiguousarray(v[rows]) for n, v in snap.vectors.items()}
        part = _Partition(rows, np.ascontiguousarray(snap.cols["t_ms"][rows]), vectors)
        if len(snap.partitions) >= _MAX_PARTITIONS:
            snap.partitions.clear()
        snap.partitions[key] = part
        return part

    def search(
        self,
        vector: str,
        query: F32,
        flt: QueryFilter,
        limit: int,
        min_score: float,
        min_gap_ms: int = 0,
    ) -> list[Hit]:
        snap = self._reload()
        if flt.symbol not in snap.slices or vector not in snap.vectors:
            return []
        time_ranges = [r for r in flt.ranges if r.field == "t_ms"]
        others = tuple(r for r in flt.ranges if r.field != "t_ms")
        part = self._partition(snap, flt.symbol, others)
        lo, hi = 0, len(part.rows)
        for r in time_ranges:  # partitions are time-sorted: a time range is a slice
            lo, hi = _narrow(part.t, r, lo, hi)
        if hi <= lo:
            return []
        scores = part.vectors[vector][lo:hi] @ query.astype(np.float32)
        if min_gap_ms > 0:
            picked = _spaced(scores, part.t[lo:hi], min_score, min_gap_ms, limit)
        else:
            picked = _best(scores, part.t[lo:hi], min_score, limit)
        p = snap.points
        return [Hit(float(scores[i]), _row_payload(p[part.rows[lo + i]])) for i in picked]

    # --- writing -----------------------------------------------------------

    def create(self, meta: CollectionMeta) -> None:
        if self._reload(force=True).meta is not None:
            raise StoreError(f"{self._dir}: collection already exists")
        empty = {n: np.zeros((0, d), dtype=np.float32) for n, d in meta.vectors.items()}
        self._write(meta, np.zeros(0, dtype=POINT_DTYPE), empty)

    def upsert(self, points: NDArray[np.void], vectors: dict[str, F32]) -> None:
        meta = self._reload(force=True).meta
        if meta is None:
            raise StoreError(f"{self._dir}: collection does not exist")
        snap = self._snap
        merged = np.concatenate([np.asarray(snap.points), points])
        vecs = {n: np.concatenate([np.asarray(snap.vectors[n]), vectors[n]]) for n in VECTORS}
        # Keep the last occurrence of each id (the upsert wins), ordered by symbol, time.
        _, first_rev = np.unique(merged["id"][::-1], return_index=True)
        keep = len(merged) - 1 - first_rev
        keep = keep[np.lexsort((merged["t_ms"][keep], merged["symbol"][keep]))]
        self._write(meta, merged[keep], {n: v[keep] for n, v in vecs.items()})

    def _write(self, meta: CollectionMeta, points: NDArray[np.void], vecs: dict[str, F32]) -> None:
        old = self._current()
        gen = f"gen-{int(old.removeprefix('gen-') or 0) + 1:06d}"
        d = self._dir / gen
        try:
            d.mkdir(parents=True, exist_ok=False)
            np.save(d / "points.npy", points)
            for name, v in vecs.items():
                np.save(d / f"vec_{name}.npy", np.ascontiguousarray(v, dtype=np.float32))
            (d / "meta.json").write_bytes(msgspec.json.encode(meta))
            tmp = self._dir / "CURRENT.tmp"
            tmp.write_text(gen)
            os.replace(tmp, self._dir / "CURRENT")
        except OSError as exc:
            raise StoreError(f"{d}: cannot write collection: {exc}") from None
        if old:
            shutil.rmtree(self._dir / old, ignore_errors=True)
        self._reload(force=True)

    def close(self) -> None:
        self._snap = _Snapshot.empty()
