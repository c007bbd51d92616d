"""The sizing and drift rules a follower's hook and reconciliation share (sans-I/O)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from daemon.copytrade.book import LeaderPosition
from daemon.copytrade.follow import FollowSettings, Target, drift, stop_loss, target


def position(**kw: Any) -> LeaderPosition:
    base: dict[str, Any] = {
        "leader": "alice",
        "positionId": "p1",
        "symbol": "BTC-USD",
        "side": "long",
        "quantity": 0.02,
        "openedQuantity": 0.02,
        "openedAt": "2026-01-01T00:00:00.000Z",
        "updatedAt": "2026-01-01T00:00:00.000Z",
    }
    return msgspec.convert(base | kw, LeaderPosition)


def sized(
    p: LeaderPosition, equity: float = 10_000.0, price: float | None = 100.0, **s: Any
) -> Target:
    return target(msgspec.convert(s, FollowSettings), p, True, equity=equity, price=price)


def test_ratio_sizing_follows_adds_and_partial_closes() -> None:
    assert sized(position()).quantity == 0.01  # default ratio 0.5
    assert sized(position(), ratio=2).quantity == 0.04
    assert sized(position(quantity=0.03)).quantity == 0.015  # an add
    assert sized(position(quantity=0.005)).quantity == 0.0025  # a partial close


def test_a_cap_applies_to_the_opening_then_the_leaders_proportion() -> None:
    # capped at 0.004 when opened; the leader closing 3/4 leaves 1/4 of that
    assert sized(position(), max_quantity=0.004).quantity == 0.004
    assert sized(position(quantity=0.005), max_quantity=0.004).quantity == 0.001
    # an add past the cap stays at the cap
    assert sized(position(quantity=0.2), max_quantity=0.004).quantity == 0.004


def test_fixed_sizing_keeps_the_leaders_proportion() -> None:
    assert sized(position(), sizing="fixed", fixed_quantity=0.5).quantity == 0.5
    assert sized(position(quantity=0.01), sizing="fixed", fixed_quantity=0.5).quantity == 0.25


def test_equity_sizing_uses_the_equity_ratio() -> None:
    p = position(leaderEquity=40_000.0)
    assert sized(p, equity=10_000.0, sizing="equity").quantity == 0.005
    assert sized(p, equity=20_000.0, sizing="equity").quantity == 0.01
    missing = sized(position(), sizing="equity")
    assert missing.quantity == 0 and "leaderEquity" in missing.why


def test_a_fraction_of_equity_becomes_a_quantity_at_the_price() -> None:
    p = position(quantity=None, openedQuantity=None, equityFraction=0.1, openedEquityFraction=0.1)
    # 10 % of 10,000 at 100 = 10 units; ratio 0.5 of that, or all of it by equity
    assert sized(p).quantity == 5.0
    assert sized(p, sizing="equity").quantity == 10.0
    assert sized(p, price=None).quantity == 0  # no price yet: the signal's, if any
    at_signal = position(quantity=None, openedQuantity=None, equityFraction=0.1, price=50.0)
    assert sized(at_signal, price=None).quantity == 10.0  # the signal's price: 0.5 x 1000 / 50
    assert "no price" in sized(p, price=None).why


@pytest.mark.parametrize(
    ("settings", "why"),
    [
        ({"leaders": ["bob"]}, "not a followed leader: alice"),
        ({"symbols": ["ETH-USD"]}, "symbol not followed: BTC-USD"),
        ({"directions": ["short"]}, "direction not followed: long"),
    ],
)
def test_what_is_not_followed_has_no_target(settings: dict[str, Any], why: str) -> None:
    assert sized(position(), **settings) == Target(quantity=0.0, why=why)


def test_a_closed_position_has_target_zero() -> None:
    assert target(FollowSettings(), position(), False, equity=1.0, price=1.0).quantity == 0


def test_drift_is_beyond_the_tolerance_of_the_target() -> None:
    s, p = FollowSettings(tolerance=0.1), position()
    assert drift(s, p, 0.01, 0.0095) is None  # 5 % off
    d = drift(s, p, 0.01, 0.008)  # 20 % off
    assert d is not None and d.delta == 0.002
    assert drift(s, p, 0.0, 0.0) is None
    closed = drift(s, p, 0.0, 0.001)  # anything held of a closed position
    assert closed is not None and closed.delta == -0.001
    assert drift(s, p, 0.0, 1e-9) is None  # dust


def test_settings_are_checked() -> None:
    for bad in ({"ratio": 0}, {"sizing": "kelly"}, {"reconcile": "yes"}, {"tolerance": 2}):
        with pytest.raises(msgspec.ValidationError):
            msgspec.convert(bad, FollowSettings)


def test_a_stop_of_our_own_when_the_leader_sends_none() -> None:
    s = FollowSettings(stop_loss_pct=2.0)
    assert stop_loss(s, "long", None, 100.0) == 98.0
    assert stop_loss(s, "short", None, 100.0) == 102.0
    assert stop_loss(s, "long", 95.0, 100.0) == 95.0  # the leader's wins
    assert stop_loss(FollowSettings(), "long", None, 100.0) is None
    assert stop_loss(s, "long", None, None) is None
    # a meme coin's price: its stop keeps its digits (8 decimals made it 0, no order)
    assert stop_loss(s, "long", None, 1.234e-9) == pytest.approx(1.20932e-9, rel=1e-9)


class NoOrders:
    """The accounts as a follower that has copied nothing sees them."""

    def get_order(self, client_order_id: str) -> None:
        return None

    def last_price(self, symbol: str, account: str | None = None) -> float | None:
        return 100.0

    def pnl(self, account: str) -> float:
        return 25.0


def test_the_hooks_view_is_bounded_and_carries_targets() -> None:
    from daemon.copytrade.book import LeaderBook
    from daemon.copytrade.view import MAX_IN_STATE, follower_view
    from daemon.events import SignalPayload

    book = LeaderBook()
    for i in range(MAX_IN_STATE + 50):
        book.apply(
            SignalPayload(
                leader="alice", signal_id=f"s{i}", kind="opened", position_id=f"p{i}",
                symbol="BTC-USD", side="long", time="2026-11-25T12:00:00.000Z", quantity=0.02,
            )
        )  # fmt: skip
    view = follower_view("f", "f", FollowSettings(), book, NoOrders(), ("alice", "p3"))
    assert len(view["leaders"]) == MAX_IN_STATE and view["leadersOmitted"] == 50
    assert view["leaders"][-1]["positionId"] == f"p{MAX_IN_STATE + 49}"  # the newest kept
    assert view["position"]["positionId"] == "p3"  # the signal's own, even if omitted
    assert view["position"]["target"] == 0.01 and view["equity"] == 10_025.0
    assert view["position"]["mirrored"]["quantity"] == 0
