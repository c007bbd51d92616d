"""Wake the agent when the last two closed candles of the event's series are green."""


def evaluate(event, state):
    if event["topic"] != "market.candle.closed":
        return {"decision": "IGNORE", "reason": "not a candle close"}
    symbol = event.get("symbol")
    timeframe = event.get("timeframe")
    series = state.get("candles", {}).get(symbol, {}).get(timeframe, ())
    if len(series) < 2:
        return {"decision": "IGNORE", "reason": "fewer than two closed candles"}
    prev, last = series[-2], series[-1]
    if prev["close"] > prev["open"] and last["close"] > last["open"]:
        return {
            "decision": "WAKE",
            "reason": "Two consecutive green candles",
            "dedupeKey": f"two_green:{symbol}:{timeframe}:{last['closeTime']}",
            "cooldownSeconds": 60,
        }
    return {"decision": "IGNORE", "reason": "no two green candles in a row"}
