"""The shipped scanner agent (agents/scanner), enabled against loopback fakes: a mover
wakes it, the model gathers both bundles in one turn and submits; 3 tool calls."""

from __future__ import annotations

import json
import shutil
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import msgspec
from aiohttp import web

from daemon.agents.pipeline import open_agents
from daemon.app import open_market, shared_pool
from daemon.config import Config
from daemon.service import Service
from feeds.movers.protocol import MoverTracker, Quote
from tests.agents.test_pipeline import PacedFeed, audit
from tests.llm.fakes import anthropic_turn, fake_anthropic
from tests.loopback import serve_app
from tests.tools.test_sentiment import FNG, RSS
from tests.tools.test_snapshot import FakeRest

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_795_000_000_000


def scanner(root: Path, url: str) -> Path:
    """agents/scanner as shipped, switched on and pointed at the fake model."""
    agents = root / "agents"
    shutil.copytree(ROOT / "agents" / "scanner", agents / "scanner")
    toml = agents / "scanner" / "agent.toml"
    text = toml.read_text()
    assert "enabled = false" in text and 'api_key = "${ANTHROPIC_API_KEY}"' in text
    text = text.replace("enabled = false", "enabled = true").replace(
        'api_key = "${ANTHROPIC_API_KEY}"', f'api_key = "sk-test"\nbase_url = "{url}"'
    )
    toml.write_text(text)
    return agents


def mover(change: float) -> Any:
    quote = Quote(product_id="SOL-USD", price=120.0, change_pct=change, volume_24h=5e5)
    (event,) = MoverTracker(5.0).update([quote], T0)
    return event


async def test_a_mover_runs_the_scanner_in_three_tool_calls(tmp_path: Path) -> None:
    signal = {
        "symbol": "SOL-USD", "confidence": 68, "entry_price": 119.0, "stop_loss": 113.0,
        "tp1": 131.0, "technical_score": 28, "sentiment_score": 18, "liquidity_score": 15,
        "correlation_score": 7, "analysis": "breakout with volume; ETF inflow headlines",
    }  # fmt: skip
    script = [
        anthropic_turn(
            calls=[
                ("t1", "fetch_technical_snapshot", {"symbol": "SOL-USD"}),
                ("t2", "fetch_sentiment_data", {"symbol": "SOL-USD", "context": "up 12%"}),
            ],
            usage=(1800, 90),
        ),
        anthropic_turn(calls=[("t3", "submit_trading_signal", signal)], usage=(5200, 160)),
        anthropic_turn("Signal submitted: long SOL-USD, confidence 68.", usage=(5600, 20)),
    ]
    market = web.Application()
    market.router.add_get("/market/products/{product}/candles", FakeRest(set()).candles)
    market.router.add_get("/rss", _rss)
    market.router.add_get("/fng", _fng)
    async with fake_anthropic(script) as (fake, url), serve_app(market) as rest:
        agents = scanner(tmp_path, url)
        cfg = msgspec.convert(
            {
                # The movers feed is live (it is replaced by a paced one here).
                "daemon": {"state_dir": str(tmp_path / "state"), "clock": "wall"},
                "hooks": {"agents_dir": str(agents), "reload_seconds": 0.05},
                "feeds": {"candles": {"base_url": rest}},
                "tools": {"sentiment": {"rss_feeds": [f"{rest}/rss"], "fear_greed_url": f"{rest}/fng"}},
            },
            Config,
        )  # fmt: skip
        pool = shared_pool(cfg)
        assert pool is not None
        feed = PacedFeed([mover(12.0)], hold=True)  # live: up until the run is done
        svc = Service(cfg, lambda _: [feed], components=[partial(open_market, pool), open_agents])

        async def release_once_run() -> None:
            for _ in range(3000):  # polled: the run record comes from the daemon's tasks
                if any(r["type"] == "run" and r["status"] != "started" for r in audit(tmp_path)):
                    break
                await anyio.sleep(0.02)
            feed.release.set()

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(release_once_run)
                await svc.run()

    rows = audit(tmp_path)
    (hook,) = [r for r in rows if r["type"] == "hook"]
    assert hook["decision"] == "WAKE" and "SOL-USD moved +12.0% in 24h" in hook["reason"]
    (run,) = [r for r in rows if r["type"] == "run" and r["status"] != "started"]
    assert run["status"] == "finished", (run.get("error"), run.get("summary"))
    calls = run["llm"]["toolCalls"]
    assert [c["name"] for c in calls] == [
        "fetch_technical_snapshot",
        "fetch_sentiment_data",
        "submit_trading_signal",
    ]
    assert all(c["ok"] for c in calls)
    assert run["llm"]["cost"] == round((12600 * 3.0 + 270 * 15.0) / 1e6, 6)
    # The system prompt is the shipped AGENT.md; both bundles answered in one turn.
    first = fake.requests[0]
    assert first["system"][0]["text"].startswith(
        "You are an expert cryptocurrency trading analysis"
    )
    results = {
        block["tool_use_id"]: json.loads(block["content"])
        for block in fake.requests[1]["messages"][-1]["content"]
        if block["type"] == "tool_result"
    }
    assert results["t1"]["success_count"] == 4
    sentiment = results["t2"]
    assert sentiment["success"] and sentiment["fear_greed"]["value"] == 72
    assert sentiment["sentiment_query"] == "Solana SOL crypto price news catalysts up 12%"
    assert len(sentiment["web_results"]) == 2  # the two headlines naming Solana
    # The signal went through the agent's risk engine (priced by the mover) to an order.
    (risk,) = [r for r in rows if r["type"] == "risk"]
    assert risk["approved"], risk["reasons"]
    (order,) = [r for r in rows if r["type"] == "order"]
    assert order["symbol"] == "SOL-USD" and order["status"] == "OPEN"
    assert risk["traceId"] == hook["traceId"]


async def _rss(_: web.Request) -> web.Response:
    body = RSS.replace(b"Bitcoin", b"Solana")
    return web.Response(body=body, content_type="application/rss+xml")


async def _fng(_: web.Request) -> web.Response:
    return web.json_response(FNG)
