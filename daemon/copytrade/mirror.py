"""What a follower made of a leader position: the orders its signals became.

A follower's order for a signal is keyed by the signal (client order id of
(agent, ``copytrade:<leader>:<signalId>``)), so this mapping is computed from
the broker's orders and never stored twice. Used for the hooks' state and by
``marketwake copytrade status``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from daemon.events import signal_event_id
from daemon.trading.broker import child_order_id, client_order_id
from daemon.trading.portfolio import Order


def mirrored(
    agent_id: str,
    account: str,
    position: dict[str, Any],
    get_order: Callable[[str], Order | None],
) -> dict[str, Any]:
    """For one exported leader position: ``orders`` by signal id (the ones placed in
    ``account``; a filled protective child as ``<signalId>:stop_loss`` /
    ``:take_profit``) and ``quantity``, the filled volume net of closes."""
    orders: dict[str, Any] = {}
    net = 0.0
    for sid in position["signalIds"]:
        order = get_order(client_order_id(agent_id, signal_event_id(position["leader"], sid)))
        if order is None or order.account_id != account:
            continue
        orders[sid] = {
            "clientOrderId": order.client_order_id,
            "status": order.status,
            "side": order.side,
            "volume": order.volume,
            "fillPrice": order.fill_price,
        }
        if order.status == "FILLED":
            opening = (order.side == "buy") == (position["side"] == "long")
            net += order.volume if opening else -order.volume
        # the follower's own stop-loss or take-profit may have closed what it mirrored
        for role in ("stop_loss", "take_profit"):
            child = get_order(child_order_id(order.client_order_id, role))
            if child is not None and child.status == "FILLED":
                orders[f"{sid}:{role}"] = {
                    "clientOrderId": child.client_order_id,
                    "status": child.status,
                    "side": child.side,
                    "volume": child.volume,
                    "fillPrice": child.fill_price,
                }
                net -= child.volume
    return {"orders": orders, "quantity": round(max(net, 0.0), 12)}
