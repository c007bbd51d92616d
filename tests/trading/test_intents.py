"""TradeIntent and RiskLimits validation."""

from __future__ import annotations

import msgspec
import pytest

from daemon.errors import HookResultInvalid
from daemon.trading.intents import RiskLimits, parse_intent

SEED_INTENT = {
    "action": "PLACE_LIMIT_ORDER",
    "symbol": "ETHUSDm",
    "side": "buy",
    "volume": 0.01,
    "openPrice": 1000.0,
    "stopLoss": 990.0,
    "takeProfit": 1020.0,
}


def test_seed_intent_parses() -> None:
    """The intent from seed 001 §6 decodes with every field in place."""
    intent = parse_intent(SEED_INTENT)
    assert (intent.symbol, intent.side, intent.volume) == ("ETHUSDm", "buy", 0.01)
    assert (intent.open_price, intent.stop_loss, intent.take_profit) == (1000.0, 990.0, 1020.0)
    assert intent.is_limit and intent.signed_volume == 0.01


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"action": "BUY_NOW"}, "$.action"),
        ({"stoploss": 1.0}, "stoploss"),
        ({"openPrice": None}, "needs openPrice"),
        ({"volume": float("nan")}, "$.volume"),
        ({"volume": -1}, "> 0.0 - at `$.volume`"),
        ({"side": "long"}, "$.side"),
        ({"side": None}, "needs side and volume"),
        ({"symbol": ""}, "length >= 1 - at `$.symbol`"),
        ({"orderId": "x"}, "orderId is only for"),
        ({"action": "CANCEL_ORDER", "side": None, "orderId": "o"}, "takes only symbol and orderId"),
        ({"action": "MODIFY_ORDER", "side": None}, "needs orderId"),
        ({"stopLoss": "990"}, "$.stopLoss"),
    ],
)
def test_bad_intent_names_the_problem(change: dict[str, object], needle: str) -> None:
    """A malformed intent raises HookResultInvalid whose message points at the key."""
    with pytest.raises(HookResultInvalid) as info:
        parse_intent({**SEED_INTENT, **change})
    assert needle in str(info.value)


def test_intent_must_be_a_dict() -> None:
    """A non-dict intent is a hook error, not a crash."""
    with pytest.raises(HookResultInvalid, match="must be an object"):
        parse_intent(["PLACE_MARKET_ORDER"])


def test_close_position_needs_no_side() -> None:
    """CLOSE_POSITION only needs the symbol; side comes from the position."""
    intent = parse_intent({"action": "CLOSE_POSITION", "symbol": "BTC-USD"})
    assert intent.side is None and intent.volume is None


def test_risk_limits_reject_unknown_and_bad_values() -> None:
    """RiskLimits refuses typos and non-positive amounts (config safety)."""
    with pytest.raises(msgspec.ValidationError, match="max_notional"):
        msgspec.convert({"max_notional": 5}, RiskLimits)
    with pytest.raises(msgspec.ValidationError, match="daily_loss_limit"):
        msgspec.convert({"daily_loss_limit": 0}, RiskLimits)
    assert msgspec.convert({"allowed_symbols": ["BTC-USD"]}, RiskLimits).allowed_symbols == (
        "BTC-USD",
    )
