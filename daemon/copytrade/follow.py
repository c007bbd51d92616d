"""How a follower copies: which leader positions, at what size, and drift (sans-I/O).

One set of rules, ``[copytrade]`` in the follower's ``agent.toml``, serves both
the follower's hook (``state["copytrade"]`` gives each followed position its
``target`` quantity) and the daemon's reconciliation, so the two can never
disagree about what "mirrored" should mean:

* ``ratio``: ``ratio`` x the leader's quantity (a signal sized as a fraction
  of the leader's equity: ``ratio`` x that fraction of the follower's equity);
* ``equity``: the leader's quantity x follower equity / leader equity (the
  signal's ``leaderEquity``), or the signal's ``equityFraction`` of the
  follower's equity;
* ``fixed``: ``fixed_quantity``;

for the position as the leader opened it, capped at ``max_quantity``, then
kept in the leader's proportion through its adds and partial closes (capped
again). Equity is ``capital`` plus the account's PnL.
A position is in drift when what the follower holds of it is off its target by
more than ``tolerance`` of the target (anything held of a closed position is).
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from daemon.copytrade.book import LeaderPosition

Side = Literal["long", "short"]
DUST = 1e-8  # base units: less than this is nothing to trade


class FollowSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[copytrade]`` in a follower's ``agent.toml`` (docs/copytrade.md)."""

    leaders: list[str] = msgspec.field(default_factory=list)  # [] = every leader
    symbols: list[str] = msgspec.field(default_factory=list)  # [] = every symbol
    directions: list[Side] = msgspec.field(default_factory=lambda: ["long", "short"])
    sizing: Literal["ratio", "equity", "fixed"] = "ratio"
    ratio: Annotated[float, msgspec.Meta(gt=0, le=1000)] = 0.5
    fixed_quantity: Annotated[float, msgspec.Meta(gt=0)] = 0.001
    max_quantity: Annotated[float, msgspec.Meta(ge=0)] = 0.0  # per position; 0 = no cap
    # The account's notional capital (quote currency): equity = capital + PnL.
    capital: Annotated[float, msgspec.Meta(gt=0)] = 10_000.0
    # What a drift found by reconciliation does: nothing, an ALERT, or corrective orders.
    reconcile: Literal["off", "alert", "correct"] = "alert"
    tolerance: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.05
    # A stop this many percent from the price for entries whose leader sends none
    # (TradingView alerts carry none); 0 = none (the risk engine may require one).
    stop_loss_pct: Annotated[float, msgspec.Meta(ge=0, lt=100)] = 0.0


def stop_loss(
    s: FollowSettings, side: Side, leader_stop: float | None, price: float | None
) -> float | None:
    """The stop-loss of a copied entry: the leader's, else ``stop_loss_pct`` from
    ``price``."""
    if leader_stop is not None or not s.stop_loss_pct or not price:
        return leader_stop
    away = s.stop_loss_pct / 100
    # 10 significant digits, not 8 decimals: a price below 1e-8 (a meme coin) keeps its stop
    return float(f"{price * (1 - away if side == 'long' else 1 + away):.10g}")


def not_followed(s: FollowSettings, leader: str, symbol: str, side: str) -> str:
    """Why a leader position is not copied ("" when it is)."""
    if s.leaders and leader not in s.leaders:
        return f"not a followed leader: {leader}"
    if s.symbols and symbol not in s.symbols:
        return f"symbol not followed: {symbol}"
    if side not in s.directions:
        return f"direction not followed: {side}"
    return ""


class Target(msgspec.Struct, frozen=True, kw_only=True):
    """What the follower should hold of one leader position; ``why`` when 0 for want
    of an input (no price, no leader equity)."""

    quantity: float
    why: str = ""


def _opening(
    s: FollowSettings, p: LeaderPosition, equity: float, price: float | None
) -> float | str:
    """The follower's size for the position as the leader opened it, or why none."""
    if s.sizing == "fixed":
        return s.fixed_quantity
    first = p.opened_quantity if p.opened_quantity is not None else p.quantity
    if first is not None:
        if s.sizing == "ratio":
            return s.ratio * first
        if not p.leader_equity:
            return "equity sizing: the signals carry no leaderEquity"
        return first * equity / p.leader_equity
    fraction = p.opened_equity_fraction or p.equity_fraction
    if fraction is None or not price:
        return "sized by equityFraction: no price to convert it at"
    share = 1.0 if s.sizing == "equity" else s.ratio
    return share * fraction * equity / price


def _scale(p: LeaderPosition) -> float:
    """How much of its opening size the leader's position is now (adds, partial closes)."""
    if p.quantity is not None and p.opened_quantity:
        return p.quantity / p.opened_quantity
    if p.equity_fraction is not None and p.opened_equity_fraction:
        return p.equity_fraction / p.opened_equity_fraction
    return 1.0


def target(
    s: FollowSettings,
    p: LeaderPosition,
    open_: bool,
    *,
    equity: float,
    price: float | None,
) -> Target:
    """The follower's quantity for leader position ``p`` (0 once it is closed): its
    opening size by ``sizing``, capped, then in the leader's proportion since."""
    if not open_:
        return Target(quantity=0.0)
    why = not_followed(s, p.leader, p.symbol, p.side)
    if why:
        return Target(quantity=0.0, why=why)
    first = _opening(s, p, equity, p.price if price is None else price)
    if isinstance(first, str):
        return Target(quantity=0.0, why=first)
    cap = s.max_quantity or float("inf")
    qty = min(min(first, cap) * _scale(p), cap)
    return Target(quantity=round(max(qty, 0.0), 8))


class Drift(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """A leader position the follower holds the wrong amount of."""

    leader: str
    position_id: str
    symbol: str
    side: Side
    target: float
    held: float  # what the follower's orders for it net to

    @property
    def delta(self) -> float:
        """What to trade to be back on target: > 0 add, < 0 reduce."""
        return round(self.target - self.held, 8)


def drift(s: FollowSettings, p: LeaderPosition, wanted: float, held: float) -> Drift | None:
    """``p`` as a drift when ``held`` is off ``wanted`` beyond the tolerance."""
    off = abs(wanted - held)
    if off < DUST or (wanted > 0 and off <= s.tolerance * wanted):
        return None
    return Drift(
        leader=p.leader,
        position_id=p.position_id,
        symbol=p.symbol,
        side=p.side,
        target=wanted,
        held=held,
    )
