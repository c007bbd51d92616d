"""What the tools run against: the shared market connection and the product catalog.

One :class:`ToolContext` per process (the daemon's, or ``marketwake mcp``'s),
built by :func:`open_context`; tools never open connections of their own.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import quote

import anyio
import structlog

from daemon.config import Config, DflowSection, SentimentSection
from daemon.errors import FeedError
from daemon.events import iso_ms
from daemon.rag.config import RagConfig
from daemon.state import StateCache
from daemon.tools.base import ToolError
from daemon.tools.calls import AgentCall, AgentView
from daemon.trading.desk import TradeDesk
from feeds.http import MAX_REST_BYTES, read_capped

if TYPE_CHECKING:
    import aiohttp

    from daemon.rag.service import RagService
    from feeds.coinbase_ws.pool import CoinbaseWsPool

log = structlog.get_logger("tools")

KNOWN_TTL_SECONDS = 24 * 3600.0
UNKNOWN_TTL_SECONDS = 600.0
NO_ANSWER_TTL_SECONDS = 60.0


def product_status(status: int) -> bool | None:
    """Coinbase's ``GET /market/products/{id}`` status: listed, unlisted, or no answer."""
    if status == 200:
        return True
    if status in (400, 404):
        return False
    return None


@dataclass
class ProductCatalog:
    """Which product ids Coinbase lists, asked once per id and cached.

    An id the exchange does not know must be a clear error, not a 55-second wait
    for ticks that never come. When the REST API cannot be reached the id is let
    through (the wait then times out as usual): a check must never block a wait.
    """

    base_url: str
    session: aiohttp.ClientSession | None = None
    timeout_seconds: float = 3.0
    clock: Callable[[], float] = time.monotonic
    _cache: dict[str, tuple[bool | None, float]] = field(default_factory=dict)

    def remember(self, product: str, listed: bool | None) -> None:
        """Record an answer; "no answer" is kept briefly, so an unreachable API
        costs one timeout a minute, not one per wait."""
        ttl = {True: KNOWN_TTL_SECONDS, False: UNKNOWN_TTL_SECONDS, None: NO_ANSWER_TTL_SECONDS}
        self._cache[product] = (listed, self.clock() + ttl[listed])

    async def unknown(self, products: list[str]) -> list[str]:
        """The ids of ``products`` Coinbase says it does not list (asked concurrently)."""
        now = self.clock()
        ask = [p for p in products if (c := self._cache.get(p)) is None or c[1] <= now]
        if ask:
            async with anyio.create_task_group() as tg:
                for product in ask:
                    tg.start_soon(self._check, product)
        return [p for p in products if self._cache.get(p, (None, 0.0))[0] is False]

    async def get(self, path: str, params: dict[str, str]) -> tuple[int, bytes]:
        """``GET {base_url}{path}`` on the shared session: (status, body).

        Raises ``LookupError`` when no session exists; network errors propagate."""
        if self.session is None:
            raise LookupError("no REST session")
        async with self.session.get(self.base_url.rstrip("/") + path, params=params) as resp:
            return resp.status, await read_capped(resp, MAX_REST_BYTES, f"GET {path}")

    async def _check(self, product: str) -> None:
        self.remember(product, await self._ask(product))

    async def _ask(self, product: str) -> bool | None:
        if self.session is None:
            return None
        import aiohttp  # loaded already: the session is one of its

        try:
            with anyio.fail_after(self.timeout_seconds):
                status, _ = await self.get(f"/market/products/{quote(product, safe='-')}", {})
                return product_status(status)
        except (aiohttp.ClientError, TimeoutError, FeedError) as exc:
            log.info("product check skipped", product=product, error=f"{type(exc).__name__}")
            return None


class SharedRag:
    """The pattern store's service, opened on first use and closed with the daemon.

    Every copy of a context (one per LLM run or MCP session) holds the same
    instance, so the store is opened once, not once per run."""

    def __init__(self) -> None:
        self._lock = anyio.Lock()
        self._service: RagService | None = None

    async def get(self, cfg: RagConfig) -> RagService:
        """The service, opening the store off the event loop the first time."""
        from daemon.rag.service import RagService
        from daemon.rag.store import open_store

        async with self._lock:
            if self._service is None:
                store = await anyio.to_thread.run_sync(open_store, cfg.store)
                self._service = RagService(cfg, store)
            return self._service

    def close(self) -> None:
        """Release the store (if it was opened)."""
        if self._service is not None:
            self._service.close()
            self._service = None


@dataclass
class ToolContext:
    """The shared resources tools use; ``None`` where this process has none."""

    pool: CoinbaseWsPool | None = None
    catalog: ProductCatalog | None = None
    # The daemon's state cache (candles and indicators of every series it follows).
    state: StateCache | None = None
    # The daemon's trade desk (risk engines and the paper broker), once the agents run.
    desk: TradeDesk | None = None
    agent: AgentCall | None = None
    # The daemon's running agents: (agent id, run id) -> that agent's AgentCall, or
    # None when it is not running. Set once the agents run.
    agent_call: Callable[[str, str], AgentCall | None] | None = None
    # Over MCP: the agent the trading tools were configured to act for ([mcp] agent).
    acting_for: str = ""
    # fetch_sentiment_data's sources ([tools.sentiment]) and the session to ask them on.
    sentiment: SentimentSection = field(default_factory=SentimentSection)
    # discover_event's DFlow API ([tools.dflow]).
    dflow: DflowSection = field(default_factory=DflowSection)
    # query_similar_patterns: the [rag] settings, and the service opened on first use.
    rag: RagConfig = field(default_factory=RagConfig)
    rag_service: SharedRag = field(default_factory=SharedRag)
    http: aiohttp.ClientSession | None = None
    # On event time (a replay or backtest run), the market time of the call in epoch
    # ms: tools answer as of then, from the calling agent's own state, and never from
    # the live present (docs/tools.md, "On event time"). None: live.
    market_ms: int | None = None
    # On event time, once the agents run: an agent's view for its runs' tools.
    agent_view: Callable[[str], AgentView | None] | None = None
    # On event time: the daemon's market time, for callers that are not an agent's
    # run (MCP hosts). None live.
    market_now: Callable[[], int | None] | None = None

    def close(self) -> None:
        """Release what a tool opened lazily (the pattern store)."""
        self.rag_service.close()

    def for_agent(self, call: AgentCall) -> ToolContext:
        """This context for one of ``call.agent_id``'s runs: on event time, at the
        agent's clock and over its own state."""
        view = self.agent_view(call.agent_id) if self.agent_view is not None else None
        if view is None:
            return dataclasses.replace(self.as_of_now(), agent=call)
        return dataclasses.replace(self, agent=call, state=view.state, market_ms=view.now_ms)

    def as_of_now(self) -> ToolContext:
        """This context for a call that is no agent's run: on event time, at the
        daemon's market time (its state's newest candle or tick)."""
        if self.market_now is None:
            return self
        return dataclasses.replace(self, market_ms=self.market_now() or 0)

    def present_only(self, tool: str, source: str, instead: str) -> ToolError | None:
        """On event time, the answer of a tool that can read only the present
        (``source``): what it would return was written after the run's time, so it
        is refused rather than leaked into a replay. None when live."""
        if self.market_ms is None:
            return None
        return ToolError(
            error="unavailable",
            message=(
                f"{tool} reads {source} as of today; this is a replay at "
                f"{iso_ms(self.market_ms)}, so its answer would come from the future"
            ),
            suggestion=instead,
        )


@asynccontextmanager
async def open_context(
    cfg: Config, *, pool: CoinbaseWsPool | None = None, state: StateCache | None = None
) -> AsyncIterator[ToolContext]:
    """A context for ``cfg``: a Coinbase pool (running) and the product catalog.

    Pass the daemon's ``pool`` to share its connection; else one is started here
    that connects only once a tool subscribes a product. The HTTP and WebSocket
    clients are imported here, not with the module: every tool's module imports
    this one (a backtest too, through the snapshot tool), and most never open a
    context."""
    import aiohttp

    from feeds.coinbase_ws.pool import CoinbaseWsPool

    timeout = aiohttp.ClientTimeout(total=cfg.feeds.candles.request_timeout_seconds)
    headers = {"user-agent": "marketwake"}
    async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:
        catalog = ProductCatalog(cfg.feeds.candles.base_url, session)

        def context(pool: CoinbaseWsPool) -> ToolContext:
            tools = cfg.tools
            return ToolContext(
                pool,
                catalog,
                state,
                sentiment=tools.sentiment,
                dflow=tools.dflow,
                rag=cfg.rag,
                http=session,
                market_now=state.newest_ms if state is not None and cfg.event_time else None,
            )

        if pool is not None:
            ctx = context(pool)
            try:
                yield ctx
            finally:
                ctx.close()
            return
        own = CoinbaseWsPool(cfg.feeds.coinbase_ws, lazy=True)
        async with anyio.create_task_group() as tg:
            tg.start_soon(own.run)
            ctx = context(own)
            try:
                yield ctx
            finally:
                ctx.close()
                tg.cancel_scope.cancel()
