"""Alert bodies as TradingView renders the documented template, and a poster."""

from __future__ import annotations

import json
import time

import aiohttp

from feeds.copytrade.tradingview import ALERT_TEMPLATE

HOOK_ID = "tv-hook-id-0123456789abcdefghij"


def alert(
    action: str = "buy",
    contracts: float | str = 1,
    market: str = "long",
    prev: str = "flat",
    order_id: str = "Long Entry",
    *,
    size: float | str = "",
    ticker: str = "BINANCE:BTCUSDT",
    close: float | str = 96500.5,
    timenow: str = "2026-11-25T12:00:00Z",
    extra: dict[str, str] | None = None,
) -> bytes:
    """The template with TradingView's placeholders expanded to these values."""
    exchange, _, symbol = ticker.rpartition(":")
    values = {
        "exchange": exchange,
        "ticker": symbol,
        "strategy.order.action": action,
        "strategy.order.contracts": str(contracts),
        "strategy.position_size": str(size),
        "strategy.market_position": market,
        "strategy.prev_market_position": prev,
        "strategy.order.id": order_id,
        "close": str(close),
        "timenow": timenow,
    }
    text = ALERT_TEMPLATE
    for name, value in values.items():
        text = text.replace("{{" + name + "}}", value)
    if extra:
        body = json.loads(text)
        body.update(extra)
        text = json.dumps(body)
    return text.encode()


async def post(
    url: str,
    body: bytes,
    *,
    content_type: str = "application/json",
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, object], float]:
    """Status, JSON answer and seconds it took."""
    started = time.perf_counter()
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            url, data=body, headers={"Content-Type": content_type, **(headers or {})}
        ) as resp,
    ):
        answer = await resp.json(content_type=None)
        return resp.status, answer, time.perf_counter() - started
