"""Typed decisions: a hook's dict becomes one tagged Struct, once, or a clear error."""

from __future__ import annotations

import typing

import msgspec
import pytest

from daemon.errors import HookResultInvalid
from daemon.events import Amount
from hooks_runtime.decisions import (
    Alert,
    Ignore,
    Positive,
    Trade,
    TradeIntent,
    Wake,
    parse_intent,
    to_builtins,
    to_decision,
)

BUY = {"action": "PLACE_MARKET_ORDER", "symbol": "BTC-USD", "side": "buy", "volume": 0.1}


@pytest.mark.parametrize(
    ("raw", "kind", "typed"),
    [
        ({"decision": "IGNORE", "reason": "flat"}, "wake", Ignore(reason="flat")),
        (
            {"decision": "WAKE", "reason": "rsi", "dedupeKey": "k", "cooldownSeconds": 60},
            "wake",
            Wake(reason="rsi", dedupe_key="k", cooldown_seconds=60.0),
        ),
        ({"decision": "ALERT", "reason": "a", "data": {"x": [1]}}, "autotrade", Alert(reason="a", data={"x": [1]})),
        (
            {"decision": "TRADE_INTENT", "reason": "t", "intent": BUY},
            "copytrade",
            Trade(reason="t", intent=TradeIntent(action="PLACE_MARKET_ORDER", symbol="BTC-USD", side="buy", volume=0.1)),
        ),
    ],
)  # fmt: skip
def test_each_decision_converts_to_its_type_and_back(
    raw: dict[str, object], kind: str, typed: object
) -> None:
    """The dict converts to its own Struct; ``to_builtins`` gives the hook's JSON
    back (what ``state.lastOutputs`` shows), with defaults left out."""
    got = to_decision(raw, kind)
    assert got == typed and type(got) is type(typed)
    assert to_builtins(got) == {
        **raw,
        **({"cooldownSeconds": 60.0} if "cooldownSeconds" in raw else {}),
    }
    assert got.name == raw["decision"]


def test_an_unknown_key_lists_the_allowed_ones() -> None:
    """A typo names itself and what would have been accepted."""
    with pytest.raises(
        HookResultInvalid, match=r"unknown key 'cooldown'; allowed: \[.*'cooldownSeconds'"
    ):
        to_decision({"decision": "WAKE", "reason": "x", "cooldown": 5}, "wake")
    with pytest.raises(HookResultInvalid, match="intent is only allowed with TRADE_INTENT"):
        to_decision({"decision": "ALERT", "reason": "x", "intent": BUY}, "autotrade")
    with pytest.raises(
        HookResultInvalid, match=r"unknown key 'stoploss' - at `\$.intent`.*'stopLoss'"
    ):
        to_decision(
            {"decision": "TRADE_INTENT", "reason": "x", "intent": {**BUY, "stoploss": 1}},
            "autotrade",
        )


def test_a_bad_intent_is_an_invalid_result_naming_the_field() -> None:
    """A malformed intent is a hook bug caught at the boundary, never traded."""
    with pytest.raises(
        HookResultInvalid, match=r"invalid TRADE_INTENT result: .* `\$.intent.volume`"
    ):
        to_decision(
            {"decision": "TRADE_INTENT", "reason": "x", "intent": {**BUY, "volume": -1}},
            "autotrade",
        )
    with pytest.raises(HookResultInvalid, match="PLACE_LIMIT_ORDER needs openPrice"):
        to_decision(
            {
                "decision": "TRADE_INTENT",
                "reason": "x",
                "intent": {**BUY, "action": "PLACE_LIMIT_ORDER"},
            },
            "autotrade",
        )


def test_decisions_are_restricted_by_hook_kind() -> None:
    """A wake hook cannot trade and a trading hook cannot wake the agent."""
    with pytest.raises(HookResultInvalid, match=r"not allowed in wake_\* hooks"):
        to_decision({"decision": "TRADE_INTENT", "reason": "x", "intent": BUY}, "wake")
    with pytest.raises(HookResultInvalid, match=r"not allowed in autotrade_\* hooks"):
        to_decision({"decision": "WAKE", "reason": "x"}, "autotrade")


def test_an_intents_numbers_have_the_daemons_bound() -> None:
    """The worker's copy of the bound on prices and sizes is the daemon's (signals and
    tools use that one: what passes a door can become an order)."""
    assert typing.get_args(Positive) == typing.get_args(Amount)


def test_a_missing_or_miscased_decision_names_the_slip() -> None:
    """A result without the key lists the keys it has (a typo shows); a decision in
    the wrong case says which one was meant."""
    with pytest.raises(HookResultInvalid, match=r"no 'decision' key .*its keys: 'decison', 'r'"):
        to_decision({"decison": "WAKE", "r": 1}, "wake")
    with pytest.raises(HookResultInvalid, match=r"its keys: none"):
        to_decision({}, "wake")
    with pytest.raises(HookResultInvalid, match=r"'wake' is not allowed .*did you mean 'WAKE'"):
        to_decision({"decision": "wake", "reason": "x"}, "wake")
    with pytest.raises(HookResultInvalid, match=r"'WAKE' is not allowed[^?]*$"):
        to_decision({"decision": "WAKE", "reason": "x"}, "autotrade")  # no hint: a kind slip


def test_modify_and_cancel_intents() -> None:
    """MODIFY_ORDER needs an orderId and a change; CANCEL_ORDER only the orderId."""
    mod = parse_intent(
        {"action": "MODIFY_ORDER", "symbol": "BTC-USD", "orderId": "o1", "stopLoss": 90.0}
    )
    assert (mod.order_id, mod.stop_loss, mod.side) == ("o1", 90.0, None)
    cancel = parse_intent({"action": "CANCEL_ORDER", "symbol": "BTC-USD", "orderId": "o1"})
    assert cancel.order_id == "o1"
    with pytest.raises(HookResultInvalid, match="needs openPrice, volume, stopLoss or takeProfit"):
        parse_intent({"action": "MODIFY_ORDER", "symbol": "BTC-USD", "orderId": "o1"})
    with pytest.raises(HookResultInvalid, match="takes no side"):
        parse_intent(
            {"action": "CANCEL_ORDER", "symbol": "BTC-USD", "orderId": "o1", "side": "buy"}
        )
    with pytest.raises(HookResultInvalid, match=r"`\$.orderId`"):
        parse_intent({"action": "CANCEL_ORDER", "symbol": "BTC-USD", "orderId": ""})
    assert msgspec.json.decode(msgspec.json.encode(mod), type=TradeIntent) == mod
