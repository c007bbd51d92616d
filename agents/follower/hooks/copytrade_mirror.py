"""Mirror a leader's positions at the size agent.toml [copytrade] sets.

The daemon gives each leader position in state["copytrade"] a ``target`` (what
this follower should hold of it, by the sizing rules of agent.toml) and
``mirrored`` (what its orders for it hold now). Entries and adds buy up to the
target, closes sell down to it (a partial close keeps the leader's proportion,
a full close sells exactly what was mirrored), and a moved stop-loss or
take-profit moves ours. One follower order per leader signal is guaranteed by
the daemon (the order is keyed by the signal), so a redelivered signal is
harmless; reconciliation ([copytrade] reconcile) catches what slips through.
"""

DUST = 1e-8


def ignore(reason):
    return {"decision": "IGNORE", "reason": reason}


def trade(intent, reason):
    return {"decision": "TRADE_INTENT", "intent": intent, "reason": reason}


def to_target(s, position, settings):
    """Buy or sell what brings us to the position's target."""
    mirrored = position["mirrored"]
    delta = round(position["target"] - mirrored["quantity"] - mirrored["working"], 8)
    if position["target"] <= 0 and position.get("targetWhy"):
        return ignore(position["targetWhy"])
    if delta >= DUST:
        intent = {
            "action": "PLACE_MARKET_ORDER",
            "symbol": s["symbol"],
            "side": "buy" if position["side"] == "long" else "sell",
            "volume": delta,
        }
        for key in ("stopLoss", "takeProfit"):
            if position.get(key) is not None:
                intent[key] = position[key]
        pct = settings["stop_loss_pct"]
        if "stopLoss" not in intent and pct and position.get("price"):
            # the leader sends no stop (a TradingView alert): ours, pct from its price
            away = 1 - pct / 100 if position["side"] == "long" else 1 + pct / 100
            intent["stopLoss"] = round(position["price"] * away, 8)
        return trade(
            intent, "mirror " + s["leader"] + " " + s["signalId"] + " to " + str(position["target"])
        )
    if delta <= -DUST:
        volume = min(-delta, mirrored["quantity"])
        if volume < DUST:
            return ignore("nothing mirrored of " + s["positionId"])
        intent = {"action": "CLOSE_POSITION", "symbol": s["symbol"], "volume": round(volume, 8)}
        return trade(intent, "close mirrored " + str(round(volume, 8)) + " of " + s["positionId"])
    return ignore("on target: " + str(position["target"]))


def evaluate(event, state):
    s = event["payload"]
    position = state.get("copytrade", {}).get("position")
    if not position:
        return ignore("not in the leaders' book yet: " + s["positionId"])
    if position["followed"]:
        return ignore(position["followed"])
    if s["kind"] == "opened" and not position["open"]:
        return ignore("already closed by the leader: " + s["positionId"])
    settings = state["copytrade"]["settings"]
    if s["kind"] != "modified":
        return to_target(s, position, settings)

    # modified: new protective levels go to the working stop / take-profit orders
    # our entries spawned when they filled, even in part (state["orders"]; the broker
    # grows them with later parts); one order action per signal, so a new
    # stop-loss first (it bounds the risk); a size change goes to the target
    entries = [
        o["clientOrderId"] for o in position["mirrored"]["orders"].values() if o["filledVolume"] > 0
    ]
    for role, key in (("stop_loss", "stopLoss"), ("take_profit", "takeProfit")):
        if s.get(key) is None:
            continue
        for order in state.get("orders", []):
            if order.get("parentId") in entries and order.get("role") == role:
                intent = {
                    "action": "MODIFY_ORDER",
                    "symbol": s["symbol"],
                    "orderId": order["clientOrderId"],
                    key: s[key],
                }
                return trade(intent, "follow " + key + " to " + str(s[key]))
    if s.get("quantity") is not None or s.get("equityFraction") is not None:
        return to_target(s, position, settings)
    return ignore("modified: nothing of ours to change")
