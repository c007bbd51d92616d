"""Every risk rule, one rejection each, plus the exemptions for reducing orders."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from daemon.trading import risk
from daemon.trading.intents import RiskLimits, TradeIntent, TradingState, parse_intent
from daemon.trading.portfolio import Order, PortfolioView, Position

NOW = 1_700_000_000_000
LAST = 100.0


def intent(**kw: Any) -> TradeIntent:
    base: dict[str, Any] = {
        "action": "PLACE_LIMIT_ORDER",
        "symbol": "BTC",
        "side": "buy",
        "volume": 1.0,
        "openPrice": 100.0,
        "stopLoss": 95.0,
        "takeProfit": 110.0,
    }
    base.update(kw)
    return parse_intent({k: v for k, v in base.items() if v is not None})


def long(qty: float = 2.0, avg: float = 100.0) -> PortfolioView:
    return PortfolioView(
        positions={"BTC": Position(symbol="BTC", quantity=qty, avg_price=avg, opened_ms=0)}
    )


def working(n: int) -> tuple[Order, ...]:
    return tuple(
        Order(
            client_order_id=f"o{i}",
            agent_id="a",
            symbol="ETH",
            side="buy",
            order_type="limit",
            role="entry",
            volume=0.001,
            status="OPEN",
            created_ms=NOW,
            updated_ms=NOW,
            limit_price=10.0,
        )
        for i in range(n)
    )


def test_clean_order_is_approved() -> None:
    """A well-formed order inside every limit passes with no reasons."""
    verdict = risk.RiskEngine(RiskLimits()).check(intent(), PortfolioView(), LAST, NOW)
    assert verdict.approved and verdict.reasons == () and verdict.order is not None
    assert verdict.notional == 100.0


CASES: list[tuple[str, RiskLimits, TradeIntent, PortfolioView, float | None]] = [
    (
        risk.SYMBOL_NOT_ALLOWED,
        RiskLimits(allowed_symbols=("ETH",)),
        intent(),
        PortfolioView(),
        LAST,
    ),
    (risk.NO_PRICE, RiskLimits(), intent(), PortfolioView(), None),
    (risk.STOP_LOSS_REQUIRED, RiskLimits(), intent(stopLoss=None), PortfolioView(), LAST),
    (risk.BRACKET_WRONG_SIDE, RiskLimits(), intent(stopLoss=101.0), PortfolioView(), LAST),
    (
        risk.BRACKET_WRONG_SIDE,
        RiskLimits(),
        intent(side="sell", stopLoss=95.0, takeProfit=90.0),
        PortfolioView(),
        LAST,
    ),
    (
        risk.PRICE_BAND,
        RiskLimits(limit_price_band_pct=2),
        intent(openPrice=97.0, stopLoss=90.0),
        PortfolioView(),
        LAST,
    ),
    (risk.ORDER_NOTIONAL, RiskLimits(max_order_notional=50), intent(), PortfolioView(), LAST),
    (
        risk.POSITION_LIMIT,
        RiskLimits(max_position_per_symbol=250),
        intent(volume=2.0),
        long(1.0),
        LAST,
    ),
    (risk.TOTAL_EXPOSURE, RiskLimits(max_total_exposure=150), intent(), long(1.0), LAST),
    (
        risk.OPEN_ORDERS,
        RiskLimits(max_open_orders=3),
        intent(),
        PortfolioView(open_orders=working(3)),
        LAST,
    ),
    (
        risk.ORDER_RATE,
        RiskLimits(max_orders_per_minute=2),
        intent(),
        PortfolioView(recent_order_ms=(NOW - 59_000, NOW - 1)),
        LAST,
    ),
    (
        risk.DAILY_LOSS,
        RiskLimits(daily_loss_limit=100),
        intent(),
        PortfolioView(pnl_today=-100.0),
        LAST,
    ),
]


@pytest.mark.parametrize(
    ("code", "limits", "order", "view", "last"),
    CASES,
    ids=[c[0] + str(i) for i, c in enumerate(CASES)],
)
def test_each_rule_rejects_with_its_code(
    code: str, limits: RiskLimits, order: TradeIntent, view: PortfolioView, last: float | None
) -> None:
    """Each rule, breached alone, rejects with its stable code and a message."""
    verdict = risk.RiskEngine(limits).check(order, view, last, NOW)
    assert not verdict.approved and verdict.order is None
    assert verdict.codes == [code]
    assert verdict.reasons[0].message


def test_rate_window_slides() -> None:
    """Orders older than 60 s no longer count toward the throttle."""
    view = PortfolioView(recent_order_ms=(NOW - 61_000, NOW - 60_500))
    assert (
        risk.RiskEngine(RiskLimits(max_orders_per_minute=2))
        .check(intent(), view, LAST, NOW)
        .approved
    )


def test_kill_switch_rejects_everything(tmp_path: Path) -> None:
    """While the kill-switch file exists, even a reducing order is rejected."""
    switch = tmp_path / "KILL"
    engine = risk.RiskEngine(RiskLimits(kill_switch_file=str(switch)))
    close = intent(action="CLOSE_POSITION", side=None, volume=None, openPrice=None)
    assert engine.check(close, long(), LAST, NOW).approved
    switch.touch()
    verdict = engine.check(close, long(), LAST, NOW)
    assert verdict.codes == [risk.KILL_SWITCH]


def test_a_kill_switch_that_cannot_be_checked_counts_as_set() -> None:
    """A switch whose path cannot be looked at (here: a name too long for the system)
    fails closed, saying why; it raised out of every check before."""
    engine = risk.RiskEngine(RiskLimits(kill_switch_file="/" + "k" * 5000))
    verdict = engine.check(intent(), long(), LAST, NOW)
    assert verdict.codes == [risk.KILL_SWITCH]
    assert "cannot be checked (File name too long): it counts as set" in verdict.reasons[0].message


@pytest.mark.parametrize("path", ["KILL", "agents/a/KILL", "~/KILL", "./KILL"])
def test_a_relative_kill_switch_is_a_config_error(path: str) -> None:
    """A relative kill-switch file would be looked up in the daemon's working
    directory (under systemd not the agent's): touching it where the operator
    meant would never stop a trade. agent.toml refuses it, naming the key."""
    with pytest.raises(msgspec.ValidationError, match="must be an absolute path"):
        msgspec.convert({"kill_switch_file": path}, RiskLimits)
    assert msgspec.convert({"kill_switch_file": "/run/KILL"}, RiskLimits).kill_switch_file


def test_halted_rejects_everything() -> None:
    """HALTED rejects reducing orders too."""
    engine = risk.RiskEngine(RiskLimits(), TradingState.HALTED)
    close = intent(action="CLOSE_POSITION", side=None, volume=None, openPrice=None)
    assert engine.check(close, long(), LAST, NOW).codes == [risk.HALTED]


def test_reducing_state_allows_only_reducing_orders() -> None:
    """REDUCING accepts a sell against a long and rejects a buy that adds to it."""
    engine = risk.RiskEngine(RiskLimits(), TradingState.REDUCING)
    assert engine.check(intent(), long(), LAST, NOW).codes == [risk.REDUCE_ONLY]
    sell = intent(
        action="PLACE_MARKET_ORDER", side="sell", openPrice=None, stopLoss=None, takeProfit=None
    )
    verdict = engine.check(sell, long(), LAST, NOW)
    assert verdict.approved and verdict.reducing


def test_reducing_order_bypasses_new_risk_rules() -> None:
    """A closing order passes despite a breached daily loss limit and no stop-loss."""
    engine = risk.RiskEngine(RiskLimits(daily_loss_limit=10, max_order_notional=1))
    view = PortfolioView(positions=long().positions, pnl_today=-50.0)
    close = intent(
        action="CLOSE_POSITION",
        side=None,
        volume=None,
        openPrice=None,
        stopLoss=None,
        takeProfit=None,
    )
    verdict = engine.check(close, view, LAST, NOW)
    assert verdict.approved and verdict.order is not None
    assert (verdict.order.action, verdict.order.side, verdict.order.volume) == (
        "PLACE_MARKET_ORDER",
        "sell",
        2.0,
    )


def test_flip_is_not_reducing() -> None:
    """Selling more than the long is a new short and faces every rule."""
    sell = intent(
        action="PLACE_MARKET_ORDER",
        side="sell",
        volume=3.0,
        openPrice=None,
        stopLoss=None,
        takeProfit=None,
    )
    verdict = risk.RiskEngine(RiskLimits()).check(sell, long(), LAST, NOW)
    assert verdict.codes == [risk.STOP_LOSS_REQUIRED]


def test_close_with_no_position() -> None:
    """CLOSE_POSITION when flat is rejected as NOTHING_TO_CLOSE."""
    close = intent(action="CLOSE_POSITION", side=None, volume=None, openPrice=None)
    assert risk.RiskEngine(RiskLimits()).check(close, PortfolioView(), LAST, NOW).codes == [
        risk.NOTHING_TO_CLOSE
    ]


def test_all_failures_are_listed() -> None:
    """Several breaches are all reported, in rule order."""
    limits = RiskLimits(allowed_symbols=("ETH",), max_order_notional=10)
    verdict = risk.RiskEngine(limits).check(intent(stopLoss=None), PortfolioView(), LAST, NOW)
    assert verdict.codes == [risk.SYMBOL_NOT_ALLOWED, risk.STOP_LOSS_REQUIRED, risk.ORDER_NOTIONAL]


def test_every_code_is_covered_here() -> None:
    """Each reason code defined in risk.py is exercised by a test in this module."""
    defined = {v for k, v in vars(risk).items() if k.isupper() and isinstance(v, str) and k == v}
    covered = {c[0] for c in CASES} | {
        risk.KILL_SWITCH,
        risk.HALTED,
        risk.REDUCE_ONLY,
        risk.NOTHING_TO_CLOSE,
        risk.ORDER_CHANGE,  # below
        risk.ORDER_NOT_FOUND,  # the desk's check: tests/trading/test_amend.py
        risk.CUT_SHORT,  # the desk's, at a restart: tests/trading/test_amend.py
    }
    assert defined == covered


def test_a_change_that_does_not_fit_the_order_is_rejected() -> None:
    """A market entry cannot rest, and a stop order has only its trigger to move."""
    engine = risk.RiskEngine(RiskLimits())
    stop = msgspec.structs.replace(
        working(1)[0], role="stop_loss", order_type="stop", side="sell", stop_price=90.0,
        limit_price=None, symbol="BTC",
    )  # fmt: skip
    change = parse_intent({"action": "MODIFY_ORDER", "symbol": "BTC", "orderId": "x", "volume": 2})
    verdict = engine.check_change(change, stop, long(), LAST, NOW)
    assert verdict.codes == [risk.ORDER_CHANGE]
    assert "cannot change volume (it can change: stopLoss)" in verdict.reasons[0].message
    trail = parse_intent(
        {"action": "MODIFY_ORDER", "symbol": "BTC", "orderId": "x", "stopLoss": 95}
    )
    assert engine.check_change(trail, stop, long(), LAST, NOW).approved
