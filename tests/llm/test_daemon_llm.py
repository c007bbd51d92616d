"""A WAKE in the real pipeline runs the LLM with the daemon's tools; the run is audited."""

from __future__ import annotations

import json
import threading
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest

from daemon.agents.pipeline import open_agents
from daemon.app import open_market, shared_pool
from daemon.llm.runner import RegistryToolBox
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

SIGNAL = {
    "symbol": "BTC-USD", "confidence": 72, "entry_price": 100.0, "stop_loss": 95.0,
    "tp1": 110.0, "technical_score": 30, "sentiment_score": 20, "liquidity_score": 15,
    "correlation_score": 7, "analysis": "oversold bounce",
}  # fmt: skip


async def run_daemon(root: Path, agents: Path) -> None:
    """The daemon as `run` wires it (shared market connection and tools, then the
    agents) over two replayed candles."""
    cfg = config(root, agents)
    pool = shared_pool(cfg)
    assert pool is not None
    svc = Service(
        cfg,
        lambda _: [PacedFeed([candle(0), candle(1)])],
        components=[partial(open_market, pool), open_agents],
    )
    with anyio.fail_after(30):
        await svc.run()


async def test_a_wake_runs_the_model_with_the_daemon_tools(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hook wakes the agent; the model calls wait_for_market_event (with arguments
    it must fix: the tool answers a structured error) and concludes; the run record
    carries model, tokens, cost and the tool call, and links the waking event. The
    tools' list is first built (their modules imported) on a thread, not in the loop."""
    threads: list[bool] = []  # per specs() call: on the main (the loop's) thread?
    specs = RegistryToolBox.specs

    def recorded(box: RegistryToolBox) -> Any:
        threads.append(threading.current_thread() is threading.main_thread())
        return specs(box)

    monkeypatch.setattr(RegistryToolBox, "specs", recorded)
    script = [
        openai_turn(calls=[("c1", "wait_for_market_event", {"subscriptions": []})], usage=(500, 30)),
        openai_turn("Nothing to do.", usage=(700, 12)),
    ]  # fmt: skip
    async with fake_openai(script) as (fake, url):
        agents = workspace(tmp_path, {"wake_every.py": WAKE_EVERY}, RUNNER.format(url=url))
        (agents / "alpha" / "AGENT.md").write_text("Watch BTC.")
        await run_daemon(tmp_path, agents)
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
    assert threads[0] is False and len(threads) >= 2, threads


async def test_a_signal_from_the_model_is_risk_checked_and_placed_once(tmp_path: Path) -> None:
    """submit_trading_signal, sent twice in one turn, becomes one limit order in the
    agent's own account through its risk engine, audited with the waking event's
    trace id; get_orders then shows it; `why` follows event -> run -> risk -> order."""
    signal = SIGNAL
    script = [
        openai_turn(calls=[("s1", "submit_trading_signal", signal), ("s2", "submit_trading_signal", signal)]),
        openai_turn(calls=[("o1", "get_orders", {})]),
        openai_turn("Long placed."),
    ]  # fmt: skip
    async with fake_openai(script) as (fake, url):
        toml = RUNNER.format(url=url) + "signal_notional = 50.0\n"
        agents = workspace(tmp_path, {"wake_every.py": WAKE_EVERY}, toml)
        await run_daemon(tmp_path, agents)
    rows = audit(tmp_path)
    (risk,) = [r for r in rows if r["type"] == "risk"]
    wake = next(r for r in rows if r["type"] == "hook" and r["eventId"] == candle(0).event_id)
    assert risk["approved"] and risk["hookId"] == "submit_trading_signal"
    assert risk["traceId"] == wake["traceId"] and risk["intent"]["volume"] == 0.5
    (order,) = [r for r in rows if r["type"] == "order"]
    assert order["status"] == "OPEN" and order["clientOrderId"] == risk["clientOrderId"]
    answers = [
        json.loads(m["content"]) for m in fake.requests[1]["messages"] if m["role"] == "tool"
    ]
    assert [a["duplicate"] for a in answers] == [False, True]
    assert answers[0]["order_id"] == answers[1]["order_id"] == order["clientOrderId"]
    (orders,) = [
        json.loads(m["content"])
        for m in fake.requests[2]["messages"]
        if m.get("tool_call_id") == "o1"
    ]
    assert [o["clientOrderId"] for o in orders["orders"]] == [order["clientOrderId"]]
    from daemon.audit.why import collect, explain

    (story,) = explain(
        collect(tmp_path / "state" / "audit", candle(0).event_id), candle(0).event_id
    ).agents
    assert order["clientOrderId"] in str(story), story


async def test_a_rerun_of_a_run_a_stop_cut_does_not_trade_twice(tmp_path: Path) -> None:
    """``rerun_interrupted_within_seconds``: the model placed a signal, then the stop
    cut its run (a model turn that never came back, the drain past its timeout). At
    the next start its wakes run again; the model, knowing nothing of it, sends the
    same symbol's signal again: it gets the first order back (``duplicate``), and
    the account holds one order."""
    import msgspec

    from daemon.config import Config

    signal = SIGNAL
    script = [
        openai_turn(calls=[("s1", "submit_trading_signal", signal)]),
        60,  # the next turn never comes: the stop cuts the run (its request goes)
        openai_turn(calls=[("s2", "submit_trading_signal", signal)]),
        openai_turn("Long placed."),
    ]
    toml = (
        "[wake]\nmax_runs_per_hour = 5\ndebounce_seconds = 0\n"
        "rerun_interrupted_within_seconds = 3600\n"
        '[wake.runner]\nkind = "llm"\nprovider = "openai"\nmodel = "fake-gpt"\n'
        'base_url = "{url}"\n'
    )
    agents = workspace(tmp_path, {"wake_every.py": WAKE_EVERY})
    async with fake_openai(script) as (fake, url):
        (agents / "alpha" / "agent.toml").write_text(toml.format(url=url))
        cfg = msgspec.convert(
            {
                "daemon": {"state_dir": str(tmp_path / "state"), "stop_timeout_seconds": 4},
                "hooks": {"agents_dir": str(agents), "reload_seconds": 0.05},
            },
            Config,
        )
        for _ in range(2):
            pool = shared_pool(cfg)
            assert pool is not None
            svc = Service(
                cfg,
                lambda _: [PacedFeed([candle(0)])],
                components=[partial(open_market, pool), open_agents],
            )
            with anyio.fail_after(30):
                await svc.run()
    rows = audit(tmp_path)
    runs = [r for r in rows if r["type"] == "run" and r["status"] != "started"]
    assert [r["status"] for r in runs] == ["failed", "finished"], runs
    assert runs[0]["error"].startswith("cancelled: the scheduler stopped; its wakes run again as")
    assert runs[0]["error"].endswith(runs[1]["runId"])
    (order,) = {r["clientOrderId"] for r in rows if r["type"] == "order"}
    answers = [
        json.loads(m["content"])
        for req in fake.requests
        for m in req["messages"]
        if m["role"] == "tool" and m.get("tool_call_id") in ("s1", "s2")
    ]
    first, again = answers[0], answers[-1]
    assert (first["duplicate"], again["duplicate"]) == (False, True)
    assert first["order_id"] == again["order_id"] == order
