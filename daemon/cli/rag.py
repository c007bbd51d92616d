"""``marketwake rag ...``: ingest, serve and query similar market states."""

from __future__ import annotations

import click


@click.group("rag")
def rag_group() -> None:
    """Similar historical market states (Qdrant + JSON-RPC 2.0 on TCP 7879)."""
