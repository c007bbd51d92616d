"""The ``[rag]`` config section (seed 004's server, store and query defaults)."""

from __future__ import annotations

import msgspec


class RagConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Placeholder until the RAG service lands; accepts an empty section."""
