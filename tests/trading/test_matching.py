"""Pure fill rules and position accounting."""

from __future__ import annotations

from typing import Any

import pytest

from daemon.events import Candle
from daemon.trading.matching import apply_fill, candle_fill, marketable_price, tick_fill
from daemon.trading.portfolio import Order


def bar(o: float, h: float, lo: float, c: float, close_ms: int) -> Candle:
    """A closed one-minute candle from its prices and close time."""
    return Candle(
        open=o, high=h, low=lo, close=c, volume=0.0,
        open_time_ms=close_ms - 60_000, close_time_ms=close_ms,
    )  # fmt: skip


def order(**kw: Any) -> Order:
    base: dict[str, Any] = {
        "client_order_id": "c",
        "agent_id": "a",
        "symbol": "BTC",
        "side": "buy",
        "order_type": "limit",
        "role": "entry",
        "volume": 1.0,
        "status": "OPEN",
        "created_ms": 100,
        "updated_ms": 100,
        "limit_price": 100.0,
    }
    base.update(kw)
    return Order(**base)


@pytest.mark.parametrize(
    ("kw", "price", "fill"),
    [
        ({}, 100.5, None),
        ({}, 99.0, 100.0),
        ({"side": "sell"}, 100.5, 100.0),
        ({"order_type": "market", "limit_price": None}, 123.0, 123.0),
        (
            {"order_type": "stop", "side": "sell", "limit_price": None, "stop_price": 95.0},
            95.5,
            None,
        ),
        (
            {"order_type": "stop", "side": "sell", "limit_price": None, "stop_price": 95.0},
            94.0,
            94.0,
        ),
        (
            {"order_type": "stop", "side": "buy", "limit_price": None, "stop_price": 105.0},
            106.0,
            106.0,
        ),
    ],
)
def test_tick_fill(kw: dict[str, Any], price: float, fill: float | None) -> None:
    """Limits fill at their price when traded through; stops fill at the tick; markets at once."""
    assert tick_fill(order(**kw), price) == fill


@pytest.mark.parametrize(
    ("kw", "candle", "fill"),
    [
        ({}, bar(101, 102, 100.5, 101, 200), None),
        ({}, bar(101, 102, 99, 101, 200), 100.0),
        ({}, bar(101, 102, 99, 101, 100), None),
        (
            {"side": "sell", "order_type": "stop", "limit_price": None, "stop_price": 95.0},
            bar(97, 98, 94, 96, 200),
            95.0,
        ),
        (
            {"side": "sell", "order_type": "stop", "limit_price": None, "stop_price": 95.0},
            bar(93, 94, 92, 93, 200),
            93.0,
        ),
        (
            {"side": "buy", "order_type": "stop", "limit_price": None, "stop_price": 105.0},
            bar(107, 108, 106, 107, 200),
            107.0,
        ),
        ({"order_type": "market", "limit_price": None}, bar(101, 102, 99, 100.5, 200), 100.5),
    ],
)
def test_candle_fill(kw: dict[str, Any], candle: Candle, fill: float | None) -> None:
    """Candles fill limits by low/high, stops with gap-through-open, never before creation."""
    assert candle_fill(order(**kw), candle) == fill


def test_marketable_price() -> None:
    """A limit through the market fills at the market; a resting one does not."""
    assert marketable_price(order(limit_price=101.0), 100.0) == 100.0
    assert marketable_price(order(limit_price=99.0), 100.0) is None


@pytest.mark.parametrize(
    ("qty", "avg", "fill", "price", "expected"),
    [
        (0.0, 0.0, 2.0, 100.0, (2.0, 100.0, 0.0)),
        (2.0, 100.0, 2.0, 110.0, (4.0, 105.0, 0.0)),
        (2.0, 100.0, -1.0, 110.0, (1.0, 100.0, 10.0)),
        (2.0, 100.0, -2.0, 90.0, (0.0, 0.0, -20.0)),
        (2.0, 100.0, -3.0, 110.0, (-1.0, 110.0, 20.0)),
        (-2.0, 100.0, 1.0, 90.0, (-1.0, 100.0, 10.0)),
    ],
)
def test_apply_fill(
    qty: float, avg: float, fill: float, price: float, expected: tuple[float, float, float]
) -> None:
    """Adding averages the price; reducing realizes PnL; flipping opens the rest at the fill."""
    assert apply_fill(qty, avg, fill, price) == pytest.approx(expected)
