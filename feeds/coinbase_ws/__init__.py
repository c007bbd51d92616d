"""Coinbase Advanced Trade WebSocket: shared connection pool and ticker feed."""

from __future__ import annotations

from feeds.coinbase_ws.feed import CoinbaseWsFeed, tick_event
from feeds.coinbase_ws.pool import CoinbaseWsPool, PoolStatistics, Subscription, Tick

__all__ = [
    "CoinbaseWsFeed",
    "CoinbaseWsPool",
    "PoolStatistics",
    "Subscription",
    "Tick",
    "tick_event",
]
