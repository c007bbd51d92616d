"""The seam between the risk engine and whoever executes orders.

A :class:`Broker` takes an :class:`OrderRequest` whose ``client_order_id`` is
derived from the hook's ``dedupeKey`` (:func:`client_order_id`). Brokers must
record the order before they send it and must answer a second ``submit`` with
the same id by returning the order they already have: that is what makes a
retry, a replay or a crash-and-restart unable to place an order twice.
"""

from __future__ import annotations

import hashlib
from typing import Protocol

import msgspec

from daemon.events import FeedEvent
from daemon.trading.intents import TradeIntent
from daemon.trading.portfolio import FillTotals, Order, OrderRole, PortfolioView, Position


class OrderRequest(msgspec.Struct, frozen=True, kw_only=True):
    """An approved order on its way to a broker.

    ``intent`` must be a placing action (use ``Verdict.order``, which resolves
    CLOSE_POSITION). ``trace_id`` links the order to the event that caused it.
    """

    client_order_id: str
    agent_id: str
    intent: TradeIntent
    trace_id: str | None = None
    # The account to trade in; empty means the agent's own (account id = agent id).
    account_id: str = ""
    # "close" for the market order a CLOSE_POSITION became (it opens nothing).
    role: OrderRole = "entry"

    @property
    def account(self) -> str:
        """The account this order books into."""
        return self.account_id or self.agent_id


def client_order_id(agent_id: str, dedupe_key: str) -> str:
    """A stable, venue-safe id for one (agent, dedupeKey): the same key, the same order.

    The dispatcher must pass a key that is stable across retries and restarts:
    the hook's ``dedupeKey``, or failing that ``hookId:eventId``.
    """
    digest = hashlib.blake2b(f"{agent_id}\x00{dedupe_key}".encode(), digest_size=12)
    return f"mw-{digest.hexdigest()}"


def child_order_id(entry_id: str, role: str) -> str:
    """The id of the stop-loss or take-profit order an entry spawns when it fills."""
    return f"{entry_id}:{'sl' if role == 'stop_loss' else 'tp'}"


class Broker(Protocol):
    """What the dispatcher needs from a broker (paper now, live later)."""

    name: str

    async def submit(self, request: OrderRequest) -> Order:
        """Record, then place the order; an already-known id returns the existing order."""
        ...

    async def recover(self, *, as_recorded: bool = False) -> list[Order]:
        """At startup: finish orders recorded but never sent (ask the venue first if
        live); ``as_recorded``: on event time, as of when and where they were recorded."""
        ...

    async def cancel(self, client_order_id: str) -> Order:
        """Cancel a working order; raises :exc:`BrokerError` if unknown or finished."""
        ...

    async def modify(self, client_order_id: str, change: TradeIntent) -> Order:
        """Apply a risk-approved MODIFY_ORDER; raises :exc:`BrokerError` if not working."""
        ...

    async def on_market_event(self, event: FeedEvent, cursor: str = "") -> None:
        """Feed a market event (ticks, closed candles) for marks and simulated fills,
        for the accounts of ``cursor`` ("": those without their own)."""
        ...

    def open_cursor(self, account: str) -> None:
        """Give ``account`` its own market cursor (event time: it steps with its agents)."""
        ...

    def get_order(self, client_order_id: str) -> Order | None:
        """The order with this id, if the broker has it."""
        ...

    def last_price(self, symbol: str, account: str | None = None) -> float | None:
        """The last known price of ``symbol`` (as ``account``'s cursor knows it)."""
        ...

    def view(self, account: str) -> PortfolioView:
        """The account's positions, working orders, today's PnL and the marks, for risk."""
        ...

    def pnl(self, account: str) -> float:
        """The account's PnL so far: realized by every fill, plus unrealized at the marks."""
        ...

    def accounts(self) -> list[str]:
        """Accounts with an open position or a working order."""
        ...

    def realized_pnl(self, account: str, since_ms: int = 0) -> float:
        """Realized PnL of the account's fills since ``since_ms``, net of fees."""
        ...

    def fill_totals(self, account: str) -> FillTotals:
        """The account's fills summed (count, realized net of fees, fees, last time)."""
        ...

    def positions(self, account: str) -> dict[str, Position]:
        """The account's open positions by symbol (cheap: for every hook evaluation)."""
        ...

    def open_orders(self, account: str) -> tuple[Order, ...]:
        """The account's working orders (cheap: for every hook evaluation)."""
        ...

    def now_ms(self, account: str | None = None) -> int:
        """The broker's clock (epoch ms, ``account``'s cursor); the risk engine's ``now``."""
        ...
