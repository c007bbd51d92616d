"""RAG-specific members of the one exception tree (daemon/errors.py)."""

from __future__ import annotations

from daemon.errors import MarketwakeError


class EmbeddingError(MarketwakeError):
    """An embedding could not be produced (model missing, mismatch with the collection)."""

    exit_code = 2
    rpc_code = -32004


class DataFileError(MarketwakeError):
    """An input CSV (candles, funding, open interest) is missing or malformed."""

    exit_code = 2
