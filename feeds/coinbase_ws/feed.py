"""The ``coinbase_ws`` feed: configured products' tickers as ``market.price.tick``.

The feed owns a :class:`CoinbaseWsPool` and is one subscriber of it; other
components (the ``wait_for_market_event`` tool) reach the same connection
through :attr:`CoinbaseWsFeed.pool`.

Startup: ``task_status.started()`` fires once the first connection is
subscribed, or after ``startup_timeout`` seconds if Coinbase cannot be reached,
so the daemon comes up offline and the pool keeps retrying in the background.
"""

from __future__ import annotations

from typing import Any, Final

import anyio
import msgspec
import structlog
from anyio.abc import TaskStatus

from daemon.events import MARKET_PRICE_TICK, FeedEvent, iso_ms
from feeds.base import FeedHealth, Publish
from feeds.coinbase_ws.pool import CoinbaseWsPool, Tick
from feeds.config import CoinbaseWsSection

log = structlog.get_logger("feeds.coinbase_ws")

SOURCE: Final = "coinbase"
STARTUP_TIMEOUT_SECONDS: Final = 10.0


def tick_event(tick: Tick) -> FeedEvent:
    """The FeedEvent of one tick.

    ``eventId`` is ``coinbase:tick:<product>:<exchange timestamp>:<sequence_num>:<index>``:
    ``sequence_num`` alone restarts with every connection, so the exchange's
    nanosecond timestamp keeps ids unique across reconnects while staying a
    pure function of the message (a recording replays with the same ids).
    """
    product = tick.product_id
    stamp = tick.timestamp or str(tick.received_ms)
    seq = "-" if tick.sequence_num is None else str(tick.sequence_num)
    payload: dict[str, Any] = tick.ticker.payload_fields()
    payload["staleAfterReconnect"] = tick.stale_after_reconnect
    return FeedEvent(
        event_id=f"{SOURCE}:tick:{product}:{stamp}:{seq}:{tick.ticker.index}",
        ts=iso_ms(tick.ts_ms if tick.ts_ms is not None else tick.received_ms),
        received_ts=iso_ms(tick.received_ms),
        source=SOURCE,
        topic=MARKET_PRICE_TICK,
        symbol=product,
        partition_key=f"{SOURCE}:{product}:tick",
        payload=payload,
    )


class CoinbaseWsFeed:
    """Publishes a ``market.price.tick`` for every ticker of the configured products."""

    name = "coinbase_ws"

    def __init__(
        self,
        settings: CoinbaseWsSection,
        *,
        pool: CoinbaseWsPool | None = None,
        startup_timeout: float = STARTUP_TIMEOUT_SECONDS,
    ) -> None:
        self.products = sorted(set(settings.products))  # each checked by the section
        # A pool passed in is shared (the daemon's, also used by the tools) and run
        # by its owner; otherwise the feed owns and runs its own.
        self.owns_pool = pool is None
        self.pool = pool if pool is not None else CoinbaseWsPool(settings)
        self._startup_timeout = startup_timeout

    def statistics(self) -> dict[str, Any]:
        """The pool's counters as plain data (for status output and logs)."""
        stats: dict[str, Any] = msgspec.to_builtins(self.pool.statistics())
        return stats

    async def run(
        self,
        publish: Publish,
        health: FeedHealth,
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Run the pool and forward ticks until cancelled."""
        async with anyio.create_task_group() as tg:
            if self.owns_pool:
                tg.start_soon(self.pool.run, health)
            else:
                self.pool.watch(health)
            if not self.products:
                log.warning("coinbase_ws.no_products")
                task_status.started()
                return
            with self.pool.subscribe(self.products) as sub:
                await self._wait_started()
                task_status.started()
                async for tick in sub:
                    await publish(tick_event(tick))

    async def _wait_started(self) -> None:
        with anyio.move_on_after(self._startup_timeout) as scope:
            await self.pool.wait_ready()
        if scope.cancelled_caught:
            log.warning(
                "coinbase_ws.started_offline",
                waited_s=self._startup_timeout,
                hint="Coinbase unreachable; retrying in the background",
            )
