"""A follower's view of the leaders' book: each position with its target and what
was mirrored of it (``state["copytrade"]``, reconciliation, ``copytrade status``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple, Protocol

import msgspec

from daemon.copytrade.book import LeaderBook, LeaderPosition
from daemon.copytrade.follow import Drift, FollowSettings, drift, not_followed, target
from daemon.copytrade.mirror import mirrored
from daemon.trading.portfolio import Order

MAX_IN_STATE = 200  # leader positions (and held signals) in a hook's state


class Accounts(Protocol):
    """What the view reads of the paper accounts: the broker live, its store offline."""

    def get_order(self, client_order_id: str) -> Order | None:
        """The order with this id, if any."""
        ...

    def last_price(self, symbol: str, account: str | None = None) -> float | None:
        """The last known price of ``symbol`` (as the account's cursor knows it)."""
        ...

    def pnl(self, account: str) -> float:
        """The account's realized plus unrealized PnL."""
        ...


def position_row(
    agent_id: str,
    account: str,
    settings: FollowSettings,
    broker: Accounts,
    position: LeaderPosition,
    open_: bool,
    equity: float,
) -> dict[str, Any]:
    """One leader position as a follower sees it: the book's fields, ``open``,
    ``followed`` ("" or why not), ``target`` (and ``targetWhy`` when it is 0 for want
    of an input) and ``mirrored`` (:func:`daemon.copytrade.mirror.mirrored`)."""
    row: dict[str, Any] = msgspec.to_builtins(position)
    wanted = target(
        settings,
        position,
        open_,
        equity=equity,
        price=broker.last_price(position.symbol, account),
    )
    row["open"] = open_
    row["followed"] = not_followed(settings, position.leader, position.symbol, position.side)
    row["target"] = wanted.quantity
    row["targetWhy"] = wanted.why
    row["mirrored"] = mirrored(agent_id, account, row, broker.get_order)
    return row


def follower_view(
    agent_id: str,
    account: str,
    settings: FollowSettings,
    book: LeaderBook,
    broker: Accounts,
    about: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """``leaders`` (open positions, oldest first; the newest ``MAX_IN_STATE`` of
    them, ``leadersOmitted`` says how many older ones are left out), ``held``
    signals (as bounded), ``settings``, ``equity``; with ``about`` = (leader,
    positionId), that one position (open, or recently closed) as ``position``.
    Bounded so a leader with thousands of positions cannot push a follower's hook
    state past the sandbox's frame limit."""
    equity = settings.capital + broker.pnl(account)
    held = book.export_held()
    positions = list(book.positions.values())
    shown = positions[-MAX_IN_STATE:]
    view: dict[str, Any] = {
        "held": held[-MAX_IN_STATE:],
        "heldOmitted": max(0, len(held) - MAX_IN_STATE),
        "leadersOmitted": len(positions) - len(shown),
    }
    view["leaders"] = [
        position_row(agent_id, account, settings, broker, p, True, equity) for p in shown
    ]
    view["settings"] = msgspec.to_builtins(settings)
    view["equity"] = round(equity, 8)
    found = book.position(*about) if about is not None else None
    if found is not None:
        view["position"] = position_row(agent_id, account, settings, broker, *found, equity)
    return view


class Check(NamedTuple):
    """One followed leader position compared with what the follower holds of it."""

    position: LeaderPosition
    row: dict[str, Any]  # as :func:`position_row` gives it
    drift: Drift | None  # None: within tolerance, or an order of it still working
    pending: bool


def checks(
    agent_id: str, account: str, settings: FollowSettings, book: LeaderBook, broker: Accounts
) -> Iterator[Check]:
    """The open and recently closed positions the follower copies and can size; those
    it does not follow or cannot size (no price, no leader equity) are not its drift."""
    equity = settings.capital + broker.pnl(account)
    candidates = [(p, True) for p in book.positions.values()]
    candidates += [(p, False) for p in book.closed.values()]
    for p, open_ in candidates:
        row = position_row(agent_id, account, settings, broker, p, open_, equity)
        if row["followed"] or row["targetWhy"]:
            continue
        held = row["mirrored"]
        found = None if held["pending"] else drift(settings, p, row["target"], held["quantity"])
        yield Check(p, row, found, held["pending"])
