"""``wait_for_market_event``: wait server-side until ticker conditions hold (seed 000).

The conditions and answers are :mod:`daemon.tools.market_watch` (sans-I/O);
this module wires them to the daemon's shared Coinbase pool through the
:class:`~daemon.tools.waitboard.WaitBoard`:

* products are ref-counted in the pool: the wait adds those nobody holds and
  releases them when it returns, is cancelled, or its client goes away;
* a product someone else already holds starts from the pool's last tick (its
  level conditions are checked at once; it is the previous value for crosses);
* conditions are checked in the pool's reader as each tick arrives (not
  queued): no tick is ever dropped or coalesced, a tick wakes only the waits it
  triggers, and it reaches only the waits whose thresholds it can meet.
"""

from __future__ import annotations

import time

import anyio
import msgspec

from daemon.events import TickPayload, iso_ms, parse_iso_ms
from daemon.state import StateCache
from daemon.tools.base import Problem, Tool, ToolError
from daemon.tools.context import ToolContext
from daemon.tools.market_watch import MarketWatch, WaitRequest, check_products, unwatched
from daemon.tools.waitboard import WaitBoard, Waiter
from feeds.coinbase_ws.pool import Tick
from feeds.coinbase_ws.protocol import Ticker


async def wait_for_market_event(ctx: ToolContext, req: WaitRequest) -> msgspec.Struct:
    """Wait until a subscription's conditions hold or ``timeout`` seconds pass."""
    if ctx.market_ms is not None:
        return at_market_time(ctx.state or StateCache(), ctx.market_ms, req)
    bad = check_products(req.subscriptions)
    if bad is not None:
        return bad
    if ctx.pool is None:
        return ToolError(
            error="unavailable",
            message="no Coinbase market-data connection in this process",
            suggestion="enable [feeds.coinbase_ws] or run the daemon's MCP server",
        )
    watch = MarketWatch(list(req.subscriptions))
    if ctx.catalog is not None:
        unknown = await ctx.catalog.unknown(sorted(watch.products))
        if unknown:
            return ToolError(
                error="not_found",
                message=f"unknown product id(s): {', '.join(unknown)}",
                problems=[
                    Problem(
                        path=f"subscriptions[{i}].productId",
                        message=f"{s.product_id} is not listed by Coinbase",
                    )
                    for i, s in enumerate(req.subscriptions)
                    if s.product_id in unknown
                ],
                suggestion="check the id on Coinbase (e.g. 'BTC-USD', 'ETH-EUR')",
            )
    board = WaitBoard.of(ctx.pool)
    if board.full:
        return ToolError(
            error="unavailable",
            message=f"too many waits parked ({board.parked}): try again shortly",
            suggestion="wait on fewer products or conditions at once",
        )
    started, before = time.monotonic(), ctx.pool.statistics()
    waiter = Waiter(watch)
    with board.park(waiter):
        if waiter.hit is None:
            with anyio.move_on_after(req.timeout):
                await waiter.done.wait()
        if waiter.hit is not None:
            return waiter.hit
        last = board.last_ticks(watch.products)
    warning = unwatched(before, ctx.pool.statistics())
    return watch.timed_out(time.monotonic() - started, last, warning)


REPLAY_WARNING = (
    "this is a replay: the conditions were checked once, on the last price before "
    "its time, without waiting (in an agent's run the market does not move: a run "
    "takes no event time); a level not reached yet can only be watched by the "
    "agent's hooks, which wake it when it is"
)


def at_market_time(state: StateCache, now_ms: int, req: WaitRequest) -> msgspec.Struct:
    """On event time: the conditions checked once, on each product's last tick (else
    its newest close) in the agent's state; the answer never waits. A product is
    any symbol the replay holds (``BTCUSDT`` too); one it holds no price of yet is
    ``not_found``."""
    ticks = {s.product_id: replayed_tick(state, s.product_id) for s in req.subscriptions}
    missing = sorted(p for p, t in ticks.items() if t is None)
    if missing:
        at = iso_ms(now_ms)
        return ToolError(
            error="not_found",
            message=f"the replay holds no price of {', '.join(missing)} before {at}",
            problems=[
                Problem(path=f"subscriptions[{i}].productId", message=f"no price before {at}")
                for i, s in enumerate(req.subscriptions)
                if s.product_id in missing
            ],
            suggestion=f"use a symbol the replay holds: {', '.join(state.symbols()[:20]) or 'none yet'}",
        )
    watch = MarketWatch(list(req.subscriptions))
    known = {p: t for p, t in sorted(ticks.items()) if t is not None}
    for tick in known.values():
        hit = watch.check(tick, {}, now_ms)
        if hit is not None:
            return hit
    return watch.timed_out(0.0, known, REPLAY_WARNING, now_ms)


def replayed_tick(state: StateCache, product: str) -> Tick | None:
    """``product``'s last tick in ``state`` as the pool would hand it over; a replay
    of candles has none, and its newest close stands for the price."""
    payload = state.tick(product)
    if payload is not None:
        ts = payload.pop("ts", None)
        try:
            fields = msgspec.convert(payload, TickPayload, strict=False)
            ts_ms = parse_iso_ms(ts) if isinstance(ts, str) else None
        except (msgspec.ValidationError, ValueError):
            return None
        ticker = Ticker(
            product_id=product,
            event_type="update",
            index=0,
            price=fields.price,
            volume24h=fields.volume24h,
            percent_change24h=fields.percent_change24h,
            high24h=fields.high24h,
            low24h=fields.low24h,
        )
    else:
        price = state.last_price(product)
        if price is None:
            return None
        ts_ms = state.last_close_ms(product)
        ticker = Ticker(product_id=product, event_type="update", index=0, price=price)
    return Tick(
        ticker=ticker,
        timestamp=iso_ms(ts_ms) if ts_ms is not None else None,
        ts_ms=ts_ms,
        received_ms=ts_ms or 0,
        sequence_num=None,
        connection=0,
        stale_after_reconnect=False,
    )


DESCRIPTION = """\
Waits server-side until market conditions are met, then returns; or returns after \
`timeout` seconds (1-55, default 55) with the last ticker of every product.

Use this instead of sleeping and polling: call it with the levels that matter to \
your plan (a breakout level, a stop, a dip to buy) and react when it returns.

subscriptions: 1-10 products (Coinbase ids such as "BTC-USD"), each with 1-5 conditions \
{field, operator, value} combined by logic "any" (default, first condition met) or "all" \
(all on the same tick).
fields: price, volume24h, percentChange24h, high24h, low24h.
operators: gt, gte, lt, lte, crossAbove, crossBelow (a cross needs a previous tick on \
the other side of the value; use gt/lt for "already beyond").

Returns {status: "triggered", productId, triggeredConditions[{field, operator, threshold, \
actualValue}], ticker, timestamp} or {status: "timeout", lastTickers, duration, timestamp, \
warning}. On a timeout, decide whether to wait again; nothing is lost between calls. A \
non-null warning means the market was not watched for the whole wait (connection down or \
dropped): do not read that timeout as "nothing happened"."""

TOOL: Tool[WaitRequest, ToolContext] = Tool(
    name="wait_for_market_event",
    title="Wait for Market Event",
    description=DESCRIPTION,
    request=WaitRequest,
    run=wait_for_market_event,
    budget=lambda req: req.timeout + 10.0,  # + the product check
)
