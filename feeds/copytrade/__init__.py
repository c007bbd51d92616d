"""Copy-trade signal sources: leaders' actions as ``copytrade.signal.*`` events."""

from __future__ import annotations

from feeds.copytrade.tradingview_feed import TradingViewFeed
from feeds.copytrade.webhook import CopytradeWebhookFeed

__all__ = ["CopytradeWebhookFeed", "TradingViewFeed"]
