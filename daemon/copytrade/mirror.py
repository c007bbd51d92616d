"""What a follower made of a leader position: the orders its signals became.

A follower's order for a signal is keyed by the signal (client order id of
(agent, ``copytrade:<leader>:<signalId>``)), and a reconciliation's corrective
order by the position and its rank (:func:`correction_key`), so this mapping is
computed from the broker's orders and never stored twice. Used for the hooks'
state, by reconciliation and by ``marketwake copytrade status``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Final

from daemon.events import signal_event_id
from daemon.trading.broker import child_order_id, client_order_id
from daemon.trading.portfolio import Order

MAX_CORRECTIONS: Final = 100  # per leader position; past it reconciliation only alerts
_FINAL: Final = ("FILLED", "CANCELED", "REJECTED")


def correction_key(leader: str, position_id: str, rank: int) -> str:
    """The dedupe key of the ``rank``-th corrective order for a leader position."""
    return f"copytrade:{leader}:reconcile:{position_id}:{rank}"


def _row(order: Order) -> dict[str, Any]:
    return {
        "clientOrderId": order.client_order_id,
        "status": order.status,
        "side": order.side,
        "volume": order.volume,
        "filledVolume": order.filled,
        "fillPrice": order.fill_price,
    }


def _orders(
    agent_id: str, position: dict[str, Any], get_order: Callable[[str], Order | None]
) -> Iterator[tuple[str, Order]]:
    """(name, order) for each signal's order, then each correction, in rank order."""
    leader = position["leader"]
    for sid in position["signalIds"]:
        order = get_order(client_order_id(agent_id, signal_event_id(leader, sid)))
        if order is not None:
            yield sid, order
    for rank in range(1, MAX_CORRECTIONS + 1):
        key = correction_key(leader, position["positionId"], rank)
        order = get_order(client_order_id(agent_id, key))
        if order is None:
            return
        yield f"reconcile:{rank}", order


def mirrored(
    agent_id: str,
    account: str,
    position: dict[str, Any],
    get_order: Callable[[str], Order | None],
) -> dict[str, Any]:
    """For one exported leader position: ``orders`` by signal id (corrections as
    ``reconcile:<rank>``; a filled protective child as ``<signalId>:stop_loss`` /
    ``:take_profit``); ``quantity``, the filled volume net of closes; ``pending``,
    whether one of its orders is still working, and ``working``, the signed volume
    they would add; ``corrections``, how many were made."""
    orders: dict[str, Any] = {}
    net = working = 0.0
    pending = False
    corrections = 0
    for name, order in _orders(agent_id, position, get_order):
        corrections += name.startswith("reconcile:")
        if order.account_id != account:
            continue
        orders[name] = _row(order)
        # what filled counts, also of an order filled in parts or canceled after a part
        sign = 1.0 if (order.side == "buy") == (position["side"] == "long") else -1.0
        net += sign * order.filled
        if order.status not in _FINAL:
            pending, working = True, working + sign * abs(order.signed_remaining)
        # the follower's own stop-loss or take-profit may have closed what it mirrored
        for role in ("stop_loss", "take_profit"):
            child = get_order(child_order_id(order.client_order_id, role))
            if child is not None and child.status == "FILLED":
                orders[f"{name}:{role}"] = _row(child)
                net -= child.volume
    return {
        "orders": orders,
        "quantity": round(max(net, 0.0), 12),
        "pending": pending,
        "working": round(working, 12),
        "corrections": corrections,
    }
