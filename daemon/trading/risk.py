"""The risk engine: every order, from a hook or the LLM, passes here first.

:meth:`RiskEngine.check` is a pure function of the intent, a
:class:`~daemon.trading.portfolio.PortfolioView`, the last price and the time
(the only I/O is a stat of the kill-switch file), so it gives the same answer
live and in replay and is tested with plain values. It runs every rule and
returns all failures, each with a stable code, so the audit log shows the whole
picture rather than only the first problem.

Orders that only shrink an existing position ("reducing") are exempt from the
rules that guard against new risk (stop-loss required, notional, position and
exposure caps, daily loss), so a breached limit never traps an agent in a
losing position. The kill switch, HALTED, symbol allow-list, price band, open
order cap and rate throttle apply to every order.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Final

import msgspec

from daemon.trading.amend import as_placed, misfit
from daemon.trading.intents import RiskLimits, TradeIntent, TradingState
from daemon.trading.portfolio import Order, PortfolioView

KILL_SWITCH: Final = "KILL_SWITCH"
HALTED: Final = "HALTED"
REDUCE_ONLY: Final = "REDUCE_ONLY"
SYMBOL_NOT_ALLOWED: Final = "SYMBOL_NOT_ALLOWED"
NOTHING_TO_CLOSE: Final = "NOTHING_TO_CLOSE"
NO_PRICE: Final = "NO_PRICE"
STOP_LOSS_REQUIRED: Final = "STOP_LOSS_REQUIRED"
BRACKET_WRONG_SIDE: Final = "BRACKET_WRONG_SIDE"
PRICE_BAND: Final = "PRICE_BAND"
ORDER_NOTIONAL: Final = "ORDER_NOTIONAL"
POSITION_LIMIT: Final = "POSITION_LIMIT"
TOTAL_EXPOSURE: Final = "TOTAL_EXPOSURE"
OPEN_ORDERS: Final = "OPEN_ORDERS"
ORDER_RATE: Final = "ORDER_RATE"
DAILY_LOSS: Final = "DAILY_LOSS"
ORDER_NOT_FOUND: Final = "ORDER_NOT_FOUND"
ORDER_CHANGE: Final = "ORDER_CHANGE"
CUT_SHORT: Final = "CUT_SHORT"  # a stop came between the decision and the order

RATE_WINDOW_MS: Final = 60_000


class Reason(msgspec.Struct, frozen=True):
    """One failed rule: a stable ``code`` for machines, a ``message`` for people."""

    code: str
    message: str


class Verdict(msgspec.Struct, frozen=True, kw_only=True):
    """The engine's answer. ``order`` is the intent to send (CLOSE_POSITION resolved
    to a market order of the right side and size); ``None`` when rejected."""

    approved: bool
    reasons: tuple[Reason, ...] = ()
    order: TradeIntent | None = None
    reducing: bool = False
    notional: float = 0.0

    @property
    def codes(self) -> list[str]:
        """The reason codes, in rule order."""
        return [r.code for r in self.reasons]


class _Ctx(msgspec.Struct, frozen=True, kw_only=True):
    intent: TradeIntent
    limits: RiskLimits
    view: PortfolioView
    price: float | None  # entry price: the limit price, else the last price
    last: float | None
    reducing: bool
    now_ms: int


def resolve(intent: TradeIntent, view: PortfolioView) -> TradeIntent | None:
    """Turn CLOSE_POSITION into the market order that closes it (None when flat).

    ``volume`` caps the size (a partial close); a stop or target on a close is dropped.
    """
    if intent.action != "CLOSE_POSITION":
        return intent
    qty = view.quantity(intent.symbol)
    if qty == 0:
        return None
    volume = min(intent.volume or abs(qty), abs(qty))
    return msgspec.structs.replace(
        intent,
        action="PLACE_MARKET_ORDER",
        side="sell" if qty > 0 else "buy",
        volume=volume,
        open_price=None,
        stop_loss=None,  # a closing order needs no bracket
        take_profit=None,
    )


def is_reducing(intent: TradeIntent, view: PortfolioView) -> bool:
    """True when the order shrinks the current position without flipping it."""
    qty = view.quantity(intent.symbol)
    signed = intent.signed_volume
    return qty != 0 and (qty > 0) != (signed > 0) and abs(signed) <= abs(qty)


def _fail(code: str, message: str) -> Reason:
    return Reason(code, message)


def _check_symbol(c: _Ctx) -> Reason | None:
    allowed = c.limits.allowed_symbols
    if allowed and c.intent.symbol not in allowed:
        return _fail(SYMBOL_NOT_ALLOWED, f"{c.intent.symbol} is not in {', '.join(allowed)}")
    return None


def _check_price(c: _Ctx) -> Reason | None:
    if c.last is None or c.last <= 0:
        return _fail(NO_PRICE, f"no last price for {c.intent.symbol}; cannot size or band-check")
    return None


def _check_stop(c: _Ctx) -> Reason | None:
    if c.limits.require_stop_loss and not c.reducing and c.intent.stop_loss is None:
        return _fail(STOP_LOSS_REQUIRED, "orders that add risk must carry a stopLoss")
    return None


def _check_bracket(c: _Ctx) -> Reason | None:
    i, entry = c.intent, c.price
    if entry is None:
        return None
    below, above = (i.stop_loss, i.take_profit) if i.side == "buy" else (i.take_profit, i.stop_loss)
    if (below is not None and below >= entry) or (above is not None and above <= entry):
        return _fail(
            BRACKET_WRONG_SIDE,
            f"for a {i.side} at {entry:g} the stop must be on the losing side and the "
            f"target on the winning side (stopLoss={i.stop_loss}, takeProfit={i.take_profit})",
        )
    return None


def _check_band(c: _Ctx) -> Reason | None:
    i, last, band = c.intent, c.last, c.limits.limit_price_band_pct
    if not i.is_limit or i.open_price is None or last is None or last <= 0:
        return None
    off = abs(i.open_price - last) / last * 100
    if off > band:
        return _fail(
            PRICE_BAND, f"limit {i.open_price:g} is {off:.2f}% from last {last:g} (band {band:g}%)"
        )
    return None


def _check_notional(c: _Ctx) -> Reason | None:
    if c.reducing or c.price is None:
        return None
    notional = (c.intent.volume or 0.0) * c.price
    if notional > c.limits.max_order_notional:
        return _fail(
            ORDER_NOTIONAL, f"order notional {notional:g} > max {c.limits.max_order_notional:g}"
        )
    return None


def _pending(c: _Ctx, symbol: str | None = None) -> float:
    """Signed volume working entry orders have still to fill (they may all fill)."""
    return sum(
        o.signed_remaining
        for o in c.view.open_orders
        if o.role == "entry" and (symbol is None or o.symbol == symbol)
    )


def _check_position(c: _Ctx) -> Reason | None:
    if c.reducing or c.price is None:
        return None
    sym = c.intent.symbol
    projected = abs(c.view.quantity(sym) + _pending(c, sym) + c.intent.signed_volume) * c.price
    if projected > c.limits.max_position_per_symbol:
        return _fail(
            POSITION_LIMIT,
            f"{sym} position would be {projected:g} > max {c.limits.max_position_per_symbol:g}",
        )
    return None


def _check_exposure(c: _Ctx) -> Reason | None:
    if c.reducing or c.price is None:
        return None
    pending = sum(
        abs(o.signed_remaining) * (o.limit_price or c.price)
        for o in c.view.open_orders
        if o.role == "entry"
    )
    total = c.view.exposure() + pending + (c.intent.volume or 0.0) * c.price
    if total > c.limits.max_total_exposure:
        return _fail(
            TOTAL_EXPOSURE,
            f"total exposure would be {total:g} > max {c.limits.max_total_exposure:g}",
        )
    return None


def _check_open_orders(c: _Ctx) -> Reason | None:
    working = sum(1 for o in c.view.open_orders if o.role in ("entry", "close"))
    if working >= c.limits.max_open_orders:
        return _fail(OPEN_ORDERS, f"{working} open orders; max is {c.limits.max_open_orders}")
    return None


def _check_rate(c: _Ctx) -> Reason | None:
    start = c.now_ms - RATE_WINDOW_MS
    recent = sum(1 for t in c.view.recent_order_ms if start < t <= c.now_ms)
    if recent >= c.limits.max_orders_per_minute:
        return _fail(
            ORDER_RATE, f"{recent} orders in the last 60 s; max is {c.limits.max_orders_per_minute}"
        )
    return None


def _check_daily_loss(c: _Ctx) -> Reason | None:
    if c.reducing or c.view.pnl_today > -c.limits.daily_loss_limit:
        return None
    return _fail(
        DAILY_LOSS,
        f"PnL since 00:00 UTC is {c.view.pnl_today:g}, at or beyond the "
        f"-{c.limits.daily_loss_limit:g} limit; only reducing orders are allowed",
    )


_RULES: tuple[Callable[[_Ctx], Reason | None], ...] = (
    _check_symbol,
    _check_price,
    _check_stop,
    _check_bracket,
    _check_band,
    _check_notional,
    _check_position,
    _check_exposure,
    _check_open_orders,
    _check_rate,
    _check_daily_loss,
)


class RiskEngine:
    """Checks orders against one agent's :class:`RiskLimits` and the trading state.

    ``state`` is operator-controlled and may be changed at any time.
    """

    def __init__(self, limits: RiskLimits, state: TradingState = TradingState.ACTIVE) -> None:
        self.limits = limits
        self.state = state

    def kill_switch(self) -> str | None:
        """Why the kill switch stops every order ("" is never returned), or None when it
        does not: its file exists, or it cannot be checked (a switch that cannot be
        read fails closed: an order passing it might be the one it was set to stop)."""
        path = self.limits.kill_switch_file
        if not path:
            return None
        try:
            return f"kill switch {path} is present" if Path(path).exists() else None
        except OSError as exc:
            return f"kill switch {path} cannot be checked ({exc.strerror}): it counts as set"

    def check(
        self, intent: TradeIntent, view: PortfolioView, last_price: float | None, now_ms: int
    ) -> Verdict:
        """Approve or reject ``intent``; every failed rule is listed in ``reasons``."""
        gate = self._gate()
        if gate is not None:
            return Verdict(approved=False, reasons=(gate,))
        order = resolve(intent, view)
        if order is None:
            reason = _fail(NOTHING_TO_CLOSE, f"no open position in {intent.symbol} to close")
            return Verdict(approved=False, reasons=(reason,))
        reducing = is_reducing(order, view)
        ctx = _Ctx(
            intent=order,
            limits=self.limits,
            view=view,
            price=order.open_price if order.is_limit else last_price,
            last=last_price,
            reducing=reducing,
            now_ms=now_ms,
        )
        reasons = [r for r in (rule(ctx) for rule in _RULES) if r is not None]
        if self.state is TradingState.REDUCING and not reducing:
            reasons.insert(
                0,
                _fail(
                    REDUCE_ONLY,
                    "trading state is REDUCING: only orders that shrink a position are accepted",
                ),
            )
        notional = (order.volume or 0.0) * (ctx.price or 0.0)
        if reasons:
            return Verdict(
                approved=False, reasons=tuple(reasons), reducing=reducing, notional=notional
            )
        return Verdict(approved=True, order=order, reducing=reducing, notional=notional)

    def check_change(
        self,
        change: TradeIntent,
        order: Order,
        view: PortfolioView,
        last_price: float | None,
        now_ms: int,
    ) -> Verdict:
        """MODIFY_ORDER on ``order`` (a working order of this agent's account).

        A changed entry is checked as the new limit order it becomes, beside the
        account's other orders (so its old size is not counted twice); the
        order-rate throttle is skipped (no order is placed). A changed stop or
        target must stay on its side of the last price, or it would fire at once.
        """
        gate = self._gate()
        if gate is not None:
            return Verdict(approved=False, reasons=(gate,))
        why = misfit(order, change)
        if why is not None:
            return Verdict(approved=False, reasons=(_fail(ORDER_CHANGE, why),))
        if order.role == "entry":
            others = msgspec.structs.replace(
                view,
                open_orders=tuple(
                    o for o in view.open_orders if o.client_order_id != order.client_order_id
                ),
                recent_order_ms=(),
            )
            verdict = self.check(as_placed(order, change), others, last_price, now_ms)
            return msgspec.structs.replace(verdict, order=change if verdict.approved else None)
        if last_price is None or last_price <= 0:
            reason = _fail(NO_PRICE, f"no last price for {order.symbol}; cannot place the trigger")
            return Verdict(approved=False, reasons=(reason,))
        level = change.stop_loss if order.role == "stop_loss" else change.take_profit
        assert level is not None  # misfit() made sure the role's own field is the one set
        below = (order.role == "stop_loss") == (order.side == "sell")
        if (level >= last_price) if below else (level <= last_price):
            where = "below" if below else "above"
            reason = _fail(
                BRACKET_WRONG_SIDE,
                f"the {order.role} of this position must stay {where} the last price "
                f"{last_price:g} (got {level:g})",
            )
            return Verdict(approved=False, reasons=(reason,))
        return Verdict(approved=True, order=change, reducing=True)

    def _gate(self) -> Reason | None:
        if why := self.kill_switch():
            return _fail(KILL_SWITCH, why)
        if self.state is TradingState.HALTED:
            return _fail(HALTED, "trading state is HALTED")
        return None
