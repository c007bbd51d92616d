"""Wake the scanner for a product that moved MIN_MOVE_PCT % or more in 24 h.

The movers feed already filters by its own min_change_pct; this hook is where a
strategy narrows it further (a bigger move, a volume floor) without a restart.
"""

MIN_MOVE_PCT = 5.0
MIN_VOLUME_24H = 0.0


def evaluate(event, state):
    if event["topic"] != "market.movers.detected":
        return {"decision": "IGNORE", "reason": "not a mover"}
    p = event["payload"]
    move = float(p.get("percentChange24h", 0.0))
    volume = float(p.get("volume24h", 0.0))
    if abs(move) < MIN_MOVE_PCT:
        return {"decision": "IGNORE", "reason": f"{move:+.1f}% is under {MIN_MOVE_PCT}%"}
    if volume < MIN_VOLUME_24H:
        return {"decision": "IGNORE", "reason": f"24h volume {volume:g} is too thin"}
    return {
        "decision": "WAKE",
        "reason": f"{event['symbol']} moved {move:+.1f}% in 24h at {p.get('price')} (vol {volume:g})",
        # One analysis per product, direction and day, whatever the feed re-sends.
        "dedupeKey": event["eventId"],
    }
