"""MODIFY_ORDER on a working order, as pure functions (sans-I/O).

What a change may touch depends on the order's role:

* a resting limit **entry**: ``openPrice`` (its limit), ``volume``, and the
  ``stopLoss`` / ``takeProfit`` its bracket will get when it fills;
* a **stop_loss** child (protecting a position): ``stopLoss``, its trigger;
* a **take_profit** child: ``takeProfit``, its limit.

Market orders fill on arrival and closing orders are never left working, so
neither can be changed. :func:`as_placed` gives the entry the change would
leave behind as a fresh limit intent, so the risk engine checks it with the
same rules as a new order.
"""

from __future__ import annotations

import msgspec

from daemon.trading.intents import TradeIntent
from daemon.trading.portfolio import Order

_ALLOWED = {
    "entry": frozenset({"open_price", "volume", "stop_loss", "take_profit"}),
    "stop_loss": frozenset({"stop_loss"}),
    "take_profit": frozenset({"take_profit"}),
}
_WIRE = {
    "open_price": "openPrice",
    "volume": "volume",
    "stop_loss": "stopLoss",
    "take_profit": "takeProfit",
}


def misfit(order: Order, change: TradeIntent) -> str | None:
    """Why ``change`` cannot apply to ``order`` (None when it can)."""
    asked = {k for k in _WIRE if getattr(change, k) is not None}
    if order.role == "entry" and order.order_type != "limit":
        return f"order {order.client_order_id} is a {order.order_type} order; only limits rest"
    if change.volume is not None and change.volume <= order.filled_volume:
        return (
            f"order {order.client_order_id} has {order.filled_volume:g} filled already; "
            "a new volume must be above that"
        )
    allowed = _ALLOWED.get(order.role, frozenset())
    extra = sorted(_WIRE[k] for k in asked - allowed)
    if extra:
        can = ", ".join(sorted(_WIRE[k] for k in allowed)) or "nothing"
        return f"a {order.role} order cannot change {', '.join(extra)} (it can change: {can})"
    return None


def amended(order: Order, change: TradeIntent, now_ms: int) -> Order:
    """``order`` with ``change`` applied (check :func:`misfit` first)."""
    if order.role == "stop_loss":
        return msgspec.structs.replace(order, stop_price=change.stop_loss, updated_ms=now_ms)
    if order.role == "take_profit":
        return msgspec.structs.replace(order, limit_price=change.take_profit, updated_ms=now_ms)
    return msgspec.structs.replace(
        order,
        limit_price=change.open_price or order.limit_price,
        volume=change.volume or order.volume,
        stop_loss=change.stop_loss or order.stop_loss,
        take_profit=change.take_profit or order.take_profit,
        updated_ms=now_ms,
    )


def as_placed(order: Order, change: TradeIntent) -> TradeIntent:
    """The limit entry the change leaves behind, as an intent for the risk engine."""
    return TradeIntent(
        action="PLACE_LIMIT_ORDER",
        symbol=order.symbol,
        side=order.side,
        volume=change.volume or order.volume,
        open_price=change.open_price or order.limit_price,
        stop_loss=change.stop_loss or order.stop_loss,
        take_profit=change.take_profit or order.take_profit,
        comment=change.comment or order.reason,
    )
