"""Alert (without waking the agent) when a ticker shows a 24 h drop of CRASH_PCT or worse."""

CRASH_PCT = -8.0


def evaluate(event, state):
    if event["topic"] != "market.price.tick":
        return {"decision": "IGNORE", "reason": "not a tick"}
    change = event["payload"].get("percentChange24h")
    if change is None:
        return {"decision": "IGNORE", "reason": "tick has no 24h change"}
    change = float(change)
    if change > CRASH_PCT:
        return {"decision": "IGNORE", "reason": f"24h change {change:.2f}% above {CRASH_PCT:.1f}%"}
    day = event["ts"][:10]
    return {
        "decision": "ALERT",
        "reason": f"{event.get('symbol')} down {-change:.2f}% in 24h",
        "dedupeKey": f"crash:{event.get('symbol')}:{day}",
        "cooldownSeconds": 3600,
    }
