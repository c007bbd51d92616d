"""Coinbase Advanced Trade messages as its WebSocket sends them (string numbers), for
the benchmarks' loopback servers."""

from __future__ import annotations

import json
from typing import Any

from daemon.events import iso_ms, now_ms


def _message(channel: str, seq: int, events: list[dict[str, Any]]) -> str:
    return json.dumps(
        {
            "channel": channel,
            "client_id": "",
            "timestamp": iso_ms(now_ms()),
            "sequence_num": seq,
            "events": events,
        }
    )


def ticker_frame(seq: int, product: str, price: str, change_24h: str = "-2.5") -> str:
    """One ticker ``update`` of ``product`` at ``price`` (its 24 h change in percent)."""
    ticker = {
        "type": "ticker", "product_id": product, "price": price, "volume_24_h": "10.5",
        "low_24_h": "1", "high_24_h": "999999", "low_52_w": "", "high_52_w": "1000000",
        "price_percent_chg_24_h": change_24h, "best_bid": price, "best_ask": price,
        "best_bid_quantity": "0.1", "best_ask_quantity": "0.2",
    }  # fmt: skip
    return _message("ticker", seq, [{"type": "update", "tickers": [ticker]}])


def subscriptions_ack(seq: int, request: dict[str, Any]) -> str:
    """The ``subscriptions`` answer to a (un)subscribe ``request``."""
    channel = request.get("channel")
    ack = {"subscriptions": {channel: request.get("product_ids") or [channel]}}
    return _message("subscriptions", seq, [ack])
