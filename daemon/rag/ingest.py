"""Bars -> points -> store: incremental, idempotent, with a progress bar.

Every bar past warm-up becomes a point with a deterministic id. Re-running
recomputes everything (cheap, vectorized) and writes only points that are new
or whose revision changed (an outcome whose horizon has now passed, funding or
OI that arrived later), so re-ingesting the same file writes nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from rich.progress import Progress

from daemon.errors import DataFileError, EmbeddingError, StoreError
from daemon.events import now_ms
from daemon.rag.config import RagConfig
from daemon.rag.embedding import Embedder, make_embedder, norm_stats
from daemon.rag.features import (
    OUTCOME_COLUMNS,
    REQUIRED_STATE,
    STATE_COLUMNS,
    TIMEFRAME_MS,
    Bars,
    Observations,
    outcome_columns,
    state_columns,
)
from daemon.rag.schema import (
    FEATURE_VERSION,
    POINT_DTYPE,
    SCHEMA_VERSION,
    VECTORS,
    CollectionMeta,
    derive,
    oi_delta_pct,
    point_id,
    revision,
)
from daemon.rag.store import Store

F64 = NDArray[np.float64]
MIN_COMPLETE_TO_CREATE = 50


@dataclass(frozen=True, slots=True)
class IngestReport:
    bars: int
    points: int
    written: int
    new: int
    unchanged: int
    incomplete: int
    pending_outcomes: int
    seconds: float


def build_points(
    symbol: str,
    timeframe: str,
    bars: Bars,
    funding: Observations | None,
    oi: Observations | None,
    cfg: RagConfig,
) -> tuple[NDArray[np.void], F64]:
    """Points for every bar past warm-up, and their DERIVED feature rows."""
    tf_ms = TIMEFRAME_MS[timeframe]
    hour_ms = 3_600_000
    ex = cfg.exchange
    state = state_columns(
        bars,
        tf_ms,
        funding,
        oi,
        int(ex.max_funding_age_hours * hour_ms),
        int(ex.max_oi_age_hours * hour_ms),
    )
    outcomes = outcome_columns(bars, tf_ms)
    valid = np.logical_and.reduce([np.isfinite(state[c]) for c in REQUIRED_STATE])
    pts = np.zeros(int(valid.sum()), dtype=POINT_DTYPE)
    open_ms = bars.open_ms[valid]
    pts["id"] = [point_id(symbol, timeframe, t) for t in open_ms.tolist()]
    pts["symbol"], pts["timeframe"] = symbol, timeframe
    pts["open_time_ms"], pts["t_ms"] = open_ms, open_ms + tf_ms
    for c in STATE_COLUMNS:
        pts[c] = state[c][valid]
    for c in OUTCOME_COLUMNS:
        pts[c] = outcomes[c][valid]
    pts["oi_delta_pct"] = oi_delta_pct(pts["open_interest_latest"], pts["open_interest_avg_24h"])
    derived = derive({c: pts[c] for c in STATE_COLUMNS})
    # Searchable: the whole state known, and every outcome (a match's outcomes are
    # what the caller wants; a bar whose horizon runs past the data waits for more).
    known = np.column_stack([pts[c] for c in OUTCOME_COLUMNS])
    pts["complete"] = np.isfinite(derived).all(axis=1) & np.isfinite(known).all(axis=1)
    pts["rev"] = revision(pts)
    return pts, derived


def lacking(pts: NDArray[np.void]) -> str:
    """What keeps the bars past warm-up from being complete: how many have no funding
    rate and no open interest known at their time (what a too-small first ingest says)."""
    funding = int((~np.isfinite(pts["funding_rate"])).sum())
    oi = int((~np.isfinite(pts["open_interest_latest"])).sum())
    return (
        f"{len(pts)} bars past the warm-up: {funding} without a funding rate known at "
        f"their time, {oi} without open interest (each file's time range must cover the "
        "candles')"
    )


def ensure_collection(store: Store, derived: F64, cfg: RagConfig, why: str = "") -> CollectionMeta:
    """The collection's metadata, creating it (with frozen stats) on first ingest;
    ``why``: what the bars lack, for the error when too few are complete."""
    meta = store.meta()
    model = cfg.embedding.model
    if meta is None:
        complete = int(np.isfinite(derived).all(axis=1).sum())
        if complete < MIN_COMPLETE_TO_CREATE:
            raise DataFileError(
                f"the first ingest creates the collection and freezes its normalization "
                f"statistics, so it needs at least {MIN_COMPLETE_TO_CREATE} complete bars "
                f"(past the ~200 h warm-up, with funding and open interest); got {complete}"
                + (f" of {why}" if why else "")
            )
        mean, std = norm_stats(derived)
        probe = make_embedder(model, mean, std, cfg.embedding)
        meta = CollectionMeta(
            schema_version=SCHEMA_VERSION,
            feature_version=FEATURE_VERSION,
            embedding_model=model,
            vectors={"full": probe.dims("full"), "core": probe.dims("core")},
            norm_mean=mean,
            norm_std=std,
            created_ms=now_ms(),
        )
        store.create(meta)
        return meta
    if meta.embedding_model != model:
        raise EmbeddingError(
            f"collection was built with embedding {meta.embedding_model!r} but "
            f"rag.embedding.model is {model!r}; use another rag.store.collection_name"
        )
    if meta.feature_version != FEATURE_VERSION or meta.schema_version != SCHEMA_VERSION:
        raise StoreError(
            f"collection has feature version {meta.feature_version} (schema "
            f"{meta.schema_version}); this build writes {FEATURE_VERSION} (schema "
            f"{SCHEMA_VERSION}): use another rag.store.collection_name"
        )
    return meta


def _upsert(
    store: Store,
    pts: NDArray[np.void],
    derived: F64,
    todo: NDArray[np.intp],
    embedder: Embedder,
    label: str,
    progress: bool,
    batch_size: int,
) -> None:
    """Embed and write the rows ``todo`` in batches, with a rich progress bar."""
    step = batch_size or max(len(todo), 1)
    with Progress(disable=not progress) as bar:
        task = bar.add_task(label, total=len(todo))
        for lo in range(0, len(todo), step):
            sel = todo[lo : lo + step]
            store.upsert(pts[sel], {n: embedder.embed(derived[sel], n) for n in VECTORS})
            bar.advance(task, len(sel))


def check_spacing(bars: Bars, timeframe: str) -> None:
    """The bars must be ``timeframe`` apart (the usual spacing; gaps are allowed): a 1h
    file ingested as 5m would store points whose features mean something else."""
    if len(bars) < 2:
        return
    step = int(np.median(np.diff(bars.open_ms)))
    want = TIMEFRAME_MS[timeframe]
    if step != want:
        names = {ms: name for name, ms in TIMEFRAME_MS.items()}
        found = names.get(step, f"{step / 60_000:g} minutes")
        hint = f": pass --timeframe {names[step]}" if step in names else ""
        raise DataFileError(
            f"the bars are {found} apart (the median spacing), not {timeframe}{hint}"
        )


def ingest(
    store: Store,
    symbol: str,
    timeframe: str,
    bars: Bars,
    funding: Observations | None,
    oi: Observations | None,
    cfg: RagConfig,
    *,
    progress: bool = False,
    batch_size: int = 0,
) -> IngestReport:
    """Compute, embed and upsert what changed; ``batch_size`` 0 = one write."""
    started = time.perf_counter()
    check_spacing(bars, timeframe)
    pts, derived = build_points(symbol, timeframe, bars, funding, oi, cfg)
    meta = ensure_collection(store, derived, cfg, lacking(pts))
    embedder = make_embedder(meta.embedding_model, meta.norm_mean, meta.norm_std, cfg.embedding)
    known = store.revisions(symbol, timeframe)
    ids, revs = pts["id"].tolist(), pts["rev"].tolist()
    todo = np.flatnonzero([known.get(i) != r for i, r in zip(ids, revs, strict=True)])
    label = f"ingest {symbol} {timeframe}"
    _upsert(store, pts, derived, todo, embedder, label, progress, batch_size)
    return IngestReport(
        bars=len(bars),
        points=len(pts),
        written=len(todo),
        new=sum(1 for i in ids if i not in known),
        unchanged=len(pts) - len(todo),
        incomplete=int((~np.isfinite(derived).all(axis=1)).sum()),
        pending_outcomes=int((~np.isfinite(pts["outcome_24h"])).sum()),
        seconds=time.perf_counter() - started,
    )
