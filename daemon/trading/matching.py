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
* Costs (:class:`FillCosts`, off by default): a resting limit the market
  reached is a maker fill at its limit; a market, stop or marketable order is a
  taker fill: it pays the taker fee and, with ``slippage_bps``, fills that much
  worse than the price above (a buy higher, a sell lower; a limit never past
  its limit).
"""

from __future__ import annotations

from typing import Annotated, NamedTuple

import msgspec

from daemon.events import Candle
from daemon.trading.portfolio import Order

Bps = Annotated[float, msgspec.Meta(ge=0, le=1000)]


class FillCosts(msgspec.Struct, frozen=True, kw_only=True):
    """What a paper fill costs beyond its price, in basis points (``[trading]
    paper_maker_fee_bps``, ``paper_taker_fee_bps``, ``paper_slippage_bps``)."""

    maker_fee_bps: Bps = 0.0
    taker_fee_bps: Bps = 0.0
    slippage_bps: Bps = 0.0

    def fee(self, notional: float, *, maker: bool) -> float:
        """The fee of one fill."""
        return notional * (self.maker_fee_bps if maker else self.taker_fee_bps) / 10_000

    def taker_price(self, order: Order, price: float) -> float:
        """Where a taker fill at ``price`` executes: ``slippage_bps`` against the order
        (a buy higher, a sell lower), a limit order never past its limit."""
        if not self.slippage_bps:
            return price
        shift = price * self.slippage_bps / 10_000
        if order.side == "buy":
            worse = price + shift
            return min(worse, order.limit_price) if order.limit_price is not None else worse
        worse = price - shift
        return max(worse, order.limit_price) if order.limit_price is not None else worse


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
    if quantity == 0:  # opened at price exactly ((q * p) / q is not always p in floats)
        return Applied(signed_qty, price, 0.0)
    if (quantity > 0) == (signed_qty > 0):
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
