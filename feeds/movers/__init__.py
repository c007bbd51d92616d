"""The movers scanner: Coinbase products that moved N % in 24 h (seed 002's scanner)."""

from __future__ import annotations

from feeds.movers.feed import MoversFeed

__all__ = ["MoversFeed"]
