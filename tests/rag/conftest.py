"""A small ingested collection shared by the RAG tests (15m bars, ~26 days)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from daemon.rag.config import RagConfig, StoreSection
from daemon.rag.features import STATE_COLUMNS, Bars, Observations
from daemon.rag.ingest import ingest
from daemon.rag.store_embedded import EmbeddedStore
from tests.rag import synth

TF_MS = 900_000
N_BARS = 2500
OI_START_BAR = 900


@dataclass
class Collection:
    cfg: RagConfig
    path: Path
    store: EmbeddedStore
    rows: np.ndarray
    funding: np.ndarray
    oi: np.ndarray

    def points(self) -> np.ndarray:
        """The stored points, read straight from the files (independent of the store code)."""
        d = self.path / "trading_patterns"
        gen = (d / "CURRENT").read_text().strip()
        points: np.ndarray = np.load(d / gen / "points.npy")
        return points


def observations(a: np.ndarray) -> Observations:
    return Observations.of(a[:, 0].astype(np.int64), a[:, 1])


def make_collection(path: Path, rows: np.ndarray | None = None, **cfg: Any) -> Collection:
    """Ingest the generated series (or ``rows``) into a fresh embedded store at ``path``."""
    rows = synth.candles(N_BARS, seed=21, tf=TF_MS) if rows is None else rows
    start, end = int(rows[0, 0]), int(rows[-1, 0]) + TF_MS
    fund = synth.funding(start - 8 * 3_600_000, end)
    oi = synth.open_interest(start + OI_START_BAR * TF_MS, end)
    config = RagConfig(store=StoreSection(path=str(path)), **cfg)
    store = EmbeddedStore(str(path), "trading_patterns")
    ingest(
        store, "BTCUSDT", "15m", Bars.from_rows(rows), observations(fund), observations(oi), config
    )
    return Collection(config, path, store, rows, fund, oi)


@pytest.fixture(scope="module")
def collection(tmp_path_factory: pytest.TempPathFactory) -> Collection:
    """One collection per test module."""
    return make_collection(tmp_path_factory.mktemp("rag"))


def params_from(point: np.void, timestamp: int, **query_config: Any) -> dict[str, Any]:
    """A query_patterns params object whose current_state is a stored point's state."""
    state = {c: float(point[c]) for c in STATE_COLUMNS}
    return {
        "symbol": "BTCUSDT",
        "timestamp": timestamp,
        "current_state": state,
        "query_config": {"lookback_days": 365, **query_config},
    }
