"""An account's working orders and positions, rebuilt from its ``account.*`` events.

The paper broker publishes every order change with the whole order as the
payload, and a position event when one opens, flips or closes. Fed those
events in bus order (a recording), :class:`Ledger` holds what the broker
held: working orders exactly, positions by netting each fill (the broker's
own :func:`apply_fill`) and taking the position events as they come. Used to
rebuild the state a hook saw for a recorded event (``hooks test --recording``).
"""

from __future__ import annotations

from typing import Any

import msgspec

from daemon import events as ev
from daemon.events import FeedEvent
from daemon.trading.matching import apply_fill
from daemon.trading.portfolio import WORKING, Order, Position


class Ledger:
    """One account's orders and positions, as of the last event applied."""

    def __init__(self, account_id: str) -> None:
        self.account_id = account_id
        self.orders: dict[str, Order] = {}
        self.positions: dict[str, Position] = {}

    def apply(self, event: FeedEvent) -> None:
        """Take one bus event; anything but this account's order and position events
        (and payloads that are not what the broker writes) is ignored."""
        if event.account_id != self.account_id or not event.topic.startswith("account."):
            return
        if event.topic in (ev.ACCOUNT_POSITION_OPENED, ev.ACCOUNT_POSITION_CLOSED):
            self._position(event)
            return
        try:
            order = msgspec.convert(event.payload, Order)
        except msgspec.ValidationError:
            return
        if order.status in WORKING:
            self.orders[order.client_order_id] = order
        else:
            self.orders.pop(order.client_order_id, None)
        if event.topic == ev.ACCOUNT_ORDER_FILLED and order.fill_price is not None:
            pos = self.positions.get(order.symbol)
            applied = apply_fill(
                pos.quantity if pos else 0.0,
                pos.avg_price if pos else 0.0,
                order.signed_last_fill,
                order.fill_price,
            )
            if applied.quantity == 0:
                self.positions.pop(order.symbol, None)
            else:
                opened = pos.opened_ms if pos is not None else order.updated_ms
                self.positions[order.symbol] = Position(
                    symbol=order.symbol,
                    quantity=applied.quantity,
                    avg_price=applied.avg_price,
                    opened_ms=opened,
                )

    def _position(self, event: FeedEvent) -> None:
        try:
            pos = msgspec.convert(
                {k: event.payload.get(k) for k in ("symbol", "quantity", "avgPrice", "openedMs")},
                Position,
            )
        except msgspec.ValidationError:
            return
        if event.topic == ev.ACCOUNT_POSITION_CLOSED:
            self.positions.pop(pos.symbol, None)
        else:
            self.positions[pos.symbol] = pos

    def state(self) -> dict[str, Any]:
        """``positions`` and ``orders`` as a hook's state has them."""
        return {
            "positions": msgspec.to_builtins(self.positions),
            "orders": msgspec.to_builtins(list(self.orders.values())),
        }
