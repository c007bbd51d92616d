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
from daemon.trading.broker import client_order_id
from daemon.trading.portfolio import Order


def mirrored(
    agent_id: str,
    account: str,
    position: dict[str, Any],
    get_order: Callable[[str], Order | None],
) -> dict[str, Any]:
    """For one exported leader position: ``orders`` by signal id (the ones placed in
    ``account``) and ``quantity``, the filled volume net of closes."""
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
    return {"orders": orders, "quantity": round(net, 12)}
