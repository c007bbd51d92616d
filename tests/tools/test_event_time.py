"""The agent's tools on event time: a replayed run's tools answer as of the run's
market time, from the agent's own state, and never from the live present."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import msgspec
import pytest

from daemon.audit.reader import iter_records
from daemon.backtest.report import RUNS_FAILED, Report
from daemon.backtest.run import BacktestOptions, held_candles, render, run_backtest
from daemon.errors import ConfigError
from daemon.events import iso_ms
from daemon.service import Service
from daemon.tools import registry
from daemon.tools.base import ToolError
from daemon.tools.context import ToolContext
from feeds.synthetic import generate_candles
from tests.llm.fakes import FakeModel, fake_openai, openai_turn
from tests.stops import stop_when

START_MS = 1_704_067_200_000  # generate_candles' first open (2024-01-01)
STEP_MS = 300_000
WAKING = 647  # the candle whose close (on the hour) wakes the agent, once
WAKE_ONCE = f"""
def evaluate(event, state):
    c = event["payload"]
    if c["openTimeMs"] == {START_MS + WAKING * STEP_MS}:
        return {{"decision": "WAKE", "reason": "now", "dedupeKey": "w"}}
    return {{"decision": "IGNORE", "reason": "not yet"}}
"""
AGENT = """
[wake]
debounce_seconds = 0
[wake.runner]
kind = "llm"
provider = "openai"
model = "fake-gpt"
base_url = "{url}"
price_input_per_mtok = 3.0
price_output_per_mtok = 15.0
"""
NEVER = {"field": "price", "operator": "gt", "value": 1e12}
ALWAYS = {"field": "price", "operator": "gt", "value": 1}


def backtest_with_model(
    tmp_path: Path, data: Path, script: list[Any]
) -> tuple[FakeModel, BacktestOptions, Report]:
    """``backtest --run-llm`` of an agent woken once (WAKE_ONCE), its model a loopback
    fake playing ``script`` (served from a thread: the backtest blocks this one)."""
    with (
        anyio.from_thread.start_blocking_portal() as portal,
        portal.wrap_async_context_manager(fake_openai(script)) as (fake, url),
    ):
        agent = tmp_path / "agents" / "alpha"
        (agent / "hooks").mkdir(parents=True)
        (agent / "agent.toml").write_text(AGENT.format(url=url))
        (agent / "hooks" / "wake_once.py").write_text(WAKE_ONCE)
        opts = BacktestOptions(agent_dir=agent, data=data, out=tmp_path / "out", run_llm=True)
        return fake, opts, run_backtest(opts)


def test_a_replayed_run_sees_its_own_time_not_today(tmp_path: Path) -> None:
    """backtest --run-llm: the snapshot's 15m and 1h candles are built from the replayed
    5m ones and end at the run's time (none after it), the price is the waking close;
    a wait answers at once on that price (the replay waits for the run: a wait for a
    level the market has not reached would never see it move); the news is refused.
    The report prices the wakes at the run's real cost."""
    waits = [
        {"subscriptions": [{"productId": "BTC-USD", "conditions": [c]}], "timeout": 55}
        for c in (ALWAYS, NEVER)
    ]
    script = [
        openai_turn(
            calls=[
                ("s", "fetch_technical_snapshot", {"symbol": "BTC-USD"}),
                ("w1", "wait_for_market_event", waits[0]),
                ("w2", "wait_for_market_event", waits[1]),
                ("n", "fetch_sentiment_data", {"symbol": "BTC-USD"}),
            ]
        ),
        openai_turn("Seen."),
    ]
    data = tmp_path / "c.csv"
    generate_candles(data, seed=5, n=WAKING + 50, timeframe="5m")
    closes = {
        int(row.split(",")[0]): float(row.split(",")[4])
        for row in data.read_text().splitlines()[1:]
    }
    fake, _, report = backtest_with_model(tmp_path, data, script)
    (run,) = [
        r
        for r in iter_records(tmp_path / "out" / "state" / "audit")
        if r["type"] == "run" and r["status"] != "started"
    ]
    assert run["status"] == "finished", run
    run_ms = START_MS + (WAKING + 1) * STEP_MS  # the waking candle's close
    answers = {
        m["tool_call_id"]: json.loads(m["content"])
        for m in fake.requests[1]["messages"]
        if m["role"] == "tool"
    }
    snap = answers["s"]
    for tf, step in (("15m", 900_000), ("1h", 3_600_000)):
        frame = snap["timeframes"][tf]
        assert (frame["source"], frame["resampled_from"], len(frame["ohlcv"])) == (
            "state", "5m", 50,
        ), tf  # fmt: skip
        assert frame["ohlcv"][-1][0] + step == run_ms  # the newest whole bucket, no later
    waking_close = closes[START_MS + WAKING * STEP_MS]
    assert snap["current_price"] == waking_close
    assert snap["timeframes"]["1h"]["ohlcv"][-1][4] == waking_close
    hit, missed = answers["w1"], answers["w2"]
    assert hit["status"] == "triggered" and hit["timestamp"] == iso_ms(run_ms)
    assert hit["ticker"]["price"] == waking_close
    assert missed["status"] == "timeout" and missed["duration"] == 0.0
    assert "replay" in missed["warning"] and missed["timestamp"] == iso_ms(run_ms)
    assert missed["lastTickers"]["BTC-USD"]["price"] == waking_close
    news = answers["n"]
    assert news["error"] == "unavailable" and iso_ms(run_ms) in news["message"]
    # The report prices the runs at what this one really cost (2 turns of 100 + 20
    # tokens at 3 and 15 per million), not the token estimate.
    spent = run["llm"]["cost"]
    assert spent == (200 * 3.0 + 40 * 15.0) / 1e6
    model = report.cost_model
    assert (model.measured_per_run, model.measured_runs) == (spent, 1)
    assert model.source == "mean of 1 LLM runs in this backtest" and model.actual
    assert "LLM cost 0.00 vs" in render(report) and "estimated" not in render(report)
    assert report.cost == spent and report.baseline.cost == round(report.baseline.runs * spent, 6)


def test_the_state_keeps_enough_for_4h_candles_only_with_llm_runs(tmp_path: Path) -> None:
    """50 whole 4 h candles from 1 m data need 12,000+ of them; without LLM runs no
    tool reads the state, and the default stands."""
    base: dict[str, Any] = {
        "agent_dir": tmp_path,
        "data": tmp_path / "c.csv",
        "out": tmp_path / "o",
    }
    assert held_candles(BacktestOptions(**base, timeframe="1m")) == 500
    assert held_candles(BacktestOptions(**base, timeframe="1m", run_llm=True)) == 51 * 240
    assert held_candles(BacktestOptions(**base, timeframe="1h", run_llm=True)) == 500


async def call(ctx: ToolContext, name: str, args: dict[str, Any]) -> Any:
    return await registry().call(ctx, name, args)


async def test_tools_that_read_only_the_present_refuse_a_replay() -> None:
    """News and prediction markets have no "as of" time: on event time they answer
    unavailable, naming the run's time, and ask nothing of anyone."""
    at = ToolContext(market_ms=START_MS)
    for name, args in (
        ("fetch_sentiment_data", {"symbol": "BTC-USD"}),
        ("discover_event", {"query": "bitcoin"}),
    ):
        out = await call(at, name, args)
        assert isinstance(out, ToolError) and out.error == "unavailable", (name, out)
        assert iso_ms(START_MS) in out.message and out.suggestion
    live = await call(ToolContext(), "fetch_sentiment_data", {"symbol": "BTC-USD"})
    assert not isinstance(live, ToolError)  # live, the same call answers (no sources set)


async def test_over_mcp_a_replaying_daemon_answers_as_of_its_market_time() -> None:
    """An MCP host of a daemon on event time (no agent named) gets answers as of the
    newest thing the daemon's state holds: the replay's price and time, no wait."""
    from mcp import Client

    from daemon.config import McpSection
    from daemon.events import Candle
    from daemon.state import StateCache
    from daemon.tools.mcp_server import bound_port, build_server, serve_http

    state = StateCache()
    for i in range(60):
        start = START_MS + i * STEP_MS
        bar = Candle(open=100.0, high=110.0, low=90.0, close=100.0 + i, volume=1.0,
                     open_time_ms=start, close_time_ms=start + STEP_MS)  # fmt: skip
        state.add_closed("BTC-USD", "5m", bar.payload())
    newest = START_MS + 60 * STEP_MS
    assert state.newest_ms() == newest
    ctx = ToolContext(state=state, market_now=state.newest_ms)
    wait = {"subscriptions": [{"productId": "BTC-USD", "conditions": [NEVER]}], "timeout": 55}
    async with (
        serve_http(build_server(registry(), ctx, ""), McpSection(port=0)) as http,
        Client(f"http://127.0.0.1:{bound_port(http)}/mcp") as client,
    ):
        with anyio.fail_after(20):
            snap = await client.call_tool("fetch_technical_snapshot", {"symbol": "BTC-USD"})
            waited = await client.call_tool("wait_for_market_event", wait)
    out, missed = snap.structured_content or {}, waited.structured_content or {}
    assert out["current_price"] == 159.0 and out["timeframes"]["1h"] is None
    assert any(iso_ms(newest) in w for w in out["warnings"])
    assert missed["status"] == "timeout" and missed["duration"] == 0.0
    assert missed["timestamp"] == iso_ms(newest)


async def test_the_daemons_tools_follow_its_clock() -> None:
    """The daemon's tool context reads its state's market time on event time only."""
    import msgspec

    from daemon.config import Config
    from daemon.state import StateCache
    from daemon.tools.context import open_context
    from feeds.coinbase_ws.pool import CoinbaseWsPool

    for clock, replayed in (("event", True), ("wall", False)):
        cfg = msgspec.convert({"daemon": {"clock": clock}}, Config)
        pool = CoinbaseWsPool(cfg.feeds.coinbase_ws, lazy=True)
        async with open_context(cfg, pool=pool, state=StateCache()) as ctx:
            assert (ctx.market_now is not None) is replayed, clock
            assert (ctx.as_of_now().market_ms is not None) is replayed


def test_a_backtest_hands_the_pattern_tool_its_files_and_store(tmp_path: Path) -> None:
    """--funding, --open-interest and --rag-store reach [rag] of the backtest's daemon
    (as absolute paths); without --run-llm nothing would read them: a usage error."""
    from click.testing import CliRunner

    from daemon.backtest.run import rag_config
    from daemon.cli.main import cli

    for name in ("f.csv", "oi.csv"):
        (tmp_path / name).write_text("x\n")
    (tmp_path / "store").mkdir()
    opts = BacktestOptions(
        agent_dir=tmp_path, data=tmp_path / "c.csv", out=tmp_path / "o", run_llm=True,
        funding_file=tmp_path / "f.csv", open_interest_file=tmp_path / "oi.csv",
        rag_store=tmp_path / "store",
    )  # fmt: skip
    rag = rag_config(opts)
    assert rag.exchange.funding_file == str((tmp_path / "f.csv").resolve())
    assert rag.exchange.open_interest_file == str((tmp_path / "oi.csv").resolve())
    assert rag.store.path == str((tmp_path / "store").resolve())
    plain = rag_config(BacktestOptions(agent_dir=tmp_path, data=tmp_path, out=tmp_path))
    assert (plain.exchange.funding_file, plain.store.path) == ("", "state/rag")
    args = ["backtest", "--agent", str(tmp_path), "--data", str(tmp_path / "f.csv")]
    res = CliRunner().invoke(cli, [*args, "--funding", str(tmp_path / "f.csv")])
    assert res.exit_code == 2 and "--funding is read by the LLM runs' tools" in res.output


def test_failed_llm_runs_are_counted_and_a_missing_key_stops_the_backtest(
    tmp_path: Path,
) -> None:
    """A model that refuses (HTTP 400) fails the run: the report counts it and says so.
    A runner whose key reads an unset variable would fail every run: refused before
    anything runs, naming the variable."""
    data = tmp_path / "c.csv"
    generate_candles(data, seed=5, n=WAKING + 5, timeframe="5m")
    refusal = (400, {"error": {"message": "bad request", "type": "invalid_request_error"}})
    _, opts, report = backtest_with_model(tmp_path, data, [refusal])
    assert (report.runs, report.runs_failed) == (1, 1)
    assert "1 agent run; 1 of the runs failed or timed out (the first: " in render(report)
    assert "runs failed</th><td>1 (the first: " in (opts.out / "report.html").read_text()
    assert "bad request" in report.first_run_error  # what the model said, to act on
    keyed = AGENT.format(url="").replace('base_url = ""', 'api_key = "${MW_TEST_UNSET_KEY}"')
    (opts.agent_dir / "agent.toml").write_text("enabled = false\n" + keyed)
    with pytest.raises(ConfigError, match=r"reads \$\{MW_TEST_UNSET_KEY\}, which is not set"):
        run_backtest(msgspec.structs.replace(opts, out=tmp_path / "out2"))


def test_a_backtest_whose_runs_all_fail_stops_and_says_why(tmp_path: Path) -> None:
    """--run-llm on a model that refuses every request: once the first 3 runs all
    failed, no run starts and the backtest stops (a year of wakes would otherwise fail
    one by one, each after the runner's retries), with a partial report saying so and
    what the model said."""
    refusal = (400, {"error": {"message": "model not found", "type": "invalid_request_error"}})
    data = tmp_path / "c.csv"
    generate_candles(data, seed=5, n=400, timeframe="5m")
    with (
        anyio.from_thread.start_blocking_portal() as portal,
        portal.wrap_async_context_manager(fake_openai([refusal] * 400)) as (fake, url),
    ):
        report = run_backtest(_waking_every_close(tmp_path, data, url))
    assert not report.complete and report.stopped_by.startswith(RUNS_FAILED)
    assert "the first 3 agent runs all failed" in report.stopped_by
    assert "model not found" in report.stopped_by
    assert (report.runs, report.runs_failed, len(fake.requests)) == (3, 3, 3)
    assert "RUNS FAILING: the first 3 agent runs all failed" in render(report)


def test_ctrl_c_during_a_backtest_with_runs_starts_no_more_runs(tmp_path: Path) -> None:
    """A stop on event time (Ctrl-C, SIGTERM) lets the run in flight end and starts no
    other: the events the agent already holds are evaluated, their wakes not run (each
    would be a paid model call the user just asked to stop)."""
    asked: list[int] = []

    def third_run(_: Service, requests: list[Any]) -> bool:
        if len(requests) < 3:
            return False
        asked.append(len(requests))
        return True

    requests, report = _stopped_backtest(tmp_path, third_run)
    assert asked == [3] and report.stopped_by == "signal"
    assert len(requests) == 3  # the third run, in flight at the stop, ended; no fourth
    assert report.runs == 3 and report.wakes > report.runs  # held events were evaluated


def test_ctrl_c_while_the_replays_queued_wakes_run_starts_no_more_runs(tmp_path: Path) -> None:
    """The data all read, the agent caught up, its queued wakes run one by one: a stop
    asked now spares the rest as any other stop does (the run in flight ends), and
    the report says it was interrupted (runs are missing from it)."""
    at_end: list[int] = []
    asked: list[int] = []

    def two_runs_into_the_drain(service: Service, requests: list[Any]) -> bool:
        if not service.stopping:
            return False
        at_end[:] = at_end or [len(requests)]
        if len(requests) < at_end[0] + 2:
            return False
        asked.append(len(requests))
        return True

    # One run per wake, at most one every 10 minutes of market time, three wakes a
    # close (every 5): the queue is full (max_collected: 20) when the data ends.
    queue = "queue_mode = 'immediate'\ncooldown_after_run_seconds = 600\n"
    requests, report = _stopped_backtest(
        tmp_path, two_runs_into_the_drain, "max_runs_per_hour = 100\n" + queue, hooks="bc"
    )
    assert asked and report.stopped_by == "signal"
    # the run in flight ends (its request may still have been on its way); no other
    assert asked[0] <= len(requests) <= asked[0] + 1
    assert report.runs == len(requests) and report.wakes > report.runs


def _stopped_backtest(
    tmp_path: Path,
    holds: Callable[[Service, list[Any]], bool],
    wake: str = "max_runs_per_hour = 100\n",
    hooks: str = "",
) -> tuple[list[Any], Report]:
    """``backtest --run-llm`` over 400 closes of an agent woken by each (``wake``: its
    policy's settings; a second waking hook per letter of ``hooks``), its model a
    loopback fake answering in 50 ms, stopped as a signal would once ``holds(service,
    the model's requests so far)``: those requests, and the report."""
    data = tmp_path / "c.csv"
    generate_candles(data, seed=5, n=400, timeframe="5m")
    slow_answer = [0.05, openai_turn("nothing to do")] * 400
    with (
        anyio.from_thread.start_blocking_portal() as portal,
        portal.wrap_async_context_manager(fake_openai(slow_answer)) as (fake, url),
    ):
        opts = _waking_every_close(tmp_path, data, url, wake)
        for other in hooks:
            (opts.agent_dir / "hooks" / f"wake_{other}.py").write_text(
                "def evaluate(event, state):\n"
                f"    key = '{other}' + event['eventId']\n"
                "    return {'decision': 'WAKE', 'reason': 'every close', 'dedupeKey': key}\n"
            )
        report = run_backtest(opts, [stop_when(lambda service: holds(service, fake.requests))])
    return fake.requests, report


def _waking_every_close(
    tmp_path: Path, data: Path, url: str, wake: str = "max_runs_per_hour = 100\n"
) -> BacktestOptions:
    """``backtest --run-llm`` options of an agent woken by every close (``wake``: its
    policy's settings; at most 100 runs an hour), its model at ``url``."""
    agent = tmp_path / "agents" / "alpha"
    (agent / "hooks").mkdir(parents=True)
    policy = AGENT.format(url=url).replace("[wake]\n", f"[wake]\n{wake}")
    (agent / "agent.toml").write_text(policy)
    (agent / "hooks" / "wake_all.py").write_text(
        "def evaluate(event, state):\n"
        "    return {'decision': 'WAKE', 'reason': 'every close', 'dedupeKey': event['eventId']}\n"
    )
    return BacktestOptions(agent_dir=agent, data=data, out=tmp_path / "out", run_llm=True)
