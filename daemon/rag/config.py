"""The ``[rag]`` config section (seed 004's server, store and query defaults).

Every field has a default so an absent ``[rag]`` section works. Sub-sections:
``rag.server`` (the JSON-RPC listener and its limits), ``rag.store`` (embedded
directory or remote Qdrant), ``rag.embedding`` (numeric or fastembed text),
``rag.query_defaults`` (what a query gets when it leaves a knob out) and
``rag.exchange`` (Binance USD-M REST for ``ingest --from-exchange``).
"""

from __future__ import annotations

from typing import Literal

import msgspec

from daemon.secret import Secret


class _Section(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Shared settings: frozen, keyword-only, typos rejected."""


class ServerSection(_Section, frozen=True):
    host: str = "127.0.0.1"
    port: int = 7879
    max_connections: int = 100
    # One JSON text (a request or a whole batch) may not exceed this many bytes.
    max_request_bytes: int = 1_048_576
    # Per request (a batch counts as one request).
    timeout_ms: int = 10_000
    # A connection that has not completed a request for this long is closed
    # (counted from the last complete request, so dribbling bytes does not help).
    idle_timeout_seconds: float = 30.0
    # "" = no key required. Clients send it as the ``api_key`` member of params.
    api_key: Secret = msgspec.field(default_factory=Secret)
    # Token bucket per client address; 0 disables the limit.
    rate_limit_per_second: float = 1000.0
    rate_limit_burst: int = 2000
    # Worker threads that run queries (numpy releases the GIL for the math).
    worker_threads: int = 4

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError("port must be between 0 and 65535")
        if self.max_connections < 1 or self.max_request_bytes < 64:
            raise ValueError("max_connections must be >= 1 and max_request_bytes >= 64")
        if self.timeout_ms < 1 or self.idle_timeout_seconds <= 0:
            raise ValueError("timeout_ms and idle_timeout_seconds must be positive")
        if self.rate_limit_per_second < 0 or self.rate_limit_burst < 1:
            raise ValueError("rate_limit_per_second must be >= 0 and rate_limit_burst >= 1")
        if self.worker_threads < 1:
            raise ValueError("worker_threads must be >= 1")


class StoreSection(_Section, frozen=True):
    # "embedded": memory-mapped numpy arrays under ``path`` (no server).
    # "qdrant": a Qdrant server at ``url`` through qdrant-client, same schema.
    kind: Literal["embedded", "qdrant"] = "embedded"
    path: str = "state/rag"
    url: str = "http://localhost:6333"
    qdrant_api_key: Secret = msgspec.field(default_factory=Secret)
    collection_name: str = "trading_patterns"
    timeout_seconds: float = 10.0


class EmbeddingSection(_Section, frozen=True):
    # "numeric": standardized feature vector (default, deterministic).
    # "bge-small-en-v1.5": fastembed text embedding of a canonical rendering.
    model: Literal["numeric", "bge-small-en-v1.5"] = "numeric"
    # Where fastembed looks for the model files (never downloads here).
    cache_dir: str = ""
    cache_embeddings: bool = True
    cache_ttl_seconds: float = 300.0
    cache_max_entries: int = 4096


class QueryDefaultsSection(_Section, frozen=True):
    lookback_days: float = 90.0
    top_k: int = 5
    min_similarity: float = 0.7
    min_matches: int = 3
    include_regime_filters: bool = True
    # |OI delta vs 24 h average| below this many percent counts as "flat".
    oi_flat_band_pct: float = 1.0

    def __post_init__(self) -> None:
        if not 1 <= self.lookback_days <= 365 or not 1 <= self.top_k <= 50:
            raise ValueError("lookback_days must be 1..365 and top_k 1..50")
        if not 0.0 <= self.min_similarity <= 1.0 or self.min_matches < 0:
            raise ValueError("min_similarity must be 0..1 and min_matches >= 0")


class ExchangeSection(_Section, frozen=True):
    base_url: str = "https://fapi.binance.com"
    request_timeout_seconds: float = 10.0
    # Funding/OI older than this at a bar's close count as missing.
    max_funding_age_hours: float = 24.0
    max_oi_age_hours: float = 26.0


class RagConfig(_Section, frozen=True):
    """The RAG service: similar historical market states over JSON-RPC 2.0."""

    server: ServerSection = msgspec.field(default_factory=ServerSection)
    store: StoreSection = msgspec.field(default_factory=StoreSection)
    embedding: EmbeddingSection = msgspec.field(default_factory=EmbeddingSection)
    query_defaults: QueryDefaultsSection = msgspec.field(default_factory=QueryDefaultsSection)
    exchange: ExchangeSection = msgspec.field(default_factory=ExchangeSection)
