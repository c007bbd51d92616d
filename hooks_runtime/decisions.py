"""The typed decisions a hook returns, and the trade intents inside them.

A hook returns a plain dict (seed 001 §6). The sandbox checks its exact JSON
types (:mod:`hooks_runtime.validate`, the input is hostile); :func:`to_decision`
then converts it, once, into one of the tagged Structs below, and everything
downstream (dispatcher, audit, desk) matches on types instead of dict keys.
The LLM's ``submit_trading_signal`` and copy trading build the same
:class:`TradeIntent`, so there is one definition of what an order may say.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Final, Literal

import msgspec

from daemon.errors import HookResultInvalid

Action = Literal[
    "PLACE_LIMIT_ORDER", "PLACE_MARKET_ORDER", "CLOSE_POSITION", "MODIFY_ORDER", "CANCEL_ORDER"
]
Side = Literal["buy", "sell"]
ORDER_ACTIONS: Final = frozenset({"MODIFY_ORDER", "CANCEL_ORDER"})

# Prices and sizes: strictly positive, and far below anything a float loses
# precision on (rejects inf, which msgpack can carry even though JSON cannot).
# daemon.events.Amount, written again: the sandbox worker imports nothing of the
# daemon but its errors (tests/sandbox/test_decisions.py holds the two equal).
Positive = Annotated[float, msgspec.Meta(gt=0, lt=1e15)]
Symbol = Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
OrderId = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
#: The longest a limit order may be good for (a year).
MAX_EXPIRY_SECONDS: Final = 366 * 86400.0
Expiry = Annotated[float, msgspec.Meta(gt=0, le=MAX_EXPIRY_SECONDS)]
MAX_DEDUPE_KEY: Final = 256


class TradeIntent(
    msgspec.Struct,
    frozen=True,
    kw_only=True,
    rename="camel",
    forbid_unknown_fields=True,
    omit_defaults=True,
):
    """One order action a hook (or the LLM) proposes; camelCase on the wire.

    * ``PLACE_*``: ``side`` and ``volume`` required; a limit also ``openPrice``,
      and it may say ``expiresInSeconds``: good till then, canceled at the first
      price after (else it works until filled or canceled).
    * ``CLOSE_POSITION``: closes the whole position in ``symbol`` at market
      (or ``volume`` of it); the side comes from the position.
    * ``MODIFY_ORDER``: ``orderId`` (a working order's ``clientOrderId``) and
      what changes: ``openPrice`` and ``volume`` of a resting entry, its
      ``stopLoss`` / ``takeProfit``, or the trigger of a stop-loss or
      take-profit order that protects a position.
    * ``CANCEL_ORDER``: ``orderId`` only.

    Unknown keys are rejected so that ``stoploss`` (a typo) cannot silently
    drop the stop.
    """

    action: Action
    symbol: Symbol
    side: Side | None = None
    volume: Positive | None = None
    open_price: Positive | None = None
    stop_loss: Positive | None = None
    take_profit: Positive | None = None
    order_id: OrderId | None = None
    comment: Annotated[str, msgspec.Meta(max_length=256)] = ""
    expires_in_seconds: Expiry | None = None

    def __post_init__(self) -> None:
        # Only the rules between fields; bounds live in the annotations.
        a = self.action
        if self.expires_in_seconds is not None and a != "PLACE_LIMIT_ORDER":
            raise ValueError(f"expiresInSeconds is only for PLACE_LIMIT_ORDER, not {a}")
        if a in ORDER_ACTIONS:
            if self.order_id is None:
                raise ValueError(f"{a} needs orderId (the clientOrderId of a working order)")
            if self.side is not None:
                raise ValueError(f"{a} takes no side (it is the order's)")
            changes = (self.open_price, self.volume, self.stop_loss, self.take_profit)
            if a == "MODIFY_ORDER" and all(v is None for v in changes):
                raise ValueError("MODIFY_ORDER needs openPrice, volume, stopLoss or takeProfit")
            if a == "CANCEL_ORDER" and any(v is not None for v in changes):
                raise ValueError("CANCEL_ORDER takes only symbol and orderId")
            return
        if self.order_id is not None:
            raise ValueError(f"orderId is only for MODIFY_ORDER and CANCEL_ORDER, not {a}")
        if a != "CLOSE_POSITION" and (self.side is None or self.volume is None):
            raise ValueError(f"{a} needs side and volume")
        if a == "PLACE_LIMIT_ORDER" and self.open_price is None:
            raise ValueError("PLACE_LIMIT_ORDER needs openPrice")

    @property
    def is_limit(self) -> bool:
        """True for a resting limit order."""
        return self.action == "PLACE_LIMIT_ORDER"

    @property
    def signed_volume(self) -> float:
        """Volume with sign: + for buy, - for sell (0 when not known yet)."""
        vol = self.volume or 0.0
        return vol if self.side == "buy" else -vol


class _Decision(
    msgspec.Struct,
    frozen=True,
    kw_only=True,
    rename="camel",
    tag_field="decision",
    forbid_unknown_fields=True,
    omit_defaults=True,
):
    reason: str
    dedupe_key: Annotated[str, msgspec.Meta(max_length=MAX_DEDUPE_KEY)] | None = None
    cooldown_seconds: Annotated[float, msgspec.Meta(ge=0)] | None = None
    data: Any = None  # free JSON for the audit log and state.lastOutputs

    @property
    def name(self) -> str:
        """The wire name: ``IGNORE``, ``WAKE``, ``ALERT`` or ``TRADE_INTENT``."""
        return str(self.__struct_config__.tag)


class Ignore(_Decision, frozen=True, tag="IGNORE"):
    """Nothing to do."""


class Wake(_Decision, frozen=True, tag="WAKE"):
    """Run the agent (the wake scheduler decides when)."""


class Alert(_Decision, frozen=True, tag="ALERT"):
    """Tell the operator; the agent is not run."""


class Trade(_Decision, frozen=True, tag="TRADE_INTENT"):
    """Send ``intent`` through the agent's risk engine to its account."""

    intent: TradeIntent


Decision = Ignore | Wake | Alert | Trade
_BY_NAME: Final[dict[str, type[Decision]]] = {
    "IGNORE": Ignore,
    "WAKE": Wake,
    "ALERT": Alert,
    "TRADE_INTENT": Trade,
}
ALLOWED_DECISIONS: Final[dict[str, frozenset[str]]] = {
    "wake": frozenset({"IGNORE", "WAKE", "ALERT"}),
    "autotrade": frozenset({"IGNORE", "TRADE_INTENT", "ALERT"}),
    "copytrade": frozenset({"IGNORE", "TRADE_INTENT", "ALERT"}),
}
_UNKNOWN = re.compile(r"Object contains unknown field `([^`]+)`(.*)")


def to_decision(value: dict[str, Any], kind: str) -> Decision:
    """Convert a hook's (type-checked) dict into its Decision, or raise
    :exc:`HookResultInvalid` with a message that names the key."""
    name = value.get("decision")
    allowed = ALLOWED_DECISIONS.get(kind, frozenset())
    if type(name) is not str or name not in allowed:
        raise HookResultInvalid(_not_allowed(value, name, kind, allowed))
    try:
        return msgspec.convert(value, _BY_NAME[name])
    except msgspec.ValidationError as exc:
        raise HookResultInvalid(f"invalid {name} result: {_explain(exc, _BY_NAME[name])}") from None


def _not_allowed(value: dict[str, Any], name: object, kind: str, allowed: frozenset[str]) -> str:
    """Why ``name`` is no decision of a ``kind`` hook, with the likely slip named: a
    missing key (a typo of it), or a name spelled in the wrong case."""
    one_of = f"one of {sorted(allowed)}"
    if "decision" not in value:
        keys = ", ".join(repr(k) for k in sorted(value, key=str)[:8])
        return f"the result has no 'decision' key ({one_of}); its keys: {keys or 'none'}"
    hint = ""
    if type(name) is str and name.upper() in allowed:
        hint = f" (did you mean {name.upper()!r}?)"
    return f"decision {name!r} is not allowed in {kind}_* hooks ({one_of}){hint}"


def _explain(exc: msgspec.ValidationError, top: type[msgspec.Struct]) -> str:
    """msgspec's message, with the allowed keys listed when one is unknown."""
    msg = str(exc)
    unknown = _UNKNOWN.match(msg)
    if unknown is None:
        return msg
    key, where = unknown.groups()
    if key == "intent" and not where:
        return "intent is only allowed with TRADE_INTENT"
    fields = msgspec.structs.fields(TradeIntent if where else top)
    return f"unknown key {key!r}{where}; allowed: {sorted(f.encode_name for f in fields)}"


def parse_intent(raw: Any) -> TradeIntent:
    """Validate an intent given as a dict (the LLM's tool, copy trading, tests)."""
    if not isinstance(raw, dict):
        raise HookResultInvalid(f"intent must be an object, got {type(raw).__name__}")
    try:
        return msgspec.convert(raw, TradeIntent)
    except msgspec.ValidationError as exc:
        raise HookResultInvalid(f"invalid trade intent: {_explain(exc, TradeIntent)}") from None


def to_builtins(decision: Decision) -> dict[str, Any]:
    """The decision as the JSON a hook sees in ``state.lastOutputs``."""
    out: dict[str, Any] = msgspec.to_builtins(decision)
    return out
