"""Mirror a leader's positions: entries at a fraction of its size, capped; exits of
exactly what was mirrored. One follower order per leader signal is guaranteed by the
daemon (the order is keyed by the signal), so a redelivered signal is harmless.
"""

LEADERS = []  # [] = every leader; else e.g. ["alice"]
SYMBOLS = []  # [] = every symbol; else e.g. ["BTC-USD", "ETH-USD"]
DIRECTIONS = ["long", "short"]
SIZING = "ratio"  # "ratio": RATIO x the leader's quantity; "fixed": FIXED_QUANTITY
RATIO = 0.5
FIXED_QUANTITY = 0.001
MAX_QUANTITY = 0.01  # cap per entry, in base units


def ignore(reason):
    return {"decision": "IGNORE", "reason": reason}


def entry_size(signal):
    if SIZING == "fixed":
        size = FIXED_QUANTITY
    elif signal.get("quantity") is None:
        return 0.0  # sized as a fraction of the leader's equity: not mirrored here
    else:
        size = signal["quantity"] * RATIO
    return min(size, MAX_QUANTITY)


def evaluate(event, state):
    s = event["payload"]
    if LEADERS and s["leader"] not in LEADERS:
        return ignore("not a followed leader: " + s["leader"])
    if SYMBOLS and s["symbol"] not in SYMBOLS:
        return ignore("symbol not followed: " + s["symbol"])
    if s["side"] not in DIRECTIONS:
        return ignore("direction not followed: " + s["side"])
    position = state.get("copytrade", {}).get("position") or {}
    mirrored = position.get("mirrored", {}).get("quantity", 0.0)
    side = "buy" if s["side"] == "long" else "sell"

    if s["kind"] == "opened":
        if position and not position.get("open"):
            return ignore("already closed by the leader: " + s["positionId"])
        size = entry_size(s)
        if size <= 0:
            return ignore("no size to mirror")
        intent = {
            "action": "PLACE_MARKET_ORDER",
            "symbol": s["symbol"],
            "side": side,
            "volume": size,
        }
        if s.get("stopLoss") is not None:
            intent["stopLoss"] = s["stopLoss"]
        if s.get("takeProfit") is not None:
            intent["takeProfit"] = s["takeProfit"]
        return {
            "decision": "TRADE_INTENT",
            "intent": intent,
            "reason": "mirror " + s["leader"] + " " + s["signalId"] + " " + s["side"],
        }

    if s["kind"] == "closed":
        if mirrored <= 0:
            return ignore("nothing mirrored of " + s["positionId"])
        volume = mirrored
        if position.get("open") and s.get("quantity") is not None:
            # a partial close: the same fraction of what we hold
            before = position.get("quantity", 0.0) + s["quantity"]
            volume = mirrored * s["quantity"] / before if before > 0 else mirrored
        return {
            "decision": "TRADE_INTENT",
            "intent": {
                "action": "CLOSE_POSITION",
                "symbol": s["symbol"],
                "volume": round(volume, 8),
            },
            "reason": "close mirrored " + str(round(volume, 8)) + " of " + s["positionId"],
        }

    # modified: new protective levels go to the working stop / take-profit orders
    # the entry spawned (state["orders"]); a size change is not mirrored
    entries = [
        o["clientOrderId"]
        for o in position.get("mirrored", {}).get("orders", {}).values()
        if o["status"] == "FILLED"
    ]
    # (one order action per signal: a new stop-loss first, it bounds the risk)
    for role, key in (("stop_loss", "stopLoss"), ("take_profit", "takeProfit")):
        if s.get(key) is None:
            continue
        for order in state.get("orders", []):
            if order.get("parentId") in entries and order.get("role") == role:
                return {
                    "decision": "TRADE_INTENT",
                    "intent": {
                        "action": "MODIFY_ORDER",
                        "symbol": s["symbol"],
                        "orderId": order["clientOrderId"],
                        key: s[key],
                    },
                    "reason": "follow " + key + " to " + str(s[key]),
                }
    return ignore("modified: nothing of ours to change")
