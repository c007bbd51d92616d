"""Coinbase public REST candles: sans-I/O protocol, SQLite high-water marks, the poller."""

from __future__ import annotations

from feeds.candles.poller import CandlesFeed

__all__ = ["CandlesFeed"]
