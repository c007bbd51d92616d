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

from daemon.tools.base import Problem, Tool, ToolError
from daemon.tools.context import ToolContext
from daemon.tools.market_watch import MarketWatch, WaitRequest, check_products, unwatched
from daemon.tools.waitboard import WaitBoard, Waiter


async def wait_for_market_event(ctx: ToolContext, req: WaitRequest) -> msgspec.Struct:
    """Wait until a subscription's conditions hold or ``timeout`` seconds pass."""
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
