"""Alert (without waking the agent) when the market drops hard.

Two readings of "hard": a ticker whose 24 h change is CRASH_PCT or worse, or a
closed candle that ends WINDOW_DROP_PCT or more below the highest high of the
candles in state (state_candles of them: 50 minutes of 1m candles). One alert
per symbol and day.
"""

CRASH_PCT = -8.0
WINDOW_DROP_PCT = -6.0


def alert(symbol, day, reason):
    return {
        "decision": "ALERT",
        "reason": reason,
        "dedupeKey": f"crash:{symbol}:{day}",
        "cooldownSeconds": 3600,
    }


def on_tick(event):
    change = event["payload"].get("percentChange24h")
    if change is None:
        return {"decision": "IGNORE", "reason": "tick has no 24h change"}
    change = float(change)
    if change > CRASH_PCT:
        return {"decision": "IGNORE", "reason": f"24h change {change:.2f}% above {CRASH_PCT:.1f}%"}
    symbol = event.get("symbol")
    return alert(symbol, event["ts"][:10], f"{symbol} down {-change:.2f}% in 24h")


def on_candle(event, state):
    symbol = event.get("symbol")
    series = state.get("candles", {}).get(symbol, {}).get(event.get("timeframe"), ())
    if len(series) < 10:
        return {"decision": "IGNORE", "reason": "not enough candles"}
    peak = max(c["high"] for c in series)
    drop = (series[-1]["close"] / peak - 1) * 100
    if drop > WINDOW_DROP_PCT:
        return {"decision": "IGNORE", "reason": f"{drop:.2f}% from the window high"}
    reason = f"{symbol} {-drop:.2f}% below its high of the last {len(series)} candles"
    return alert(symbol, event["ts"][:10], reason)


def evaluate(event, state):
    if event["topic"] == "market.price.tick":
        return on_tick(event)
    if event["topic"] == "market.candle.closed":
        return on_candle(event, state)
    return {"decision": "IGNORE", "reason": "not a tick or candle"}
