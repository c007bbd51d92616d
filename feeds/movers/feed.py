"""MoversFeed: polls Coinbase's public product list and publishes
``market.movers.detected`` for each product that moves ``min_change_pct`` % in 24 h.

One request per poll (``GET /market/products?product_type=SPOT``). A failed
poll (network, 5xx, a malformed body) is a recorded error and the next poll
tries again; the feed never stops on one.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import aiohttp
import anyio
import structlog
from anyio.abc import TaskStatus

from daemon.errors import FeedError
from daemon.events import Publish, now_ms
from feeds.base import FeedHealth
from feeds.config import MoversSection
from feeds.http import read_capped
from feeds.movers.protocol import MoverTracker, parse_products

log = structlog.get_logger("feeds.movers")
# The whole spot list is a few MB; anything far larger is not an answer to keep.
MAX_BODY_BYTES = 32 * 1024 * 1024


class MoversFeed:
    """The scanner feed (``[feeds.movers]``)."""

    name = "movers"

    def __init__(self, config: MoversSection, clock: Callable[[], int] = now_ms) -> None:
        self.config = config
        self.clock = clock
        self.tracker = MoverTracker(config.min_change_pct, config.min_volume_24h)
        self.polls = 0
        self.published = 0

    def statistics(self) -> dict[str, int]:
        """For status: polls done, movers announced."""
        return {"polls": self.polls, "movers_published": self.published}

    async def run(
        self, publish: Publish, health: FeedHealth, *, task_status: TaskStatus[None]
    ) -> None:
        """Poll until cancelled."""
        cfg = self.config
        timeout = aiohttp.ClientTimeout(total=cfg.request_timeout_seconds)
        async with aiohttp.ClientSession(
            timeout=timeout, headers={"user-agent": "marketwake"}
        ) as s:
            task_status.started()
            while True:
                started = time.monotonic()
                await self._poll(s, publish, health)
                await anyio.sleep(max(0.0, cfg.poll_seconds - (time.monotonic() - started)))

    async def _poll(
        self, session: aiohttp.ClientSession, publish: Publish, health: FeedHealth
    ) -> None:
        url = self.config.base_url.rstrip("/") + "/market/products"
        try:
            async with session.get(url, params={"product_type": "SPOT"}) as resp:
                if resp.status != 200:
                    raise FeedError(f"GET {url}: HTTP {resp.status}")
                body = await read_capped(resp, MAX_BODY_BYTES, f"GET {url}")
            quotes = parse_products(body, frozenset(self.config.quote_currencies))
        except (aiohttp.ClientError, TimeoutError, FeedError) as exc:
            health.error()
            log.warning("movers.poll_failed", error=str(exc))
            return
        health.beat()
        self.polls += 1
        for event in self.tracker.update(quotes, self.clock()):
            await publish(event)
            self.published += 1
