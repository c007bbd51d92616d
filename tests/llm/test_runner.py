"""The LLM runner against loopback fakes of both APIs, driven by the real SDKs."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from aiohttp import web

from daemon.agents.workspace import load_agent_config
from daemon.errors import ConfigError
from daemon.llm.prompt import render_context
from daemon.llm.runner import LlmRunner, RegistryToolBox, args_digest
from daemon.secret import Secret
from daemon.tools.base import Registry, Tool
from daemon.tools.context import ToolContext
from daemon.wake.context import WakeContext, WakeReason
from daemon.wake.policy import RunnerConfig
from tests.llm.fakes import anthropic_turn, fake_anthropic, fake_openai, openai_turn

ROOT = Path(__file__).resolve().parent.parent.parent


class Nap(msgspec.Struct, frozen=True):
    """Sleep a little, then echo the symbol."""

    symbol: str
    seconds: float = 0.3


class Napped(msgspec.Struct, frozen=True):
    symbol: str


SPANS: list[tuple[float, float]] = []  # (start, end) of every nap, to see overlap


async def _nap(_: ToolContext, req: Nap) -> Napped:
    t0 = time.perf_counter()
    await anyio.sleep(req.seconds)
    SPANS.append((t0, time.perf_counter()))
    return Napped(req.symbol)


NAP = Tool("nap", "Nap", "Sleeps, then echoes the symbol.", Nap, _nap, timeout_seconds=5)
TOOLS = RegistryToolBox(Registry([NAP]), ToolContext())
CTX = WakeContext(
    agent_id="alpha",
    run_id="alpha-1",
    kind="wake",
    triggered_at="2026-11-25T00:00:00.000Z",
    reasons=[
        WakeReason(
            hook_id="wake_rsi",
            reason="RSI14 23.0",
            event_id="ev1",
            trace_id="t1",
            symbol="BTC-USD",
            topic="market.candle.closed",
            ts="2026-11-25T00:00:00.000Z",
        )
    ],
    state={"indicators": {"BTC-USD": {"5m": {"rsi14": 23.0}}}},
)


def cfg(provider: str, base_url: str, **kw: Any) -> RunnerConfig:
    base: dict[str, Any] = {
        "kind": "llm",
        "provider": provider,
        "model": "m",
        "api_key": Secret("test-key"),
        "base_url": base_url,
        "price_input_per_mtok": 3.0,
        "price_output_per_mtok": 15.0,
    }
    return RunnerConfig(**{**base, **kw})


async def test_openai_parallel_tool_calls_after_a_429(tmp_path: Path) -> None:
    """A 429 is retried by the SDK; two tool calls of one turn run at the same time;
    their answers go back as role=tool messages; tokens and cost add up."""
    (tmp_path / "AGENT.md").write_text("You trade BTC carefully.")
    script = [
        (429, {"error": {"message": "slow down", "type": "rate_limit_error"}}),
        openai_turn(calls=[("c1", "nap", {"symbol": "BTC-USD"}), ("c2", "nap", {"symbol": "ETH-USD"})]),
        openai_turn("BTC looks oversold; no trade.", usage=(300, 40)),
    ]  # fmt: skip
    async with fake_openai(script) as (fake, url):
        runner = LlmRunner(cfg("openai", url), tools=TOOLS, agent_dir=tmp_path)
        SPANS.clear()
        result = await runner.run(CTX)
    assert result.status == "ok", result
    report = result.llm
    assert report is not None
    assert (report.tokens_in, report.tokens_out, report.model_calls) == (400, 60, 2)
    assert report.cost == pytest.approx((400 * 3.0 + 60 * 15.0) / 1e6)
    assert report.text == "BTC looks oversold; no trade." and report.stop_reason == "stop"
    assert [(c.name, c.ok) for c in report.tool_calls] == [("nap", True), ("nap", True)]
    assert report.tool_calls[0].args_digest == args_digest({"symbol": "BTC-USD"})
    (a0, a1), (b0, b1) = SPANS
    assert max(a0, b0) < min(a1, b1), "the two calls of one turn did not overlap"
    assert len(fake.requests) == 3  # the 429 was retried once by the SDK
    first, *_, last = fake.requests
    assert first["messages"][0] == {"role": "system", "content": "You trade BTC carefully."}
    assert "RSI14 23.0" in first["messages"][1]["content"]
    assert first["tools"][0]["function"]["name"] == "nap"
    answers = [m for m in last["messages"] if m["role"] == "tool"]
    assert [(m["tool_call_id"], json.loads(m["content"])) for m in answers] == [
        ("c1", {"symbol": "BTC-USD"}),
        ("c2", {"symbol": "ETH-USD"}),
    ]


async def test_anthropic_tool_errors_go_back_as_error_results(tmp_path: Path) -> None:
    """An unknown tool and bad arguments are answered as is_error tool_result blocks
    the model can correct, and recorded as failed calls; the run still succeeds."""
    script = [
        anthropic_turn("Let me look.", calls=[("u1", "nope", {}), ("u2", "nap", {"seconds": "x"})]),
        anthropic_turn("Done.", usage=(150, 10)),
    ]  # fmt: skip
    async with fake_anthropic(script) as (fake, url):
        result = await LlmRunner(cfg("anthropic", url), tools=TOOLS).run(CTX)
    assert result.status == "ok" and result.llm is not None
    calls = result.llm.tool_calls
    assert [(c.name, c.ok) for c in calls] == [("nope", False), ("nap", False)]
    assert "no tool named 'nope'" in (calls[0].error or "")
    second = fake.requests[1]
    assert second["system"][0]["text"].startswith("You are a trading agent")  # the default
    assert second["messages"][1]["content"][2] == {
        "type": "tool_use", "id": "u2", "name": "nap", "input": {"seconds": "x"},
    }  # fmt: skip
    results = second["messages"][2]["content"]
    assert [(r["tool_use_id"], r["is_error"]) for r in results] == [("u1", True), ("u2", True)]
    assert "seconds" in results[1]["content"]  # the problem names the bad field
    assert (result.llm.tokens_in, result.llm.tokens_out) == (250, 30)


async def test_anthropic_prompt_cache_moves_with_the_tool_loop_and_is_priced() -> None:
    """The system prompt (and the tools before it) carry a cache breakpoint; a second
    one moves to the newest block each turn, so turn 2 reads turn 1 from the cache.
    The cost prices writes at 1.25 x and reads at 0.1 x the input price."""
    script = [
        anthropic_turn(calls=[("n1", "nap", {"symbol": "X", "seconds": 0})],
                       usage=(50, 10), cache=(2000, 0)),
        anthropic_turn("Done.", usage=(80, 20), cache=(0, 2000)),
    ]  # fmt: skip
    spent: list[tuple[float, int, int]] = []  # what the scheduler keeps, turn by turn
    async with fake_anthropic(script) as (fake, url):  # priced at 3 in, 15 out
        result = await LlmRunner(cfg("anthropic", url), tools=TOOLS).run(CTX, spent.append)
    first, second = fake.requests
    ephemeral = {"type": "ephemeral"}
    for request in (first, second):
        assert request["system"][0]["cache_control"] == ephemeral
    marked = [
        (m, i)
        for m, msg in enumerate(second["messages"])
        for i, block in enumerate(msg["content"])
        if "cache_control" in block
    ]
    assert first["messages"][0]["content"][-1]["cache_control"] == ephemeral
    assert marked == [(2, 0)]  # only the tool result: the first message's mark moved
    assert result.llm is not None
    assert (result.llm.tokens_in, result.llm.tokens_cache_write) == (4130, 2000)
    assert result.llm.tokens_cache_read == 2000
    plain, write, read, out = 130 * 3.0, 2000 * 3.75, 2000 * 0.3, 30 * 15.0
    assert result.llm.cost == round((plain + write + read + out) / 1e6, 6)
    turn_one = round((50 * 3.0 + 2000 * 3.75 + 10 * 15.0) / 1e6, 6)
    assert spent == [(turn_one, 2050, 10), (result.llm.cost, 4130, 30)]
    async with fake_anthropic([anthropic_turn("ok")]) as (fake, url):
        await LlmRunner(cfg("anthropic", url, prompt_cache=False), tools=TOOLS).run(CTX)
    assert "cache_control" not in json.dumps(fake.requests[0])
    # Without tools a run is one turn: only the system prompt (shared by runs) is marked.
    async with fake_anthropic([anthropic_turn("ok")]) as (fake, url):
        await LlmRunner(cfg("anthropic", url, max_tool_calls=0), tools=TOOLS).run(CTX)
    (only,) = fake.requests
    assert "cache_control" in only["system"][0]
    assert "cache_control" not in json.dumps(only["messages"])


async def test_openai_cached_tokens_are_counted_and_priced_as_configured() -> None:
    """OpenAI reports the cached part of its prompt tokens: counted, and priced at the
    input price unless price_cached_input_per_mtok names the model's own."""
    for price, expected in ((None, 1000 * 3.0), (1.5, 400 * 3.0 + 600 * 1.5)):
        async with fake_openai([openai_turn("ok", usage=(1000, 0), cached=600)]) as (_, url):
            config = cfg("openai", url, price_cached_input_per_mtok=price)
            result = await LlmRunner(config, tools=TOOLS).run(CTX)
        assert result.llm is not None and result.llm.tokens_cache_read == 600
        assert (result.llm.tokens_in, result.llm.cost) == (1000, round(expected / 1e6, 6))
    # A server claiming more cached tokens than it was sent: never a negative price.
    async with fake_openai([openai_turn("ok", usage=(100, 0), cached=10_000)]) as (_, url):
        odd = await LlmRunner(cfg("openai", url), tools=TOOLS).run(CTX)
    assert odd.llm is not None and odd.llm.cost == round(10_000 * 3.0 / 1e6, 6)


async def test_negative_token_counts_count_as_none() -> None:
    """An endpoint that reports negative usage (broken or hostile) takes no spend off
    the day's cost cap: its counts are taken as zero, for the report and as the run
    goes."""
    spent: list[tuple[float, int, int]] = []
    turn = openai_turn("ok", usage=(-1_000_000, -5), cached=-7)
    async with fake_openai([turn]) as (_, url):
        odd = await LlmRunner(cfg("openai", url), tools=TOOLS).run(CTX, spent.append)
    assert odd.llm is not None
    assert (odd.llm.tokens_in, odd.llm.tokens_out, odd.llm.cost) == (0, 0, 0.0)
    assert spent == [(0.0, 0, 0)]
    turn = anthropic_turn("ok", usage=(-1_000_000, -5), cache=(-3, -4))
    async with fake_anthropic([turn]) as (_, url):
        odd = await LlmRunner(cfg("anthropic", url), tools=TOOLS).run(CTX)
    assert odd.llm is not None
    assert (odd.llm.tokens_in, odd.llm.tokens_cache_write, odd.llm.cost) == (0, 0, 0.0)


async def test_a_run_past_its_deadline_is_cut_and_reported() -> None:
    """The model stalls: the run ends at the deadline as timeout, with the usage so far."""
    script = [
        openai_turn(calls=[("c1", "nap", {"symbol": "BTC-USD", "seconds": 0})]),
        1.5,
        openai_turn("late"),
    ]
    async with fake_openai(script) as (_, url):
        t0 = time.perf_counter()
        result = await LlmRunner(cfg("openai", url, deadline_seconds=0.8), tools=TOOLS).run(CTX)
        took = time.perf_counter() - t0
    assert result.status == "timeout" and took < 2.0
    assert result.llm is not None and result.llm.stop_reason == "deadline"
    assert result.llm.model_calls == 1 and len(result.llm.tool_calls) == 1
    assert "deadline" in (result.error or "")


async def test_a_run_cancelled_from_outside_closes_its_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stop or a reload cancels a run mid-request: its HTTP client is closed then
    too, not left to the garbage collector with its socket open."""
    from daemon.llm.conversation import OpenAIConversation

    close, turn = OpenAIConversation.close, OpenAIConversation.turn
    closed: list[bool] = []
    asked = anyio.Event()

    async def closing(self: OpenAIConversation) -> None:
        await close(self)
        closed.append(True)

    async def asking(self: OpenAIConversation) -> Any:
        asked.set()
        return await turn(self)

    monkeypatch.setattr(OpenAIConversation, "close", closing)
    monkeypatch.setattr(OpenAIConversation, "turn", asking)
    async with fake_openai([3.0, openai_turn("late")]) as (_, url), anyio.create_task_group() as tg:
        tg.start_soon(LlmRunner(cfg("openai", url), tools=TOOLS).run, CTX)
        with anyio.fail_after(10):
            await asked.wait()
        await anyio.sleep(0.2)  # the request is out; the model stalls on it
        tg.cancel_scope.cancel()
    assert closed == [True]


async def test_tool_call_budget_asks_the_model_to_conclude() -> None:
    """Calls past max_tool_calls are answered with an error; a model that keeps
    calling ends the run with stop reason max_tool_calls."""
    many = [(f"c{i}", "nap", {"symbol": "X", "seconds": 0}) for i in range(3)]
    script = [openai_turn(calls=many), openai_turn(calls=many[:1])]
    async with fake_openai(script) as (fake, url):
        result = await LlmRunner(cfg("openai", url, max_tool_calls=2), tools=TOOLS).run(CTX)
    assert result.llm is not None and result.llm.stop_reason == "max_tool_calls"
    assert len(result.llm.tool_calls) == 2
    refused = [m for m in fake.requests[1]["messages"] if m.get("tool_call_id") == "c2"]
    assert "budget of 2 tool calls" in refused[0]["content"]


async def test_an_api_error_fails_the_run_with_the_reason() -> None:
    """A 401 is not retried: the run fails with the provider's message."""
    script = [
        (401, {"type": "error", "error": {"type": "authentication_error", "message": "bad key"}})
    ]
    async with fake_anthropic(script) as (fake, url):
        result = await LlmRunner(cfg("anthropic", url), tools=TOOLS).run(CTX)
    assert result.status == "failed" and "bad key" in (result.error or "")
    assert len(fake.requests) == 1


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_page_that_is_not_the_api_fails_the_run_saying_so(provider: str) -> None:
    """A base_url that answers 200 with an HTML page (a web UI, a proxy's login): the
    run fails naming what came back and what to check (it said "AttributeError:
    'str' object has no attribute 'choices'")."""
    page = web.Response(text="<html>Open WebUI</html>", content_type="text/html")
    fake_api = fake_openai if provider == "openai" else fake_anthropic
    async with fake_api([page]) as (_fake, url):
        result = await LlmRunner(cfg(provider, url), tools=TOOLS).run(CTX)
    assert result.status == "failed"
    assert (result.error or "").startswith("ModelAnswerError: the model endpoint answered with no")
    assert "is base_url the API's own" in (result.error or "") and "Open WebUI" in (
        result.error or ""
    )


def _bent(provider: str, how: int) -> dict[str, Any]:
    """A JSON answer with a field not where or what the API puts it."""
    if provider == "openai":
        body = openai_turn("hello")
        if how == 0:
            body["choices"][0]["message"] = "hello"
        elif how == 1:
            body["choices"][0]["message"]["content"] = 5
        else:
            body["choices"] = []
        return body
    body = anthropic_turn("hello")
    if how == 0:
        body["content"][0] = "hello"
    elif how == 1:
        body["content"][0]["text"] = ["hello"]
    else:
        body["usage"]["input_tokens"] = "many"
    return body


@pytest.mark.parametrize("how", [0, 1, 2])
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_an_answer_not_shaped_as_the_api_fails_the_run_saying_so(
    provider: str, how: int
) -> None:
    """A proxy or a server that only looks compatible: the run fails as a model answer
    error naming the API and what was off (it read "AttributeError: 'str' object has
    no attribute 'content'"; found by fuzzing both wire formats)."""
    fake_api = fake_openai if provider == "openai" else fake_anthropic
    async with fake_api([_bent(provider, how)]) as (_fake, url):
        result = await LlmRunner(cfg(provider, url), tools=TOOLS).run(CTX)
    assert result.status == "failed"
    api = "OpenAI Chat Completions" if provider == "openai" else "Anthropic Messages"
    assert (result.error or "").startswith(
        f"ModelAnswerError: the model endpoint's answer is not shaped as the {api} API's"
    ), result.error


async def test_a_key_whose_variable_was_never_set_is_not_sent(tmp_path: Path) -> None:
    """A disabled agent's ``${VAR}`` stays as written when VAR is unset; run anyway (a
    backtest with --run-llm, ``agent run``), it fails naming VAR, the provider untouched."""
    toml = tmp_path / "agent.toml"
    toml.write_text(
        'enabled = false\n[wake.runner]\nkind = "llm"\nprovider = "anthropic"\n'
        'model = "m"\napi_key = "${MW_TEST_SURELY_UNSET}"\n'
    )
    runner = load_agent_config(toml).wake.runner
    async with fake_anthropic([(200, anthropic_turn("hi"))]) as (fake, url):
        runner = msgspec.structs.replace(runner, base_url=url)
        result = await LlmRunner(runner, tools=TOOLS).run(CTX)
    assert result.status == "failed" and fake.requests == []
    assert "${MW_TEST_SURELY_UNSET}, which is not set" in (result.error or "")


def test_a_manual_wake_reads_as_one_without_an_event() -> None:
    manual = WakeReason(hook_id="manual", reason="manual run", event_id=None, trace_id=None,
                        symbol=None, topic=None, ts=None)  # fmt: skip
    text = render_context(msgspec.structs.replace(CTX, reasons=[manual, *CTX.reasons]))
    assert "- manual: manual run\n" in text
    assert (
        "- wake_rsi: RSI14 23.0 (BTC-USD market.candle.closed 2026-11-25T00:00:00.000Z; "
        "event ev1)" in text
    )


def test_llm_runner_settings_fail_with_one_clear_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """agent.toml: a missing key or provider names the key; ${VAR} fills the api_key
    from the environment and the key never prints."""
    from daemon.agents.workspace import load_agent_config

    toml = tmp_path / "agent.toml"
    toml.write_text('[wake.runner]\nkind = "llm"\nprovider = "anthropic"\nmodel = "m"\n')
    with pytest.raises(ConfigError, match=r"runner\.api_key is missing"):
        load_agent_config(toml)
    toml.write_text('[wake.runner]\nkind = "llm"\nprovider = "gemini"\nmodel = "m"\n')
    with pytest.raises(ConfigError, match=r"wake.runner.provider"):
        load_agent_config(toml)
    toml.write_text(
        '[wake.runner]\nkind = "llm"\nprovider = "openai"\nmodel = "m"\napi_key = "${MW_TEST_KEY}"\n'
    )
    with pytest.raises(ConfigError, match="MW_TEST_KEY is not set"):
        load_agent_config(toml)
    monkeypatch.setenv("MW_TEST_KEY", "sk-secret-value")
    runner = load_agent_config(toml).wake.runner
    assert runner.api_key.reveal() == "sk-secret-value" and "sk-secret" not in repr(runner)


async def test_arguments_that_are_not_an_object_are_answered_as_an_error() -> None:
    """A model that sends a string (or broken JSON) as arguments gets an error result
    it can correct; nothing is called and the run goes on."""
    script = [openai_turn(calls=[("c1", "nap", "not an object")]), openai_turn("ok")]  # type: ignore[list-item]
    async with fake_openai(script) as (fake, url):
        result = await LlmRunner(cfg("openai", url), tools=TOOLS).run(CTX)
    assert result.status == "ok" and result.llm is not None
    (call,) = result.llm.tool_calls
    assert not call.ok and "not a JSON object" in (call.error or "")
    (answer,) = [m for m in fake.requests[1]["messages"] if m["role"] == "tool"]
    assert "not a JSON object" in answer["content"]


async def test_a_special_agent_md_falls_back_to_the_default_prompt(tmp_path: Path) -> None:
    """AGENT.md as a symlink (to a secret), a FIFO or a huge file is not read: the run
    uses the neutral default system prompt instead of hanging or leaking."""
    import os

    from daemon.llm.prompt import DEFAULT_SYSTEM, MAX_AGENT_MD_BYTES, system_prompt

    secret = tmp_path / "secret.txt"
    secret.write_text("API_KEY=sk-live")
    cases: dict[str, Callable[[Path], object]] = {
        "link": lambda p: p.symlink_to(secret),
        "fifo": lambda p: os.mkfifo(p),
        "huge": lambda p: p.write_bytes(b"x" * (MAX_AGENT_MD_BYTES + 1)),
    }
    for name, make in cases.items():
        agent = tmp_path / name
        agent.mkdir()
        make(agent / "AGENT.md")
        with anyio.fail_after(5):
            assert await system_prompt(agent) == DEFAULT_SYSTEM, name


def test_a_rerun_tells_the_model_what_it_repeats() -> None:
    """A re-run's first message names the run a restart cut and says what to check
    before trading; a first run says nothing of it."""
    text = render_context(msgspec.structs.replace(CTX, rerun_of="alpha-cut"))
    assert "A restart cut run alpha-cut, which had these same wakes" in text
    assert "check get_orders and get_positions" in text
    assert "restart" not in render_context(CTX)


def test_the_llm_runner_is_the_runner_that_reports_its_spend() -> None:
    """The scheduler hands a spend callback to the runners that report one (the LLM
    runner), and to no other (their ``run`` takes none)."""
    from daemon.wake.runners import CommandRunner, LogRunner, is_spending

    assert is_spending(LlmRunner(cfg("anthropic", "http://127.0.0.1:9")))
    assert not is_spending(LogRunner())
    assert not is_spending(CommandRunner(["true"]))


FIRST_RUN = """
import importlib.abc, json, sys, threading

import anyio

# For each import of the SDK and of the HTTP/1.1 and HTTP/2 code its first request
# needs: the module, and whether it was imported on the main (event loop) thread.
importers = []


class Spy(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name in ("{sdk}", "h11", "h2"):
            importers.append((name, threading.current_thread() is threading.main_thread()))


sys.meta_path.insert(0, Spy())

from daemon.llm.runner import LlmRunner
from tests.llm.fakes import {fake}, {turn}
from tests.llm.test_runner import CTX, cfg


async def main():
    async with {fake}([{turn}(text="Nothing to do.")]) as (fake, url):
        result = await LlmRunner(cfg("{provider}", url)).run(CTX)
    print(json.dumps({{"status": result.status, "error": result.error, "importers": importers}}))


anyio.run(main)
"""


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_first_run_imports_its_sdk_off_the_event_loop(provider: str) -> None:
    """Importing the SDK (~1-2 s of CPU) where the first run opened its conversation
    held the event loop, so the whole daemon, that long (and the HTTP code its first
    request loads, ~70 ms more): a fresh interpreter sees each imported once, and
    not on the loop's thread."""
    fake, turn = (
        ("fake_openai", "openai_turn")
        if provider == "openai"
        else ("fake_anthropic", "anthropic_turn")
    )
    code = FIRST_RUN.format(sdk=provider, provider=provider, fake=fake, turn=turn)
    out = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.splitlines()[-1])
    assert seen["status"] == "ok", seen["error"]
    assert sorted(seen["importers"]) == sorted([["h11", False], ["h2", False], [provider, False]])
