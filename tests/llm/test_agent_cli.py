"""`marketwake agent run`: one LLM run by hand, its transcript on stdout."""

from __future__ import annotations

from pathlib import Path

import anyio
from click.testing import CliRunner, Result

from daemon.cli.main import cli
from daemon.events import encode
from tests.agents.test_pipeline import candle
from tests.llm.fakes import fake_openai, openai_turn


def _workspace(root: Path, toml: str) -> Path:
    agent = root / "agents" / "alpha"
    agent.mkdir(parents=True)
    (agent / "agent.toml").write_text(toml)
    (agent / "AGENT.md").write_text("You watch BTC-USD.")
    config = root / "config.toml"
    config.write_text(
        f'[daemon]\nstate_dir = "{root / "state"}"\n[hooks]\nagents_dir = "{root / "agents"}"\n'
    )
    return config


async def _invoke(args: list[str]) -> Result:
    # In a worker thread: the command runs its own event loop (anyio.run).
    return await anyio.to_thread.run_sync(lambda: CliRunner().invoke(cli, args))


async def test_agent_run_prints_the_transcript(tmp_path: Path) -> None:
    """The prompt, the wake context with the event, each model turn and tool answer,
    then the one-line summary; exit 0 for a finished run."""
    script = [
        openai_turn("Checking.", calls=[("c1", "wait_for_market_event", {})]),
        openai_turn("Hold.", usage=(300, 5)),
    ]
    async with fake_openai(script) as (fake, url):
        toml = (
            f'[wake.runner]\nkind = "llm"\nprovider = "openai"\nmodel = "fake-gpt"\n'
            f'base_url = "{url}"\n'
        )
        config = _workspace(tmp_path, toml)
        event = tmp_path / "e.json"
        event.write_bytes(encode(candle(0)))
        res = await _invoke(
            ["agent", "run", "alpha", "--config", str(config), "--event", str(event)]
        )
    assert res.exit_code == 0, res.output
    out = res.output
    for expected in (
        "── system prompt (AGENT.md)\nYou watch BTC-USD.",
        "manual: manual run on market.candle.closed",
        "→ wait_for_market_event {}",
        "← wait_for_market_event error:",
        "Hold.",
        "── ok; fake-gpt: 1 tool call(s), 400+25 tokens",
    ):
        assert expected in out, (expected, out)
    assert candle(0).event_id in fake.requests[0]["messages"][1]["content"]


async def test_agent_run_clips_a_reply_of_megabytes(tmp_path: Path) -> None:
    """An endpoint gone wrong that answers megabytes of text: the transcript shows
    its first MAX_SHOWN_TEXT characters and says how many more there were."""
    from daemon.cli.agent import MAX_SHOWN_TEXT

    async with fake_openai([openai_turn("x" * 2_000_000)]) as (_fake, url):
        toml = (
            f'[wake.runner]\nkind = "llm"\nprovider = "openai"\nmodel = "fake-gpt"\n'
            f'base_url = "{url}"\n'
        )
        res = await _invoke(["agent", "run", "alpha", "--config", str(_workspace(tmp_path, toml))])
    assert res.exit_code == 0, res.output[-500:]
    assert f"... ({2_000_000 - MAX_SHOWN_TEXT:,} more characters not shown)" in res.output
    assert len(res.output) < MAX_SHOWN_TEXT + 5_000


async def test_agent_run_refuses_an_agent_without_an_llm_runner(tmp_path: Path) -> None:
    """The default log runner cannot be run by hand: one line says what to set."""
    config = _workspace(tmp_path, "")
    res = await _invoke(["agent", "run", "alpha", "--config", str(config)])
    assert res.exit_code != 0 and 'kind = "llm"' in res.output
    missing = await _invoke(["agent", "run", "nobody", "--config", str(config)])
    assert missing.exit_code != 0 and "no agent 'nobody'" in missing.output


async def test_agent_run_refuses_an_event_file_that_is_not_a_feed_event(tmp_path: Path) -> None:
    """A broken --event file is one clear error line, before any model call."""
    config = _workspace(
        tmp_path,
        '[wake.runner]\nkind = "llm"\nprovider = "openai"\nmodel = "m"\nbase_url = "http://127.0.0.1:9"\n',
    )
    bad = tmp_path / "e.json"
    bad.write_text('{"topic": 5}')
    res = await _invoke(["agent", "run", "alpha", "--config", str(config), "--event", str(bad)])
    assert res.exit_code != 0 and "not a FeedEvent" in res.output
