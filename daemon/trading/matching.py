"""Fill rules and position accounting for simulated execution (sans-I/O).

Rules, chosen to be conservative (a paper result should not flatter a strategy):

* Ticks: a market order fills at the tick. A resting limit fills at its limit
  when the tick trades at or through it. A stop (the stop-loss child) fills at
  the tick once the tick is at or through the stop, so gaps cost slippage.
* Candles (closed, OHLC): a limit buy fills at its limit if ``low <= limit``
  (a sell if ``high >= limit``). A long's stop triggers if ``low <= stop`` and
  fills at ``min(open, stop)`` (an opening gap through the stop fills at the
  open); shorts mirror this. A market order still waiting for a price fills at
  the close.
* When a candle's range contains both the stop-loss and the take-profit of a
  bracket, we cannot know which traded first, so the stop-loss (the adverse
  one) fires and the take-profit is canceled.
* A candle whose close is not after an order's creation time never fills it:
  the order did not exist while that candle traded.
"""

from __future__ import annotations

from typing import NamedTuple

from daemon.events import Candle
from daemon.trading.portfolio import Order


def _crossed(order: Order, low: float, high: float) -> bool:
    """Did prices in [low, high] reach the order's trigger?"""
    if order.order_type == "limit":
        assert order.limit_price is not None
        return low <= order.limit_price if order.side == "buy" else high >= order.limit_price
    assert order.stop_price is not None
    return high >= order.stop_price if order.side == "buy" else low <= order.stop_price


def tick_fill(order: Order, price: float) -> float | None:
    """The fill price of ``order`` against a trade at ``price``, or None."""
    if order.order_type == "market":
        return price
    if not _crossed(order, price, price):
        return None
    return order.limit_price if order.order_type == "limit" else price


def candle_fill(order: Order, candle: Candle) -> float | None:
    """The fill price of ``order`` within ``candle``, or None."""
    if candle.close_time_ms <= order.created_ms:
        return None
    if order.order_type == "market":
        return candle.close
    if not _crossed(order, candle.low, candle.high):
        return None
    if order.order_type == "limit":
        return order.limit_price
    assert order.stop_price is not None
    if order.side == "sell":
        return min(candle.open, order.stop_price)
    return max(candle.open, order.stop_price)


def marketable_price(order: Order, last: float) -> float | None:
    """Fill price on arrival: a market order, or a limit already through the market."""
    if order.order_type == "market":
        return last
    if order.order_type == "limit" and _crossed(order, last, last):
        return last
    return None


class Applied(NamedTuple):
    """A position after one fill, and the PnL that fill realized."""

    quantity: float
    avg_price: float
    realized: float


def apply_fill(quantity: float, avg_price: float, signed_qty: float, price: float) -> Applied:
    """Net a fill into a position; closing volume realizes PnL at ``price``."""
    if quantity == 0 or (quantity > 0) == (signed_qty > 0):
        new_qty = quantity + signed_qty
        avg = (quantity * avg_price + signed_qty * price) / new_qty
        return Applied(new_qty, avg, 0.0)
    closing = min(abs(signed_qty), abs(quantity))
    direction = 1.0 if quantity > 0 else -1.0
    realized = closing * (price - avg_price) * direction
    new_qty = quantity + signed_qty
    if abs(new_qty) < 1e-12:
        return Applied(0.0, 0.0, realized)
    if (new_qty > 0) == (quantity > 0):
        return Applied(new_qty, avg_price, realized)
    return Applied(new_qty, price, realized)  # flipped: the remainder opened at price
