"""Turning a market state into a vector: numeric (default) or fastembed text.

The numeric embedding standardizes the DERIVED features with statistics frozen
when the collection is created (stored in its metadata) and L2-normalizes, so
cosine similarity weighs every feature by how unusual it is. A text model sees
"rsi 83.6" as tokens: nearby numbers are not reliably nearby vectors, and
nothing tells it that 1 bp of funding matters as much as 10 RSI points.
"""

from __future__ import annotations

import importlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Final, Protocol

import numpy as np
from numpy.typing import NDArray

from daemon.errors import EmbeddingError
from daemon.rag.config import EmbeddingSection
from daemon.rag.schema import DERIVED, VECTORS

F32 = NDArray[np.float32]
F64 = NDArray[np.float64]
NUMERIC: Final = "numeric"
BGE_SMALL: Final = "bge-small-en-v1.5"
_FASTEMBED_NAME: Final = "BAAI/bge-small-en-v1.5"
_BGE_DIMS: Final = 384


class Embedder(Protocol):
    """Maps (n, len(DERIVED)) feature rows to unit vectors for one named vector."""

    name: str

    def dims(self, vector: str) -> int: ...

    def embed(self, derived: F64, vector: str) -> F32: ...


def _unit(m: F64) -> F32:
    norms = np.linalg.norm(m, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    out: F32 = (m / norms).astype(np.float32)
    return out


def norm_stats(derived: F64) -> tuple[list[float], list[float]]:
    """Per-column mean and std over finite values (std 0 becomes 1: a constant says nothing)."""
    mean = np.zeros(derived.shape[1])
    std = np.ones(derived.shape[1])
    for k in range(derived.shape[1]):
        col = derived[:, k][np.isfinite(derived[:, k])]
        if len(col):
            mean[k] = col.mean()
            std[k] = col.std() if col.std() > 1e-12 else 1.0
    return [float(x) for x in mean], [float(x) for x in std]


class NumericEmbedder:
    """Standardize with the collection's stats, keep the vector's columns, normalize."""

    name = NUMERIC

    def __init__(self, mean: list[float], std: list[float]) -> None:
        self._mean = np.asarray(mean, dtype=np.float64)
        self._std = np.asarray(std, dtype=np.float64)

    def dims(self, vector: str) -> int:
        return VECTORS[vector]

    def embed(self, derived: F64, vector: str) -> F32:
        # NaN (missing funding/OI) only occurs in incomplete points, which are
        # stored but never searched; 0 keeps their vectors valid for Qdrant.
        z = np.nan_to_num((derived - self._mean) / self._std)
        return _unit(z[:, : VECTORS[vector]])


def render(row: F64, vector: str) -> str:
    """The canonical text of one state (fixed order and rounding, so it is stable)."""
    names = DERIVED[: VECTORS[vector]]
    return "; ".join(
        f"{n.replace('_', ' ')} {v:.2f}" for n, v in zip(names, row[: len(names)], strict=True)
    )


def _fastembed_module() -> Any:
    try:
        return importlib.import_module("fastembed")
    except ImportError:
        raise EmbeddingError(
            "embedding model bge-small-en-v1.5 needs fastembed, which is not installed: "
            "pip install 'marketwake[fastembed]', or set rag.embedding.model = \"numeric\""
        ) from None


class TextEmbedder:
    """fastembed bge-small-en-v1.5 over :func:`render`; loads only from local files.

    ``model_path`` (a directory holding the model's files) wins over ``cache_dir``
    (a Hugging Face cache that fastembed searches); neither is ever downloaded into.
    """

    name = BGE_SMALL

    def __init__(self, section: EmbeddingSection) -> None:
        module = _fastembed_module()
        where = section.model_path or section.cache_dir or "(fastembed's default cache)"
        try:
            self._model = module.TextEmbedding(
                model_name=_FASTEMBED_NAME,
                cache_dir=section.cache_dir or None,
                specific_model_path=section.model_path or None,
                local_files_only=True,
            )
        except Exception as exc:  # noqa: BLE001 - fastembed/onnx raise many types
            raise EmbeddingError(
                f"fastembed model {_FASTEMBED_NAME} is not available in {where}: {exc}. "
                "Copy the model files (model_optimized.onnx, tokenizer.json, "
                "tokenizer_config.json, special_tokens_map.json, config.json) from a machine "
                "with internet into a directory and set rag.embedding.model_path, or set "
                'rag.embedding.model = "numeric"'
            ) from None

    def dims(self, vector: str) -> int:
        return _BGE_DIMS

    def embed(self, derived: F64, vector: str) -> F32:
        texts = [render(row, vector) for row in derived]
        try:
            vectors = np.asarray(list(self._model.embed(texts)), dtype=np.float64)
        except Exception as exc:  # noqa: BLE001 - fastembed/onnx raise many types
            raise EmbeddingError(f"fastembed failed to embed: {exc}") from None
        return _unit(vectors)


def make_embedder(
    model: str, mean: list[float], std: list[float], section: EmbeddingSection
) -> Embedder:
    """The embedder a collection names, loaded from where the config says."""
    if model == NUMERIC:
        return NumericEmbedder(mean, std)
    if model == BGE_SMALL:
        return TextEmbedder(section)
    raise EmbeddingError(f"unknown embedding model {model!r} (expected numeric or {BGE_SMALL})")


class EmbeddingCache:
    """Query embeddings by exact input, with a TTL and a size bound (oldest evicted)."""

    def __init__(
        self, ttl_seconds: float, max_entries: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._ttl, self._max, self._clock = ttl_seconds, max_entries, clock
        self._items: OrderedDict[bytes, tuple[float, F32]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: bytes) -> F32 | None:
        """The cached vector, or None if absent or expired."""
        with self._lock:
            item = self._items.get(key)
            if item is None or self._clock() - item[0] > self._ttl:
                if item is not None:
                    del self._items[key]
                self.misses += 1
                return None
            self.hits += 1
            return item[1]

    def put(self, key: bytes, vector: F32) -> None:
        """Remember a vector; evicts the oldest entries beyond the bound."""
        with self._lock:
            self._items[key] = (self._clock(), vector)
            self._items.move_to_end(key)
            while len(self._items) > self._max:
                self._items.popitem(last=False)
