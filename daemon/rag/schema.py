"""What a stored point is: columns, derived features, ids, collection metadata.

Both stores (embedded numpy and remote Qdrant) hold the same columns, so a
query returns the same matches from either. Missing funding/OI stay NaN in the
columns (``null`` in Qdrant payloads) and mark the point ``complete = False``:
such points are kept (a later ingest with the missing file upgrades them in
place, same id) but never take part in similarity search.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Final

import msgspec
import numpy as np
from numpy.typing import NDArray

from daemon.rag.features import OUTCOME_COLUMNS, STATE_COLUMNS

F64 = NDArray[np.float64]

SCHEMA_VERSION: Final = 1
FEATURE_VERSION: Final = "v1_rsi_macd_ema4h_fund_oi"

# The embedding space: scale-free transforms of the state, so BTC at 20k and at
# 100k (or ETH) with the same shape land close together.
DERIVED: Final = (
    "rsi_7",
    "rsi_14",
    "macd_pct",
    "price_vs_ema20_pct",
    "price_vs_ema20_4h_pct",
    "ema20_vs_ema50_4h_pct",
    "funding_bps",
    "oi_delta_pct",
    "price_change_1h",
    "price_change_4h",
)
# "full" uses every derived feature; "core" leaves out the two optional price
# changes, for queries that do not send them.
VECTORS: Final[dict[str, int]] = {"full": len(DERIVED), "core": len(DERIVED) - 2}

POINT_DTYPE: Final = np.dtype(
    [("id", "<u8"), ("symbol", "<U16"), ("timeframe", "<U4"), ("open_time_ms", "<i8")]
    + [("t_ms", "<i8")]
    + [(c, "<f8") for c in STATE_COLUMNS]
    + [("oi_delta_pct", "<f8")]
    + [(c, "<f8") for c in OUTCOME_COLUMNS]
    + [("complete", "?"), ("rev", "<i8")]
)
PAYLOAD_FIELDS: Final = tuple(n for n in POINT_DTYPE.names or () if n != "id")


class CollectionMeta(msgspec.Struct, frozen=True, kw_only=True):
    """Stored with the collection: how its vectors were made (queries must match)."""

    schema_version: int
    feature_version: str
    embedding_model: str
    vectors: dict[str, int]
    norm_mean: list[float]
    norm_std: list[float]
    created_ms: int


def _pct(a: F64, b: F64) -> F64:
    with np.errstate(divide="ignore", invalid="ignore"):
        return (a / b - 1.0) * 100.0


def oi_delta_pct(latest: F64, avg_24h: F64) -> F64:
    """OI now vs its 24 h average, in percent (NaN when either is missing)."""
    return _pct(latest, avg_24h)


def derive(cols: Mapping[str, F64]) -> F64:
    """The (n, 10) matrix of DERIVED features from state columns."""
    price = cols["price"]
    with np.errstate(divide="ignore", invalid="ignore"):
        macd_pct = cols["macd"] / price * 100.0
    out = [
        cols["rsi_7"],
        cols["rsi_14"],
        macd_pct,
        _pct(price, cols["ema_20"]),
        _pct(price, cols["ema_20_4h"]),
        _pct(cols["ema_20_4h"], cols["ema_50_4h"]),
        cols["funding_rate"] * 1e4,
        oi_delta_pct(cols["open_interest_latest"], cols["open_interest_avg_24h"]),
        cols["price_change_1h"],
        cols["price_change_4h"],
    ]
    return np.column_stack([np.asarray(x, dtype=np.float64) for x in out])


def point_id(symbol: str, timeframe: str, open_time_ms: int) -> int:
    """Deterministic 63-bit id: re-ingesting the same bar overwrites, never duplicates."""
    digest = hashlib.blake2b(f"{symbol}:{timeframe}:{open_time_ms}".encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "big") >> 1


def revision(points: NDArray[np.void]) -> NDArray[np.int64]:
    """A bitmask of what is known about each point; a change means "upsert again"."""
    rev = points["complete"].astype(np.int64)
    names = ("funding_rate", "open_interest_latest", *OUTCOME_COLUMNS)
    for bit, name in enumerate(names, start=1):
        rev |= np.isfinite(points[name]).astype(np.int64) << bit
    return rev
