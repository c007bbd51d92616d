"""The typed shapes of the trade path: intents, risk limits, trading state.

:class:`TradeIntent` is defined with the hook decisions it travels in
(:mod:`hooks_runtime.decisions`, converted once at the sandbox boundary) and
re-exported here for the trade path.
"""

from __future__ import annotations

import enum
from typing import Annotated

import msgspec

from daemon.events import Amount
from hooks_runtime.decisions import ORDER_ACTIONS, Action, Side, TradeIntent, parse_intent

__all__ = [
    "ORDER_ACTIONS",
    "Action",
    "RiskLimits",
    "Side",
    "TradeIntent",
    "TradingState",
    "parse_intent",
]

_Count = Annotated[int, msgspec.Meta(ge=0)]


class TradingState(enum.Enum):
    """What the operator allows right now.

    ACTIVE trades normally; REDUCING only accepts orders that shrink a
    position (wind down without new risk); HALTED rejects everything.
    """

    ACTIVE = "ACTIVE"
    REDUCING = "REDUCING"
    HALTED = "HALTED"


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
    max_order_notional: Amount = 1_000.0
    max_position_per_symbol: Amount = 5_000.0
    max_total_exposure: Amount = 20_000.0
    max_open_orders: _Count = 10
    max_orders_per_minute: _Count = 10
    daily_loss_limit: Amount = 500.0
    require_stop_loss: bool = True
    limit_price_band_pct: Amount = 5.0
    kill_switch_file: str = ""

    def __post_init__(self) -> None:
        path = self.kill_switch_file
        if path and not path.startswith("/"):
            # Relative, it would name a file in the daemon's working directory (under
            # systemd /var/lib/marketwake), not the agent's: touching it there or
            # anywhere else would never stop a trade.
            raise ValueError(
                f"kill_switch_file {path!r} must be an absolute path "
                "(a relative one would be looked up in the daemon's working directory)"
            )
