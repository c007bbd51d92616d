"""The text embedding through real fastembed and onnxruntime, on a model the test builds."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from daemon.errors import EmbeddingError
from daemon.rag.config import EmbeddingSection, RagConfig, StoreSection
from daemon.rag.embedding import TextEmbedder, render
from daemon.rag.features import Bars
from daemon.rag.ingest import ingest
from daemon.rag.schema import DERIVED
from daemon.rag.service import RagService
from daemon.rag.store_embedded import EmbeddedStore
from tests.rag import synth
from tests.rag.conftest import TF_MS, observations, params_from
from tests.rag.tiny_model import DIMS, write_hub_cache, write_model

H = 3_600_000


def _cfg(tmp_path: Path, **embedding: Any) -> RagConfig:
    return RagConfig(
        store=StoreSection(path=str(tmp_path / "store"), collection_name="text"),
        embedding=EmbeddingSection(model="bge-small-en-v1.5", **embedding),
    )


def _ingest(cfg: RagConfig) -> EmbeddedStore:
    rows = synth.candles(1200, seed=4, tf=TF_MS)
    fund = synth.funding(int(rows[0, 0]) - 8 * H, int(rows[-1, 0]) + TF_MS)
    oi = synth.open_interest(int(rows[0, 0]) - 24 * H, int(rows[-1, 0]) + TF_MS)
    store = EmbeddedStore(cfg.store.path, cfg.store.collection_name)
    ingest(store, "BTCUSDT", "15m", Bars.from_rows(rows), observations(fund), observations(oi), cfg)
    return store


def _row(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 5, size=(1, len(DERIVED)))


def test_model_directory_end_to_end(tmp_path: Path) -> None:
    """Ingest and query embed with the model in rag.embedding.model_path, and say so."""
    cfg = _cfg(tmp_path, model_path=str(write_model(tmp_path / "bge")))
    store = _ingest(cfg)
    meta = store.meta()
    assert meta is not None
    assert (meta.embedding_model, meta.vectors) == (
        "bge-small-en-v1.5",
        {"full": DIMS, "core": DIMS},
    )
    p = store._snap.points
    point = p[p["complete"]][100]
    params = params_from(point, int(p["t_ms"][-1]), min_similarity=0.5)
    out = RagService(cfg, store).query_patterns(params)
    assert out["metadata"]["embedding_model"] == "bge-small-en-v1.5"
    # The stored state itself is the best match: its text embeds to the same vector.
    assert out["matches"][0]["timestamp"] == int(point["t_ms"])
    assert out["matches"][0]["similarity"] == pytest.approx(1.0, abs=1e-5)
    # A numeric config cannot query a text collection: the embeddings would not compare.
    with pytest.raises(Exception, match="Embedding error"):
        RagService(RagConfig(store=cfg.store), store).query_patterns(params)


def test_embeddings_are_the_models_not_a_fallback(tmp_path: Path) -> None:
    """Unit vectors of the model's width; equal texts agree, different ones do not; a
    different set of weights gives different vectors (the file on disk is what ran)."""
    a = TextEmbedder(EmbeddingSection(model_path=str(write_model(tmp_path / "a", seed=1))))
    b = TextEmbedder(EmbeddingSection(model_path=str(write_model(tmp_path / "b", seed=2))))
    rows = np.vstack([_row(1), _row(1), _row(2)])
    assert render(rows[0], "full") == render(rows[1], "full") != render(rows[2], "full")
    va, vb = a.embed(rows, "full"), b.embed(rows, "full")
    assert va.shape == (3, DIMS) and va.dtype == np.float32
    assert np.linalg.norm(va, axis=1) == pytest.approx(1.0, abs=1e-5)
    assert float(va[0] @ va[1]) == pytest.approx(1.0, abs=1e-5)
    assert float(va[0] @ va[2]) < 0.999
    assert float(va[0] @ vb[0]) < 0.9


def test_hub_cache_directory(tmp_path: Path) -> None:
    """The layout fastembed leaves after a download, found through rag.embedding.cache_dir
    with downloads off."""
    cache = write_hub_cache(tmp_path / "hub")
    emb = TextEmbedder(EmbeddingSection(cache_dir=str(cache)))
    assert emb.embed(_row(3), "core").shape == (1, DIMS)


def test_model_not_on_disk_names_what_to_copy(tmp_path: Path) -> None:
    """Real fastembed, nothing on disk: the error names the place and the files."""
    empty = tmp_path / "nothing"
    empty.mkdir()
    with pytest.raises(
        EmbeddingError, match=r"not available in .*nothing.*tokenizer.json.*model_path"
    ):
        TextEmbedder(EmbeddingSection(model_path=str(empty)))
    with pytest.raises(EmbeddingError, match=r"not available in .*hub"):
        TextEmbedder(EmbeddingSection(cache_dir=str(tmp_path / "hub")))
    with pytest.raises(EmbeddingError, match="not available"):
        _ingest(_cfg(tmp_path, cache_dir=str(tmp_path / "hub")))


def test_fastembed_absent_is_actionable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without fastembed installed, the text model fails with how to fix it."""
    monkeypatch.setitem(sys.modules, "fastembed", None)
    with pytest.raises(EmbeddingError, match=r"pip install 'marketwake\[fastembed\]'.*numeric"):
        _ingest(_cfg(tmp_path, model_path=str(tmp_path)))
