"""Propose a limit buy after a doji that follows a red candle (a possible reversal).

A doji is a candle whose body is at most a tenth of its range. The order sits
at the doji's close, with the stop below its low and a 2:1 take-profit. It is
sized in quote currency (NOTIONAL), so it fits agent.toml's max_order_notional
at any price (0.01 BTC was 1,000 USD at 100k).
"""

import math

BODY_RATIO = 0.1
NOTIONAL = 250.0  # quote currency per order; keep it below [risk] max_order_notional


def is_doji(candle):
    rng = candle["high"] - candle["low"]
    return rng > 0 and abs(candle["close"] - candle["open"]) <= BODY_RATIO * rng


def evaluate(event, state):
    if event["topic"] != "market.candle.closed":
        return {"decision": "IGNORE", "reason": "not a candle close"}
    symbol = event.get("symbol")
    series = state.get("candles", {}).get(symbol, {}).get(event.get("timeframe"), ())
    if len(series) < 2:
        return {"decision": "IGNORE", "reason": "not enough candles"}
    prev, doji = series[-2], series[-1]
    if not (prev["close"] < prev["open"] and is_doji(doji)):
        return {"decision": "IGNORE", "reason": "no doji after a red candle"}
    entry = doji["close"]
    stop = doji["low"] - 0.001 * entry
    risk = entry - stop
    take = entry + 2 * risk
    return {
        "decision": "TRADE_INTENT",
        "reason": "Doji reversal pattern detected",
        "intent": {
            "action": "PLACE_LIMIT_ORDER",
            "symbol": symbol,
            "side": "buy",
            "volume": math.floor(NOTIONAL / entry * 1e6) / 1e6,
            "openPrice": entry,
            "stopLoss": math.floor(stop * 100) / 100,
            "takeProfit": math.ceil(take * 100) / 100,
        },
        "dedupeKey": f"doji:{symbol}:{doji['closeTime']}",
        "cooldownSeconds": 300,
    }
