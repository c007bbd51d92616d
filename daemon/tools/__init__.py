"""The agent's tools, defined once, served to MCP hosts and the LLM runner.

* :mod:`daemon.tools.base` -- :class:`Tool`, :class:`Registry`, :class:`ToolError`
* :mod:`daemon.tools.context` -- the shared resources tools run against
* :mod:`daemon.tools.market_event` -- ``wait_for_market_event`` (seed 000)
* :mod:`daemon.tools.snapshot` -- ``fetch_technical_snapshot`` (seed 002)
* :mod:`daemon.tools.sentiment` -- ``fetch_sentiment_data`` (seed 002; news, score)
* :mod:`daemon.tools.discovery` -- ``discover_event`` (seed 003; DFlow prediction markets)
* :mod:`daemon.tools.patterns` -- ``query_similar_patterns`` (seed 004's state, in-process RAG)
* :mod:`daemon.tools.trading` -- ``submit_trading_signal``, ``get_positions``, ``get_orders``
* :mod:`daemon.tools.mcp_server` -- the tools over MCP (stdio, streamable HTTP)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from daemon.tools.base import Registry
    from daemon.tools.context import ToolContext


def registry() -> Registry[ToolContext]:
    """Every tool of this build. Their modules load here, not with the package: the
    RAG and HTTP stacks they bring (numpy among them) cost a daemon that runs no LLM
    agent and serves no MCP nothing."""
    from daemon.tools import discovery, market_event, patterns, sentiment, snapshot, trading
    from daemon.tools.base import Registry

    return Registry(
        [
            market_event.TOOL,
            snapshot.TOOL,
            sentiment.TOOL,
            discovery.TOOL,
            patterns.TOOL,
            trading.SUBMIT,
            trading.POSITIONS,
            trading.ORDERS,
        ]
    )
