"""``marketwake hooks ...``: test hook files in the real sandbox, resume paused hooks."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
import click
import msgspec

from daemon.agents.store import AGENT_WIDE, HookStore
from daemon.cli.common import resolve_state_dir
from daemon.errors import HookCompileError
from daemon.events import FeedEvent, to_dict
from hooks_runtime import HookSpec, SandboxConfig, hook_paths, load_hook, open_worker_pool


@click.group("hooks")
def hooks_group() -> None:
    """Work with agent hook files."""


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise click.BadParameter(f"{path}: cannot read {what} JSON: {exc}") from None


def _collect(path: Path) -> tuple[str, list[Path]]:
    """(agent id, hook files) for one hook file or an agent (or hooks) directory."""
    if path.is_file():
        return "cli", [path]
    hooks_dir = path / "hooks" if (path / "hooks").is_dir() else path
    agent = path.name if hooks_dir != path else path.parent.name
    files = hook_paths(hooks_dir)
    if not files:
        raise click.BadParameter(f"{hooks_dir}: no wake_*/autotrade_*/copytrade_* hook files")
    return agent or "cli", files


def _record(path: Path, **fields: Any) -> str:
    return json.dumps({"file": str(path), **fields}, ensure_ascii=False, allow_nan=False)


async def _run(
    agent: str, files: list[Path], event: dict[str, Any], state: Any, config: SandboxConfig
) -> bool:
    specs: list[tuple[Path, HookSpec]] = []
    all_ok = True
    for f in files:
        try:
            specs.append((f, load_hook(f, config.max_source_bytes)))
        except HookCompileError as exc:
            all_ok = False
            click.echo(_record(f, hook=f.stem, error_kind="compile", error=str(exc)))
    async with open_worker_pool(config) as pool:
        if pool.ready is not None:
            click.echo(f"sandbox layers active: {', '.join(pool.ready.active)}", err=True)
        # Compile first, as the daemon does when a file changes: the evaluation then runs
        # under the daemon's own deadline (timeout_ms), and the compile time is reported
        # on its own instead of being hidden in a first call's allowance.
        compiled = await pool.compile(agent, [s for _, s in specs])
        runnable = [(f, s, c) for (f, s), c in zip(specs, compiled, strict=True) if c.ok]
        for (f, _), c in zip(specs, compiled, strict=True):
            if not c.ok:
                all_ok = False
                click.echo(_record(f, hook=c.hook_id, error_kind=c.error_kind, error=c.error))
        results = await pool.evaluate(agent, [s for _, s, _ in runnable], event, state)
    for (f, _, c), r in zip(runnable, results, strict=True):
        fields = msgspec.to_builtins(r)
        fields.pop("hook_id", None)
        click.echo(_record(f, hook=r.hook_id, compile_ms=round(c.runtime_ms, 3), **fields))
        all_ok = all_ok and r.ok
    return all_ok


@hooks_group.command("test")
@click.argument("path", type=click.Path(exists=True, path_type=Path))
@click.option(
    "--event",
    "event_path",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="A FeedEvent as JSON (camelCase, as on the bus).",
)
@click.option(
    "--state",
    "state_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The read-only state the hooks see, as JSON (default: {}).",
)
@click.option("--timeout-ms", type=float, default=None, help="Per-hook budget (default 250).")
def test_command(
    path: Path, event_path: Path, state_path: Path | None, timeout_ms: float | None
) -> None:
    """Evaluate one hook file, or every hook of an agent directory in one worker.

    Each hook is compiled first, then evaluated under the daemon's deadline
    (--timeout-ms, 250 by default): a hook the daemon would time out fails here
    too. Decisions are checked as the daemon checks them (a TRADE_INTENT's
    intent included). Prints one JSON line per hook (its decision or the
    recorded error, with runtime_ms and compile_ms) and exits 0 only if every
    hook produced a valid decision.
    """
    event = _read_json(event_path, "event")
    try:
        event = to_dict(msgspec.convert(event, FeedEvent))  # exactly what hooks get live
    except msgspec.ValidationError as exc:
        raise click.BadParameter(
            f"{event_path}: not a FeedEvent ({exc}); required: eventId, ts, source, topic, payload"
        ) from None
    state = _read_json(state_path, "state") if state_path else {}
    config = SandboxConfig() if timeout_ms is None else SandboxConfig(timeout_ms=timeout_ms)
    agent, files = _collect(path)
    ok = anyio.run(_run, agent, files, event, state, config)
    sys.exit(0 if ok else 1)


def _hook_store(config_path: Path | None, state_dir: Path | None) -> HookStore:
    path = resolve_state_dir(config_path, state_dir) / "hooks.sqlite3"
    if not path.exists():
        raise click.ClickException(
            f"no hook store at {path}: pass the daemon's --config or --state-dir"
        )
    return HookStore(path)


@hooks_group.command("resume")
@click.argument("agent")
@click.argument("hook", required=False)
@click.option("--config", "config_path", type=click.Path(path_type=Path), help="Config file.")
@click.option("--state-dir", type=click.Path(path_type=Path), help="The daemon's state_dir.")
def resume_command(
    agent: str, hook: str | None, config_path: Path | None, state_dir: Path | None
) -> None:
    """Lift the pause of HOOK (a file stem, e.g. wake_two_green) or of the whole AGENT.

    The running daemon applies it within [hooks] reload_seconds; a stopped one at start.
    """
    store = _hook_store(config_path, state_dir)
    try:
        if hook and not store.revisions(agent, hook):
            raise click.ClickException(f"unknown hook {agent}/{hook} (no revision recorded)")
        was_paused = store.request_resume(agent, hook or AGENT_WIDE)
        paused = [(a, h, r) for a, h, r, _ in store.pauses() if a == agent]
    finally:
        store.close()
    target = f"{agent}/{hook}" if hook else f"agent {agent}"
    click.echo(f"resumed {target}" if was_paused else f"{target} was not paused (resume sent)")
    for a, h, reason in paused:
        click.echo(f"  still paused: {a}/{h}: {reason}")


@hooks_group.command("paused")
@click.option("--config", "config_path", type=click.Path(path_type=Path), help="Config file.")
@click.option("--state-dir", type=click.Path(path_type=Path), help="The daemon's state_dir.")
def paused_command(config_path: Path | None, state_dir: Path | None) -> None:
    """List paused hooks and agents."""
    store = _hook_store(config_path, state_dir)
    try:
        rows = store.pauses()
    finally:
        store.close()
    if not rows:
        click.echo("nothing is paused")
    for agent, hook, reason, _ in rows:
        click.echo(f"{agent}/{hook}: {reason}")
