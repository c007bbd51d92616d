"""A follower's view of the leaders' book: each position with its target and what
was mirrored of it (``state["copytrade"]``, reconciliation, ``copytrade status``)."""

from __future__ import annotations

from typing import Any

import msgspec

from daemon.copytrade.book import LeaderBook, LeaderPosition
from daemon.copytrade.follow import FollowSettings, not_followed, target
from daemon.copytrade.mirror import mirrored
from daemon.trading.broker import Broker


def position_row(
    agent_id: str,
    account: str,
    settings: FollowSettings,
    broker: Broker,
    position: LeaderPosition,
    open_: bool,
    equity: float,
) -> dict[str, Any]:
    """One leader position as a follower sees it: the book's fields, ``open``,
    ``followed`` ("" or why not), ``target`` (and ``targetWhy`` when it is 0 for want
    of an input) and ``mirrored`` (:func:`daemon.copytrade.mirror.mirrored`)."""
    row: dict[str, Any] = msgspec.to_builtins(position)
    wanted = target(
        settings, position, open_, equity=equity, price=broker.last_price(position.symbol)
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
    broker: Broker,
    about: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """``leaders`` (open positions, oldest first), ``held`` signals, ``settings``,
    ``equity``; with ``about`` = (leader, positionId), that one position (open, or
    recently closed) as ``position``."""
    equity = settings.capital + broker.pnl(account)
    view: dict[str, Any] = {"held": book.export_held()}
    view["leaders"] = [
        position_row(agent_id, account, settings, broker, p, True, equity)
        for p in book.positions.values()
    ]
    view["settings"] = msgspec.to_builtins(settings)
    view["equity"] = round(equity, 8)
    found = book.position(*about) if about is not None else None
    if found is not None:
        view["position"] = position_row(agent_id, account, settings, broker, *found, equity)
    return view
