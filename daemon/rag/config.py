"""The ``[rag]`` config section (seed 004's server, store and query defaults).

Every field has a default so an absent ``[rag]`` section works. Sub-sections:
``rag.server`` (the JSON-RPC listener and its limits), ``rag.store`` (embedded
directory or remote Qdrant), ``rag.embedding`` (numeric or fastembed text),
``rag.query_defaults`` (what a query gets when it leaves a knob out) and
``rag.exchange`` (Binance USD-M REST for ``ingest --from-exchange``).
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from daemon.secret import Secret


class _Section(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Shared settings: frozen, keyword-only, typos rejected."""


class ServerSection(_Section, frozen=True):
    host: str = "127.0.0.1"
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 7879
    max_connections: Annotated[int, msgspec.Meta(ge=1)] = 100
    # One JSON text (a request or a whole batch) may not exceed this many bytes.
    max_request_bytes: Annotated[int, msgspec.Meta(ge=64)] = 1_048_576
    # Per request (a batch counts as one request).
    timeout_ms: Annotated[int, msgspec.Meta(ge=1)] = 10_000
    # A connection that has not completed a request for this long is closed
    # (counted from the last complete request, so dribbling bytes does not help).
    idle_timeout_seconds: Annotated[float, msgspec.Meta(gt=0)] = 30.0
    # Once a request's first byte arrived, the rest must follow within this.
    request_read_seconds: Annotated[float, msgspec.Meta(gt=0)] = 5.0
    # Calls in one batch (a longer batch is one -32600 error).
    max_batch: Annotated[int, msgspec.Meta(ge=1, le=100_000)] = 100
    # One answer (a response or a whole batch's) may not exceed this: results are
    # then replaced by a -32000 error naming the size, never truncated.
    max_response_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 4 * 1024 * 1024
    # "" = no key required. Clients send it as the ``api_key`` member of params.
    api_key: Secret = msgspec.field(default_factory=Secret)
    # Token bucket per client address; 0 disables the limit.
    rate_limit_per_second: Annotated[float, msgspec.Meta(ge=0)] = 1000.0
    rate_limit_burst: Annotated[int, msgspec.Meta(ge=1)] = 2000
    # Worker threads that run queries (numpy releases the GIL for the math).
    worker_threads: Annotated[int, msgspec.Meta(ge=1)] = 4


class StoreSection(_Section, frozen=True):
    # "embedded": memory-mapped numpy arrays under ``path`` (no server).
    # "qdrant": a Qdrant server at ``url`` through qdrant-client, same schema.
    kind: Literal["embedded", "qdrant"] = "embedded"
    path: str = ""  # "" = <[daemon] state_dir>/rag (set when the config is loaded)
    url: str = "http://localhost:6333"
    qdrant_api_key: Secret = msgspec.field(default_factory=Secret)
    collection_name: str = "trading_patterns"
    timeout_seconds: float = 10.0


class EmbeddingSection(_Section, frozen=True):
    # "numeric": standardized feature vector (default, deterministic).
    # "bge-small-en-v1.5": fastembed text embedding of a canonical rendering.
    model: Literal["numeric", "bge-small-en-v1.5"] = "numeric"
    # A directory holding the text model's files (wins over cache_dir).
    model_path: str = ""
    # A Hugging Face cache where fastembed looks for the model (never downloads).
    cache_dir: str = ""
    cache_embeddings: bool = True
    cache_ttl_seconds: Annotated[float, msgspec.Meta(ge=0)] = 300.0
    cache_max_entries: Annotated[int, msgspec.Meta(ge=0, le=1_000_000)] = 4096


class QueryDefaultsSection(_Section, frozen=True):
    lookback_days: Annotated[float, msgspec.Meta(ge=1, le=365)] = 90.0
    top_k: Annotated[int, msgspec.Meta(ge=1, le=50)] = 5
    min_similarity: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.7
    min_matches: Annotated[int, msgspec.Meta(ge=0)] = 3
    include_regime_filters: bool = True
    # |OI delta vs 24 h average| below this many percent counts as "flat".
    oi_flat_band_pct: Annotated[float, msgspec.Meta(ge=0)] = 1.0
    # Purge: a point is a candidate only once all its outcome horizons had passed at
    # the query time (t + embargo <= timestamp), so every returned outcome is known and
    # the query's own recent past is never a match.
    embargo_hours: Annotated[float, msgspec.Meta(ge=0, le=24 * 365)] = 24.0
    # Matches are at least this far apart (greedy by similarity): top_k distinct moments.
    min_gap_hours: Annotated[float, msgspec.Meta(ge=0, le=24 * 365)] = 4.0
    # The agents' query_similar_patterns tool computes the live state on candles of
    # this timeframe: the one the store was ingested at.
    timeframe: Literal["1m", "3m", "5m", "15m", "30m", "1h"] = "5m"


class ExchangeSection(_Section, frozen=True):
    base_url: str = "https://fapi.binance.com"
    request_timeout_seconds: Annotated[float, msgspec.Meta(gt=0)] = 10.0
    # Funding/OI older than this at a bar's close count as missing.
    max_funding_age_hours: Annotated[float, msgspec.Meta(gt=0)] = 24.0
    max_oi_age_hours: Annotated[float, msgspec.Meta(gt=0)] = 26.0
    # The query_similar_patterns tool reads funding / open interest from these files
    # (the CSVs `rag ingest --funding / --open-interest` takes) instead of asking the
    # exchange: a replay or backtest offline. Each value is used only from the time
    # it was known; "" = the exchange.
    funding_file: str = ""
    open_interest_file: str = ""


class RagConfig(_Section, frozen=True):
    """The RAG service: similar historical market states over JSON-RPC 2.0."""

    server: ServerSection = msgspec.field(default_factory=ServerSection)
    store: StoreSection = msgspec.field(default_factory=StoreSection)
    embedding: EmbeddingSection = msgspec.field(default_factory=EmbeddingSection)
    query_defaults: QueryDefaultsSection = msgspec.field(default_factory=QueryDefaultsSection)
    exchange: ExchangeSection = msgspec.field(default_factory=ExchangeSection)
