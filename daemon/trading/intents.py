"""The typed shapes of the trade path: intents, risk limits, trading state.

A hook returns its intent as a plain dict (seed 001 §6); :func:`parse_intent`
turns it into a :class:`TradeIntent` or raises :exc:`HookResultInvalid` with a
message that names the offending key, because a malformed intent is a hook bug
and must be recorded, never traded.
"""

from __future__ import annotations

import enum
import math
from typing import Any, Literal

import msgspec

from daemon.errors import HookResultInvalid

Action = Literal["PLACE_LIMIT_ORDER", "PLACE_MARKET_ORDER", "CLOSE_POSITION"]
Side = Literal["buy", "sell"]


class TradingState(enum.Enum):
    """What the operator allows right now.

    ACTIVE trades normally; REDUCING only accepts orders that shrink a
    position (wind down without new risk); HALTED rejects everything.
    """

    ACTIVE = "ACTIVE"
    REDUCING = "REDUCING"
    HALTED = "HALTED"


def _finite_positive(name: str, value: float | None) -> None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0 (got {value!r})")


_WIRE_NAMES = {
    "volume": "volume",
    "open_price": "openPrice",
    "stop_loss": "stopLoss",
    "take_profit": "takeProfit",
}


class TradeIntent(
    msgspec.Struct, frozen=True, kw_only=True, rename="camel", forbid_unknown_fields=True
):
    """One order a hook (or the LLM) proposes; camelCase on the wire.

    ``side`` and ``volume`` are required for the PLACE_* actions. CLOSE_POSITION
    closes the whole position in ``symbol`` at market unless ``volume`` is
    given; its side is derived from the position, so it may be omitted.
    Unknown keys are rejected so that ``stoploss`` (a typo) cannot silently
    drop the stop.
    """

    action: Action
    symbol: str
    side: Side | None = None
    volume: float | None = None
    open_price: float | None = None
    stop_loss: float | None = None
    take_profit: float | None = None
    comment: str = ""

    def __post_init__(self) -> None:
        if not self.symbol or len(self.symbol) > 64:
            raise ValueError("symbol must be a non-empty string of at most 64 characters")
        for attr, wire in _WIRE_NAMES.items():
            _finite_positive(wire, getattr(self, attr))
        if self.action != "CLOSE_POSITION" and (self.side is None or self.volume is None):
            raise ValueError(f"{self.action} needs side and volume")
        if self.action == "PLACE_LIMIT_ORDER" and self.open_price is None:
            raise ValueError("PLACE_LIMIT_ORDER needs openPrice")
        if len(self.comment) > 256:
            raise ValueError("comment is longer than 256 characters")

    @property
    def is_limit(self) -> bool:
        """True for a resting limit order."""
        return self.action == "PLACE_LIMIT_ORDER"

    @property
    def signed_volume(self) -> float:
        """Volume with sign: + for buy, - for sell (0 when not known yet)."""
        vol = self.volume or 0.0
        return vol if self.side == "buy" else -vol


def parse_intent(raw: Any) -> TradeIntent:
    """Validate a hook's intent dict; errors name the key and what was wrong."""
    if not isinstance(raw, dict):
        raise HookResultInvalid(f"intent must be an object, got {type(raw).__name__}")
    try:
        return msgspec.convert(raw, TradeIntent)
    except msgspec.ValidationError as exc:
        raise HookResultInvalid(f"invalid trade intent: {exc}") from None


class RiskLimits(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Hard limits one agent's orders must respect (agent.toml ``[risk]``).

    Notional amounts are in the quote currency (price x volume). Every field
    has a conservative default so an agent without a ``[risk]`` table still
    gets limits. An empty ``allowed_symbols`` means any symbol. ``daily_loss_limit``
    is a positive amount; once realized + unrealized PnL since UTC midnight is
    at or below ``-daily_loss_limit``, only position-reducing orders pass.
    ``kill_switch_file``: when this path exists, every order is rejected.
    """

    allowed_symbols: tuple[str, ...] = ()
    max_order_notional: float = 1_000.0
    max_position_per_symbol: float = 5_000.0
    max_total_exposure: float = 20_000.0
    max_open_orders: int = 10
    max_orders_per_minute: int = 10
    daily_loss_limit: float = 500.0
    require_stop_loss: bool = True
    limit_price_band_pct: float = 5.0
    kill_switch_file: str = ""

    def __post_init__(self) -> None:
        for name in (
            "max_order_notional",
            "max_position_per_symbol",
            "max_total_exposure",
            "daily_loss_limit",
            "limit_price_band_pct",
        ):
            _finite_positive(name, getattr(self, name))
        if self.max_open_orders < 0 or self.max_orders_per_minute < 0:
            raise ValueError("max_open_orders and max_orders_per_minute must be >= 0")
