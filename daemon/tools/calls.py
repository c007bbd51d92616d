"""Who calls a tool, and the market an agent's run sees: what the agents'
manager hands the tools, kept apart from the tools' context so that loading the
agents does not load the tools' HTTP and WebSocket clients."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from daemon.state import StateCache


@dataclass(frozen=True)
class AgentCall:
    """Who is calling: set for a tool call made by an agent's LLM run (the trading
    tools need it); MCP hosts call without one."""

    agent_id: str
    run_id: str  # whose signals these are (see submit_trading_signal's keys)
    trace_id: str | None = None
    event_id: str | None = None
    # How a signal becomes an order ([wake.runner] of the agent).
    signal_notional: float = 100.0
    min_confidence: float = 60.0
    signal_expiry_seconds: float = 0.0  # 0: the entry works until filled or canceled
    # An LLM run trades a symbol once (a retried call returns the first order); over
    # MCP (no runs, no sessions) each distinct signal is traded once per "run" (day).
    one_signal_per_symbol: bool = True


@dataclass(frozen=True)
class AgentView:
    """An agent's market as its run sees it on event time: the agent's clock (the
    run's due time; a run takes no event time) and its own state cache, which holds
    every event before that time and none after (the daemon-wide cache may be a bus
    queue ahead of the agent)."""

    now_ms: int
    state: StateCache
