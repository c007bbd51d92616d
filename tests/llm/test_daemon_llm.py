"""A WAKE in the real pipeline runs the LLM with the daemon's tools; the run is audited."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import anyio

from daemon.agents.pipeline import open_agents
from daemon.app import open_market, shared_pool
from daemon.service import Service
from daemon.status import read_status
from tests.agents.test_pipeline import WAKE_EVERY, PacedFeed, audit, candle, config, workspace
from tests.llm.fakes import fake_openai, openai_turn

RUNNER = """
[wake]
max_runs_per_hour = 1
debounce_seconds = 0
[wake.runner]
kind = "llm"
provider = "openai"
model = "fake-gpt"
base_url = "{url}"
price_input_per_mtok = 2.0
price_output_per_mtok = 10.0
"""


async def test_a_wake_runs_the_model_with_the_daemon_tools(tmp_path: Path) -> None:
    """The hook wakes the agent; the model calls wait_for_market_event (with arguments
    it must fix: the tool answers a structured error) and concludes; the run record
    carries model, tokens, cost and the tool call, and links the waking event."""
    script = [
        openai_turn(calls=[("c1", "wait_for_market_event", {"subscriptions": []})], usage=(500, 30)),
        openai_turn("Nothing to do.", usage=(700, 12)),
    ]  # fmt: skip
    async with fake_openai(script) as (fake, url):
        agents = workspace(tmp_path, {"wake_every.py": WAKE_EVERY}, RUNNER.format(url=url))
        (agents / "alpha" / "AGENT.md").write_text("Watch BTC.")
        cfg = config(tmp_path, agents)
        pool = shared_pool(cfg)
        assert pool is not None
        svc = Service(
            cfg,
            lambda _: [PacedFeed([candle(0), candle(1)])],
            components=[partial(open_market, pool), open_agents],
        )
        with anyio.fail_after(30):
            await svc.run()
    (run,) = [r for r in audit(tmp_path) if r["type"] == "run" and r["status"] != "started"]
    assert run["status"] == "finished" and run["runner"] == "llm", run
    llm = run["llm"]
    assert (llm["model"], llm["tokensIn"], llm["tokensOut"]) == ("fake-gpt", 1200, 42)
    assert llm["cost"] == round((1200 * 2.0 + 42 * 10.0) / 1e6, 6)
    (call,) = llm["toolCalls"]
    assert call["name"] == "wait_for_market_event" and not call["ok"]
    assert llm["text"] == "Nothing to do." and "cost 0.0028" in run["summary"]
    assert run["eventIds"] == [candle(0).event_id]
    first = fake.requests[0]
    assert first["messages"][0]["content"] == "Watch BTC."
    assert "wait_for_market_event" in [t["function"]["name"] for t in first["tools"]]
    agent = read_status(tmp_path / "state").hooks.agents["alpha"]  # type: ignore[union-attr]
    assert (agent.runs_today, agent.cost_today) == (1, llm["cost"])
    assert (agent.tokens_in_today, agent.tokens_out_today) == (1200, 42)
