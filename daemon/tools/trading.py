"""The agent's trading tools: ``submit_trading_signal`` (seed 002), ``get_positions``,
``get_orders``.

They act for the agent whose LLM run calls them (:class:`AgentCall` in the
context) and only on that agent's own paper account. A signal becomes a
:class:`TradeIntent` through the same trade desk as a hook's TRADE_INTENT: the
agent's risk engine, then the broker, every step audited with the run's trace
id. It is idempotent per (run, symbol): a retried call returns the first
order, it never places a second one. Over MCP they act for the agent named in
``[mcp] agent`` (once per distinct signal per session); without one they
answer ``unavailable``.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from daemon.events import Amount
from daemon.tools.base import Tool, ToolError
from daemon.tools.calls import AgentCall
from daemon.tools.context import ToolContext
from daemon.tools.snapshot import Product
from daemon.trading.desk import TradeDesk
from daemon.trading.intents import Side, TradeIntent

Score = Annotated[float, msgspec.Meta(ge=0)]
Price = Amount


class SignalRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Seed 002's ten parameters. The side follows from the stop: below the entry a
    long, above it a short."""

    symbol: Product
    confidence: Annotated[float, msgspec.Meta(ge=0, le=100)]
    entry_price: Price
    stop_loss: Price
    tp1: Price
    technical_score: Annotated[Score, msgspec.Meta(le=40)]
    sentiment_score: Annotated[Score, msgspec.Meta(le=30)]
    liquidity_score: Annotated[Score, msgspec.Meta(le=20)]
    correlation_score: Annotated[Score, msgspec.Meta(le=10)]
    analysis: Annotated[str, msgspec.Meta(max_length=4000)]


class SignalResult(msgspec.Struct, frozen=True):
    """What became of the signal: traded (with the risk verdict and the order) or not."""

    symbol: str
    side: str
    traded: bool
    message: str
    approved: bool | None = None
    reasons: list[dict[str, str]] = msgspec.field(default_factory=list)
    order_id: str | None = None
    order_status: str | None = None
    duplicate: bool = False


class AccountRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """No arguments: the calling agent's own account."""


class Positions(msgspec.Struct, frozen=True):
    """The agent's open positions by symbol (camelCase records)."""

    account: str
    positions: dict[str, Any]


class Orders(msgspec.Struct, frozen=True):
    """The agent's working orders (entries and their stop-loss / take-profit)."""

    account: str
    orders: list[Any]


def _caller(ctx: ToolContext) -> tuple[AgentCall, TradeDesk] | ToolError:
    if ctx.agent is not None and ctx.desk is not None:
        return ctx.agent, ctx.desk
    if ctx.acting_for:
        return ToolError(
            error="unavailable",
            message=f"agent {ctx.acting_for!r} ([mcp] agent) is not running in this daemon",
            suggestion="check that agents/<id>/ exists, is enabled and loads "
            "(marketwake config check), or change [mcp] agent",
        )
    return ToolError(
        error="unavailable",
        message="this tool acts for an agent: inside an agent's LLM run, or over the "
        "daemon's MCP server when [mcp] agent names one",
        suggestion="call it from an agent run, or serve MCP from the daemon with "
        '[mcp] enabled = true and agent = "<id>"',
    )


def _signal_key(call: AgentCall, req: SignalRequest, side: Side) -> str:
    """What makes a repeated call the same signal (see :class:`AgentCall`)."""
    if call.one_signal_per_symbol:
        return f"signal:{call.run_id}:{req.symbol}"
    return (
        f"signal:{call.run_id}:{req.symbol}:{side}:"
        f"{req.entry_price!r}:{req.stop_loss!r}:{req.tp1!r}"
    )


async def submit_trading_signal(ctx: ToolContext, req: SignalRequest) -> msgspec.Struct:
    """Risk-check and place the signal for the calling agent."""
    caller = _caller(ctx)
    if isinstance(caller, ToolError):
        return caller
    call, desk = caller
    if req.stop_loss == req.entry_price:
        return ToolError(
            error="invalid_arguments",
            message="stop_loss equals entry_price: the side cannot be told",
            suggestion="put stop_loss below entry_price for a long, above it for a short",
        )
    side: Side = "buy" if req.stop_loss < req.entry_price else "sell"
    if req.confidence < call.min_confidence:
        return SignalResult(
            symbol=req.symbol,
            side=side,
            traded=False,
            message=(
                f"recorded, not traded: confidence {req.confidence:g} is below this "
                f"agent's threshold {call.min_confidence:g}"
            ),
        )
    intent = TradeIntent(
        action="PLACE_LIMIT_ORDER",
        symbol=req.symbol,
        side=side,
        volume=call.signal_notional / req.entry_price,
        open_price=req.entry_price,
        stop_loss=req.stop_loss,
        take_profit=req.tp1,
        comment=f"signal {req.confidence:g}: {req.analysis}"[:256],
        expires_in_seconds=call.signal_expiry_seconds or None,
    )
    outcome = await desk.handle(
        intent,
        agent_id=call.agent_id,
        dedupe_key=_signal_key(call, req, side),
        trace_id=call.trace_id,
        hook_id="submit_trading_signal",
        event_id=call.event_id,
        ahead=True,
    )
    verdict, order = outcome.verdict, outcome.order
    approved = None if verdict is None else verdict.approved
    if outcome.duplicate:
        message = "already submitted in this run: the first order stands"
    elif order is not None:
        message = f"order {order.client_order_id} is {order.status}"
    else:
        message = "rejected by the risk engine"
    return SignalResult(
        symbol=req.symbol,
        side=side,
        traded=order is not None,
        message=message,
        approved=approved,
        reasons=[{"code": r.code, "message": r.message} for r in verdict.reasons]
        if verdict is not None
        else [],
        order_id=order.client_order_id if order is not None else None,
        order_status=order.status if order is not None else None,
        duplicate=outcome.duplicate,
    )


def _account(ctx: ToolContext) -> tuple[str, TradeDesk] | ToolError:
    """The calling agent's account and the desk holding it."""
    caller = _caller(ctx)
    if isinstance(caller, ToolError):
        return caller
    call, desk = caller
    return desk.account_of(call.agent_id), desk


async def get_positions(ctx: ToolContext, _: AccountRequest) -> msgspec.Struct:
    """The calling agent's open positions."""
    own = _account(ctx)
    if isinstance(own, ToolError):
        return own
    account, desk = own
    return Positions(account, msgspec.to_builtins(desk.broker.positions(account)))


async def get_orders(ctx: ToolContext, _: AccountRequest) -> msgspec.Struct:
    """The calling agent's working orders."""
    own = _account(ctx)
    if isinstance(own, ToolError):
        return own
    account, desk = own
    return Orders(account, msgspec.to_builtins(desk.broker.open_orders(account)))


SUBMIT: Tool[SignalRequest, ToolContext] = Tool(
    name="submit_trading_signal",
    title="Submit a trading signal",
    description=(
        "Submit your final trading decision for one symbol: confidence (0-100, the sum "
        "of technical 0-40, sentiment 0-30, liquidity 0-20 and correlation 0-10 scores), "
        "entry_price, stop_loss, tp1 and a short analysis. Call it ONCE, as your last "
        "step. A stop below the entry means long, above means short. Signals at or above "
        "the agent's confidence threshold become a limit order through the agent's risk "
        "engine; the answer says whether it was approved and the order id. Calling it "
        "again for the same symbol in the same run does not place a second order."
    ),
    request=SignalRequest,
    run=submit_trading_signal,
    timeout_seconds=10.0,
)
POSITIONS: Tool[AccountRequest, ToolContext] = Tool(
    name="get_positions",
    title="Your open positions",
    description="Your paper account's open positions by symbol (quantity > 0 long, < 0 short).",
    request=AccountRequest,
    run=get_positions,
    timeout_seconds=5.0,
)
ORDERS: Tool[AccountRequest, ToolContext] = Tool(
    name="get_orders",
    title="Your working orders",
    description="Your paper account's working orders, including stop-loss and take-profit.",
    request=AccountRequest,
    run=get_orders,
    timeout_seconds=5.0,
)
