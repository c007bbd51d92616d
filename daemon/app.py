"""Wiring: which feeds a config asks for, and how one daemon run is started.

Nothing here has logic of its own; it builds components and hands them to
:class:`daemon.service.Service`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import anyio
import structlog

from daemon import preflight
from daemon.agents.pipeline import open_agents
from daemon.audit.records import SignalRecord
from daemon.config import Config
from daemon.errors import ReplayError
from daemon.service import Component, Consumer, Service
from daemon.status import Status
from feeds.base import Feed
from feeds.replay import ReplayFeed

if TYPE_CHECKING:
    from feeds.coinbase_ws.pool import CoinbaseWsPool

log = structlog.get_logger("daemon")


def build_feeds(
    config: Config,
    pool: CoinbaseWsPool | None = None,
    audit: Callable[[SignalRecord], None] | None = None,
) -> list[Feed]:
    """One feed object per enabled ``[feeds.*]`` section (the ticker feed rides the
    daemon's shared Coinbase ``pool`` when there is one; the copy-trade webhook
    writes its answers to ``audit``). A live feed's module is imported only when
    its section is enabled: a replay (a backtest) never loads the network clients."""
    feeds: list[Feed] = []
    section = config.feeds
    if section.coinbase_ws.enabled:
        from feeds.coinbase_ws.feed import CoinbaseWsFeed

        feeds.append(CoinbaseWsFeed(section.coinbase_ws, pool=pool))
    if section.candles.enabled:
        from feeds.candles.poller import CandlesFeed

        feeds.append(CandlesFeed(section.candles, Path(config.daemon.state_dir)))
    if section.replay.enabled:
        feeds.append(ReplayFeed(section.replay))
    if section.movers.enabled:
        from feeds.movers import MoversFeed

        feeds.append(MoversFeed(section.movers))
    if section.tradingview.enabled:
        from feeds.copytrade import TradingViewFeed

        feeds.append(
            TradingViewFeed(section.tradingview, Path(config.daemon.state_dir), audit=audit)
        )
    if section.copytrade_webhook.enabled:
        from feeds.copytrade import CopytradeWebhookFeed

        feeds.append(
            CopytradeWebhookFeed(
                section.copytrade_webhook, Path(config.daemon.state_dir), audit=audit
            )
        )
    return feeds


def shared_pool(config: Config) -> CoinbaseWsPool | None:
    """The daemon's one Coinbase connection, when the ticker feed, MCP or the agents'
    tools (LLM runs) may need it: not when the agents' runs only log
    (``[hooks] run_agents = false``, a backtest that counts wakes), where no tool
    is ever called.

    It connects only once someone wants a product. Its connection settings are
    those at start: a reload that changes ``[feeds.coinbase_ws] url`` or the
    backoff applies after a restart (products apply at once)."""
    runs = config.hooks.enabled and config.hooks.run_agents
    if not (config.feeds.coinbase_ws.enabled or config.mcp.enabled or runs):
        return None
    from feeds.coinbase_ws.pool import CoinbaseWsPool

    return CoinbaseWsPool(config.feeds.coinbase_ws, lazy=True)


@asynccontextmanager
async def open_market(pool: CoinbaseWsPool, service: Service) -> AsyncIterator[None]:
    """Run the shared pool for the daemon's life, and the MCP server if enabled."""
    from daemon.llm.runner import RegistryToolBox
    from daemon.tools import registry
    from daemon.tools.context import open_context

    cfg = service.config
    async with anyio.create_task_group() as tg:
        tg.start_soon(pool.run)
        try:
            async with open_context(cfg, pool=pool, state=service.state) as ctx:
                service.tools = RegistryToolBox(registry, ctx)  # LLM runs call these
                if cfg.mcp.enabled:
                    # imported here: the MCP stack (pydantic, starlette) costs ~0.6 s at start
                    from daemon.tools.mcp_server import bound_port, build_server, serve_http

                    server = build_server(registry(), ctx, cfg.mcp.agent)
                    async with serve_http(server, cfg.mcp) as http:
                        service.status_providers["mcp"] = lambda: {"port": bound_port(http)}
                        yield
                else:
                    yield
        finally:
            tg.cancel_scope.cancel()


@asynccontextmanager
async def warm_up(service: Service) -> AsyncIterator[None]:
    """A replay that starts later than its data (``from_ms``) primes the state cache
    with the candles before that time (``ReplayFeed.history``), so indicators start
    warm, as in a daemon that had been running; each agent's cache is a copy of it.
    Not when a restart restored the cache. A bad row is left to the replay to report."""
    replay, state = service.config.feeds.replay, service.state
    if replay.enabled and replay.from_ms and not state.statistics()["candles_held"]:
        try:
            history = await anyio.to_thread.run_sync(ReplayFeed(replay).history, state.max_candles)
        except ReplayError as exc:
            log.warning("state not warmed up from the replay's earlier data", error=str(exc))
        else:
            n = sum(state.seed(s, tf, (c.payload() for c in candles)) for s, tf, candles in history)
            log.info(
                "state warmed up from the replay's earlier data", candles=n, series=len(history)
            )
    yield


def run_daemon(
    config: Config,
    *,
    config_path: Path | None = None,
    record_path: Path | None = None,
    consumers: Sequence[tuple[str, Consumer]] = (),
    components: Sequence[Component] = (),
    from_start: bool = False,
    agents: Literal["all", "some"] = "some",
) -> Status:
    """Run one daemon until a signal or until its finite feeds end. ``consumers``
    read the bus; ``components`` run beside the daemon's own, entered first and
    left last (after the agents drained).

    What ``config check`` would reject stops the start here (ConfigError, exit 2),
    but a broken agent only when no agent would start (``agents="some"``; "all": any
    broken agent stops it). The others start; the broken files are logged and in
    ``status``, as in a hot reload."""
    preflight.check(config, record_path).raise_for_problems(agents)
    own: list[Component] = [warm_up, open_agents] if config.hooks.enabled else [warm_up]
    pool = shared_pool(config)
    if pool is not None:
        own.insert(0, partial(open_market, pool))

    def audit(record: SignalRecord) -> None:
        if service.audit is not None:  # the agents' pipeline runs (it owns the audit log)
            service.audit(record)

    service = Service(
        config,
        partial(build_feeds, pool=pool, audit=audit),
        config_path=config_path,
        record_path=record_path,
        consumers=consumers,
        components=[*components, *own],
        from_start=from_start,
    )
    return anyio.run(service.run)
