"""Over MCP, the trading tools act for the agent [mcp] agent names, in its own account."""

from __future__ import annotations

import dataclasses
import time
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from mcp import Client

from daemon.agents.pipeline import open_agents
from daemon.app import open_market, shared_pool
from daemon.config import Config, McpSection
from daemon.service import Service
from daemon.state import StateCache
from daemon.tools import registry
from daemon.tools.calls import AgentCall, AgentView
from daemon.tools.context import ToolContext
from daemon.tools.mcp_server import bound_port, build_server, call_context, serve_http
from tests.agents.test_pipeline import PacedFeed, audit, candle, workspace

pytestmark = pytest.mark.anyio
SIGNAL = {
    "symbol": "BTC-USD", "confidence": 72, "entry_price": 100.0, "stop_loss": 95.0,
    "tp1": 110.0, "technical_score": 30, "sentiment_score": 20, "liquidity_score": 15,
    "correlation_score": 7, "analysis": "oversold bounce",
}  # fmt: skip


def config(root: Path, agents: Path, agent: str) -> Config:
    return msgspec.convert(
        {
            "daemon": {"state_dir": str(root / "state")},
            "hooks": {"agents_dir": str(agents), "reload_seconds": 60},
            "mcp": {"enabled": True, "port": 0, "agent": agent},
        },
        Config,
    )


async def _call(url: str, *calls: tuple[str, dict[str, Any]]) -> list[dict[str, Any]]:
    async with Client(url) as client:
        return [(await client.call_tool(n, a)).structured_content or {} for n, a in calls]


async def test_signals_over_mcp_trade_in_the_named_agents_account(tmp_path: Path) -> None:
    """The same signal twice (even from another connection) is one order; a different
    one is a second; get_orders and get_positions read that agent's account; the risk
    rows name it, each call under its own trace id."""
    runner = "[wake.runner]\nsignal_notional = 50.0\nsignal_expiry_seconds = 600\n"
    agents = workspace(tmp_path, {}, runner)
    cfg = config(tmp_path, agents, "alpha")
    pool = shared_pool(cfg)
    assert pool is not None
    feed = PacedFeed([candle(i) for i in range(3)], hold=True)
    svc = Service(cfg, lambda _: [feed], components=[partial(open_market, pool), open_agents])
    async with anyio.create_task_group() as tg:
        tg.start_soon(svc.run)
        with anyio.fail_after(20):
            while "mcp" not in svc.status_providers or "hooks" not in svc.status_providers:  # noqa: ASYNC110 - the service offers no event for it
                await anyio.sleep(0.02)
            url = f"http://127.0.0.1:{svc.status_providers['mcp']()['port']}/mcp"
            other = {**SIGNAL, "entry_price": 99.0}
            first, again, second, orders, positions = await _call(
                url,
                ("submit_trading_signal", SIGNAL),
                ("submit_trading_signal", SIGNAL),
                ("submit_trading_signal", other),
                ("get_orders", {}),
                ("get_positions", {}),
            )
            (later,) = await _call(url, ("submit_trading_signal", SIGNAL))  # a reconnected host
        feed.release.set()
    assert first["traded"] and not first["duplicate"] and first["approved"]
    assert again["duplicate"] and again["order_id"] == first["order_id"]
    assert second["traded"] and second["order_id"] != first["order_id"]
    assert later["duplicate"] and later["order_id"] == first["order_id"]
    assert orders["account"] == "alpha" and positions["account"] == "alpha"
    entries = {o["clientOrderId"] for o in orders["orders"] if o["role"] == "entry"}
    assert entries == {first["order_id"], second["order_id"]}
    # each signal's limit entry is good for the agent's signal_expiry_seconds
    assert {o["expiresMs"] - o["createdMs"] for o in orders["orders"] if o["role"] == "entry"} == {
        600_000
    }
    risk = [r for r in audit(tmp_path) if r["type"] == "risk"]
    assert [r["agentId"] for r in risk] == ["alpha"] * 2  # duplicates are not re-checked
    assert [r["intent"]["volume"] for r in risk] == [0.5, 50.0 / 99.0]
    assert risk[0]["traceId"].startswith("mcp-") and risk[0]["traceId"] != risk[1]["traceId"]


async def test_without_a_running_agent_the_trading_tools_say_why() -> None:
    """[mcp] agent naming an agent that does not run, and no agent at all: each
    answer says what to change; the market tools are unaffected."""
    ctx = ToolContext(agent_call=lambda _agent, _run: None)
    for agent, says in [("ghost", "agent 'ghost' ([mcp] agent) is not running"),
                        ("", "[mcp] agent names one")]:  # fmt: skip
        server = build_server(registry(), ctx, agent)
        async with serve_http(server, McpSection(port=0)) as http:
            url = f"http://127.0.0.1:{bound_port(http)}/mcp"
            with anyio.fail_after(20):
                (out,) = await _call(url, ("get_orders", {}))
        assert out["error"] == "unavailable" and says in out["message"], out


def test_a_replays_signals_are_one_per_market_day_not_wall_day() -> None:
    """Over MCP a signal is deduplicated within a "run" of one UTC day: on event time
    the agent's market day (two replayed days are two runs, whatever the wall clock
    says), live today's; without the agent's view, the replay's market time."""
    day_ms = 1_700_000_000_000  # 2023-11-14T22:13:20Z
    views = {"alpha": AgentView(now_ms=day_ms, state=StateCache())}
    ctx = ToolContext(
        agent_view=views.get,
        agent_call=lambda agent, run: AgentCall(agent_id=agent, run_id=run),
        market_now=lambda: day_ms + 86_400_000,
    )
    replayed = call_context(ctx, "alpha")
    assert replayed.agent is not None and replayed.agent.run_id == "mcp-2023-11-14"
    assert replayed.market_ms == day_ms and replayed.acting_for == "alpha"
    views["alpha"] = AgentView(now_ms=day_ms + 86_400_000, state=StateCache())
    assert call_context(ctx, "alpha").agent.run_id == "mcp-2023-11-15"  # type: ignore[union-attr]
    unviewed = dataclasses.replace(ctx, agent_view=None)
    assert call_context(unviewed, "alpha").agent.run_id == "mcp-2023-11-15"  # type: ignore[union-attr]
    live = ToolContext(agent_call=ctx.agent_call)
    today = time.strftime("mcp-%Y-%m-%d", time.gmtime())
    assert call_context(live, "alpha").agent.run_id == today  # type: ignore[union-attr]
    assert call_context(live, "alpha").market_ms is None
