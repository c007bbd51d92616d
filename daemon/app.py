"""Wiring: which feeds a config asks for, and how one daemon run is started.

Nothing here has logic of its own; it builds components and hands them to
:class:`daemon.service.Service`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import anyio

from daemon.agents.pipeline import open_agents
from daemon.config import Config
from daemon.service import Component, Consumer, Service, Status
from feeds.base import Feed
from feeds.candles.poller import CandlesFeed
from feeds.coinbase_ws.feed import CoinbaseWsFeed
from feeds.replay import ReplayFeed


def build_feeds(config: Config) -> list[Feed]:
    """One feed object per enabled ``[feeds.*]`` section."""
    feeds: list[Feed] = []
    section = config.feeds
    if section.coinbase_ws.enabled:
        feeds.append(CoinbaseWsFeed(section.coinbase_ws))
    if section.candles.enabled:
        feeds.append(CandlesFeed(section.candles, Path(config.daemon.state_dir)))
    if section.replay.enabled:
        feeds.append(ReplayFeed(section.replay))
    return feeds


def run_daemon(
    config: Config,
    *,
    config_path: Path | None = None,
    record_path: Path | None = None,
    consumers: Sequence[tuple[str, Consumer]] = (),
    from_start: bool = False,
) -> Status:
    """Run one daemon until a signal or until its finite feeds end."""
    components: list[Component] = [open_agents] if config.hooks.enabled else []
    service = Service(
        config,
        build_feeds,
        config_path=config_path,
        record_path=record_path,
        consumers=consumers,
        components=components,
        from_start=from_start,
    )
    return anyio.run(service.run)
