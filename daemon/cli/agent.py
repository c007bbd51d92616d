"""``marketwake agent run``: one LLM run of an agent, by hand, with its transcript.

For prompt authors: the same system prompt (AGENT.md), wake context and tools
as a run the daemon starts, printed step by step. The state comes from the
daemon's last state-cache snapshot, when there is one.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import anyio
import click
import msgspec

from daemon import logs
from daemon.agents.workspace import load_agent_config
from daemon.cli.common import MAX_EVENT_FILE_BYTES, echo, load_config_or_defaults
from daemon.config import Config
from daemon.errors import NOT_JSON, StoreError
from daemon.events import decode, iso_ms, now_ms
from daemon.inputfile import read_input
from daemon.llm.runner import LlmRunner, RegistryToolBox, Step
from daemon.state import StateCache, read_snapshot
from daemon.statedir import SNAPSHOT_FILE
from daemon.wake.context import RunResult, WakeContext, WakeReason
from daemon.wake.policy import RunnerConfig

_FILE = click.Path(dir_okay=False, exists=True, path_type=Path)


@click.group("agent")
def agent_group() -> None:
    """Work with one agent outside the daemon."""


@agent_group.command("run")
@click.argument("agent_id")
@click.option("--config", "config_path", type=click.Path(path_type=Path), help="Config file.")
@click.option("--event", "event_path", type=_FILE, help="A FeedEvent JSON file to wake on.")
def agent_run(agent_id: str, config_path: Path | None, event_path: Path | None) -> None:
    """Run AGENT_ID's LLM once and print the transcript (prompt, turns, tool calls).

    The run uses the agent's [wake.runner] (kind = "llm"), its AGENT.md and the
    daemon's tools, exactly as a WAKE would. Without --event it is a manual wake
    with no triggering event. Exits 0 when the run finished, 1 otherwise.
    """
    cfg = load_config_or_defaults(config_path)
    logs.configure(cfg.daemon.log_format, cfg.daemon.log_level)
    agent_dir = Path(cfg.hooks.agents_dir) / agent_id
    if not agent_dir.is_dir():
        raise click.ClickException(f"no agent {agent_id!r} in {cfg.hooks.agents_dir}")
    runner = load_agent_config(agent_dir / "agent.toml").wake.runner
    if runner.kind != "llm":
        raise click.ClickException(
            f"agent {agent_id!r} uses the {runner.kind!r} runner; set [wake.runner] "
            'kind = "llm" in its agent.toml (see docs/llm.md)'
        )
    ctx = WakeContext(
        agent_id=agent_id,
        run_id=f"{agent_id}-manual-{os.urandom(4).hex()}",
        kind="wake",
        triggered_at=iso_ms(now_ms()),
        reasons=[_reason(event_path)],
        state=_state(cfg),
    )
    result = anyio.run(_run, cfg, runner, agent_dir, ctx)
    echo(f"── {result.summary()}")
    if result.error:
        echo(f"   {result.error}")
    sys.exit(0 if result.status == "ok" else 1)


def _reason(event_path: Path | None) -> WakeReason:
    if event_path is None:
        return WakeReason(
            hook_id="manual", reason="manual run", event_id=None, trace_id=None,
            symbol=None, topic=None, ts=None,
        )  # fmt: skip
    try:
        event = decode(read_input(event_path, MAX_EVENT_FILE_BYTES))
    except (OSError, *NOT_JSON, msgspec.ValidationError) as exc:
        raise click.ClickException(f"{event_path}: not a FeedEvent: {exc}") from None
    return WakeReason(
        hook_id="manual",
        reason=f"manual run on {event.topic}",
        event_id=event.event_id,
        trace_id=event.trace_id,
        symbol=event.symbol,
        topic=event.topic,
        ts=event.ts,
    )


def _state(cfg: Config) -> dict[str, object] | None:
    """The last state the daemon saved (candles, indicators), if any."""
    try:
        data = read_snapshot(Path(cfg.daemon.state_dir) / SNAPSHOT_FILE)
        if data is None:
            return None
        cache = StateCache.from_config(cfg.state)
        cache.load(data)
    except StoreError as exc:
        echo(f"(state snapshot not used: {exc})", err=True)
        return None
    return cache.export(None, candles=10)


async def _run(cfg: Config, runner: RunnerConfig, agent_dir: Path, ctx: WakeContext) -> RunResult:
    from daemon.tools import registry
    from daemon.tools.context import open_context

    async with open_context(cfg) as tools:
        llm = LlmRunner(
            runner, tools=RegistryToolBox(registry(), tools), agent_dir=agent_dir, observer=_print
        )
        return await llm.run(ctx)


# A model's text as the transcript shows it (a reply is a few thousand characters; an
# endpoint gone wrong may send megabytes).
MAX_SHOWN_TEXT = 16_000


def _clipped(text: str, limit: int) -> str:
    """``text``, or its first ``limit`` characters and how many more there were."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit:,} more characters not shown)"


def _print(step: Step) -> None:
    """One transcript entry on stdout."""
    if step.kind in ("system", "user"):
        title = "system prompt (AGENT.md)" if step.kind == "system" else "wake context"
        echo(f"── {title}")
        echo(f"{step.text}\n", lines=True)
    elif step.turn is not None:
        t = step.turn
        cached = t.cache_read or t.cache_write
        cache = f"; cache {t.cache_read} read, {t.cache_write} written" if cached else ""
        echo(f"── model ({t.tokens_in}+{t.tokens_out} tokens{cache}, stop {t.stop_reason})")
        if t.text:
            echo(_clipped(t.text, MAX_SHOWN_TEXT), lines=True)
        for call in t.tool_calls:
            echo(f"  → {call.name} {_clipped(json.dumps(call.arguments), 500)}")
        echo("")
    elif step.call is not None and step.outcome is not None:
        mark = "error" if step.outcome.is_error else "ok"
        echo(f"  ← {step.call.name} {mark}: {step.outcome.content[:500]}")
