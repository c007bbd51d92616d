"""What a broker knows: orders, positions, and the read-only view the risk engine checks.

These are plain frozen Structs so they cross every boundary (risk engine,
audit log, hook ``state``, JSON-RPC) unchanged; camelCase on the wire.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from daemon.trading.intents import Side

OrderType = Literal["market", "limit", "stop"]
# entry: the order the intent asked for; stop_loss / take_profit: its bracket
# children, live once the entry fills (one cancels the other).
OrderRole = Literal["entry", "stop_loss", "take_profit", "close"]
# PENDING_SUBMIT is written before the broker is asked, so a crash in between
# is visible on restart and the order is finished, never placed again.
OrderStatus = Literal["PENDING_SUBMIT", "OPEN", "FILLED", "CANCELED", "REJECTED"]
WORKING: frozenset[str] = frozenset({"PENDING_SUBMIT", "OPEN"})


class Order(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """One order as the broker recorded it."""

    client_order_id: str
    agent_id: str
    symbol: str
    # The book it trades in: the agent's own unless agent.toml shares one. Orders
    # stored before accounts existed decode into the legacy single account.
    account_id: str = "paper"
    side: Side
    order_type: OrderType
    role: OrderRole
    volume: float
    status: OrderStatus
    created_ms: int
    updated_ms: int
    limit_price: float | None = None
    stop_price: float | None = None
    stop_loss: float | None = None
    take_profit: float | None = None
    parent_id: str | None = None
    fill_price: float | None = None
    filled_ms: int | None = None
    trace_id: str | None = None
    reason: str = ""
    # Filled so far: an order filled in parts (a candle's volume caps a fill, see
    # ``[trading] paper_max_participation``) stays OPEN until its last part;
    # ``fill_price`` is then the average, ``last_fill_volume`` the last part's size.
    filled_volume: float = 0.0
    last_fill_volume: float | None = None
    fees: float = 0.0  # paid on its fills so far (quote currency)
    # A limit entry good till then (epoch ms; the broker's clock): canceled at the
    # first price after it. None: until filled or canceled.
    expires_ms: int | None = None

    @property
    def signed_volume(self) -> float:
        """+volume for a buy, -volume for a sell."""
        return self.volume if self.side == "buy" else -self.volume

    @property
    def filled(self) -> float:
        """Volume filled so far (orders stored before partial fills: all or none)."""
        return self.volume if self.status == "FILLED" else self.filled_volume

    @property
    def signed_remaining(self) -> float:
        """The signed volume still to fill."""
        left = max(self.volume - self.filled, 0.0)
        return left if self.side == "buy" else -left

    @property
    def signed_last_fill(self) -> float:
        """The signed size of the last fill (the whole order for one-part fills)."""
        size = self.last_fill_volume if self.last_fill_volume is not None else self.volume
        return size if self.side == "buy" else -size


class Position(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """A netted position: ``quantity`` > 0 long, < 0 short."""

    symbol: str
    quantity: float
    avg_price: float
    opened_ms: int


class FillTotals(msgspec.Struct, frozen=True, kw_only=True):
    """An account's fills summed: ``realized`` net of ``fees``; ``last_ms`` the
    newest fill's time (None: no fill yet)."""

    fills: int = 0
    realized: float = 0.0
    fees: float = 0.0
    last_ms: int | None = None


class PortfolioView(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """Everything the risk engine needs, as of one moment.

    ``marks`` are the last known prices; ``pnl_today`` is realized PnL since
    UTC midnight plus the current unrealized PnL of open positions;
    ``recent_order_ms`` are the creation times of orders placed in the last
    minute (for the order-rate throttle).
    """

    positions: dict[str, Position] = msgspec.field(default_factory=dict)
    open_orders: tuple[Order, ...] = ()
    marks: dict[str, float] = msgspec.field(default_factory=dict)
    pnl_today: float = 0.0
    recent_order_ms: tuple[int, ...] = ()

    def quantity(self, symbol: str) -> float:
        """Signed position size in ``symbol`` (0 when flat)."""
        pos = self.positions.get(symbol)
        return pos.quantity if pos is not None else 0.0

    def exposure(self) -> float:
        """Sum of |quantity| x mark over positions (avg price when no mark)."""
        total = 0.0
        for sym, pos in self.positions.items():
            total += abs(pos.quantity) * self.marks.get(sym, pos.avg_price)
        return total
