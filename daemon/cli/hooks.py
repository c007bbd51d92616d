"""``marketwake hooks ...``: test hook files in the real sandbox, resume paused hooks."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
import click
import msgspec

from daemon.agents.dispatcher import market_state
from daemon.agents.store import AGENT_WIDE, HookStore
from daemon.agents.workspace import AGENT_FILE, load_agent_config
from daemon.audit.reader import AuditFilter, LastOutputs, iter_records
from daemon.cli.common import (
    MAX_EVENT_FILE_BYTES,
    Number,
    data_specs,
    echo,
    echo_json,
    load_config_or_defaults,
    resolve_state_dir,
    state_dir_option,
    utc_ms,
)
from daemon.errors import (
    ConfigError,
    HookCompileError,
    HookRequestTooLarge,
    HookRequestUnsendable,
    ReplayError,
)
from daemon.events import FeedEvent, iso_ms, parse_iso_ms, to_dict
from daemon.inputfile import read_input
from daemon.recorder import kept_part
from daemon.state import StateCache
from daemon.trading.ledger import Ledger
from feeds.config import ReplayFileSection, ReplaySection
from feeds.replay import ReplayFeed
from hooks_runtime import HookSpec, SandboxConfig, hook_paths, load_hook, open_worker_pool
from hooks_runtime.hookfile import HOOK_NAME


@click.group("hooks")
def hooks_group() -> None:
    """Work with agent hook files."""


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(read_input(path, MAX_EVENT_FILE_BYTES).decode("utf-8"))
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
            echo_json(_record(f, hook=f.stem, error_kind="compile", error=str(exc)))
    async with open_worker_pool(config) as pool:
        if pool.ready is not None:
            echo(f"sandbox layers active: {', '.join(pool.ready.active)}", err=True)
        # Compile first, as the daemon does when a file changes: the evaluation then runs
        # under the daemon's own deadline (timeout_ms), and the compile time is reported
        # on its own instead of being hidden in a first call's allowance.
        compiled = await pool.compile(agent, [s for _, s in specs])
        runnable = [(f, s, c) for (f, s), c in zip(specs, compiled, strict=True) if c.ok]
        for (f, _), c in zip(specs, compiled, strict=True):
            if not c.ok:
                all_ok = False
                echo_json(_record(f, hook=c.hook_id, error_kind=c.error_kind, error=c.error))
        try:
            results = await pool.evaluate(agent, [s for _, s, _ in runnable], event, state)
        except (HookRequestTooLarge, HookRequestUnsendable) as exc:
            # As the daemon answers it: each hook's error, none evaluated.
            kind = "oversized" if isinstance(exc, HookRequestTooLarge) else "unsendable"
            for f, s, _ in runnable:
                echo_json(_record(f, hook=s.hook_id, error_kind=kind, error=str(exc)))
            return False
    for (f, _, c), r in zip(runnable, results, strict=True):
        fields = msgspec.to_builtins(r)
        fields.pop("hook_id", None)
        echo_json(_record(f, hook=r.hook_id, compile_ms=round(c.runtime_ms, 3), **fields))
        all_ok = all_ok and r.ok
    return all_ok


def replay_state(
    recordings: list[ReplaySection], wanted: str | int, candles: int, account: str = ""
) -> tuple[FeedEvent, dict[str, Any]]:
    """The event ``wanted`` (its id, or the first at or after that epoch ms) of the
    replays, read one after the other (JSONL FeedEvents as ``--record`` writes them,
    raw Coinbase messages, or CSV candles; gzip or not), and the state a hook saw for
    it: every event up to it applied to a state cache (exported as the dispatcher
    does) and to ``account``'s ledger (its working orders and positions)."""
    cache = StateCache(max_candles=max(candles, 1))
    ledger = Ledger(account)
    for section in recordings:
        feed = ReplayFeed(section)
        try:
            for event in feed.recorded():
                cache.apply(event)
                if _is_wanted(event, wanted):
                    state = market_state(cache, event, candles)
                    state.update(ledger.state(), lastOutputs={})
                    return event, state
                ledger.apply(event)
        except ReplayError as exc:
            raise click.BadParameter(str(exc)) from None
    names = " or ".join(s.path for s in recordings)
    what = f"with id {wanted!r}" if isinstance(wanted, str) else f"at or after {iso_ms(wanted)}"
    raise click.BadParameter(f"{names}: no event {what}")


def _is_wanted(event: FeedEvent, wanted: str | int) -> bool:
    if isinstance(wanted, str):
        return event.event_id == wanted
    try:
        return parse_iso_ms(event.ts) >= wanted
    except ValueError:
        return False


def _agent_dir(path: Path) -> Path:
    """The agent directory ``path`` (a hook file, a hooks dir or an agent dir) is in."""
    agent_dir = path.parent.parent if path.is_file() else path
    return agent_dir.parent if agent_dir.name == "hooks" else agent_dir


def _agent_of(path: Path) -> tuple[int, str]:
    """(``state_candles``, paper account) of the agent ``path`` (a hook file or
    directory) belongs to."""
    agent_dir = _agent_dir(path)
    try:
        cfg = load_agent_config(agent_dir / AGENT_FILE)
    except ConfigError as exc:
        raise click.BadParameter(str(exc)) from None
    return cfg.state_candles, cfg.account or agent_dir.name


def audit_outputs(audit_dir: Path, agent: str, event_id: str) -> dict[str, dict[str, Any]]:
    """``state.lastOutputs`` of ``agent`` when the daemon evaluated ``event_id``: its
    hook rows before that event's, folded as the dispatcher (and a restart) does."""
    fold = LastOutputs()
    hook_rows = AuditFilter(agent=agent, types=frozenset({"hook"}))
    for rec in iter_records(audit_dir, hook_rows, contains=[f'"agentId":"{agent}"']):
        if rec.get("eventId") == event_id:
            break
        fold.add(rec)
    return fold.by_agent.get(agent, {})


def _live_decisions(audit_dir: Path, event_id: str) -> None:
    """What the daemon's hooks decided for the event, for comparison (stderr)."""
    for rec in iter_records(audit_dir, AuditFilter(types=frozenset({"hook"})), ids=[event_id]):
        if rec.get("eventId") == event_id:
            decided = rec.get("decision") or f"ERROR ({rec.get('error')})"
            echo(
                f"live: {rec.get('agentId')}/{rec.get('hookId')} decided {decided}: "
                f"{rec.get('reason', '')}",
                err=True,
            )


@hooks_group.command("test")
@click.argument("path", type=click.Path(exists=True, path_type=Path))
@click.option(
    "--event",
    "event_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="A FeedEvent as JSON (camelCase, as on the bus).",
)
@click.option(
    "--state",
    "state_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The read-only state the hooks see, as JSON (default: {}).",
)
@click.option(
    "--recording",
    "recording_spec",
    metavar="FILE[=SYMBOL:TIMEFRAME]",
    multiple=True,
    help="A recording (--record JSONL, or raw Coinbase messages) or CSV candles (BTC-USD "
    "5m unless named after '='; .gz or not): take the event and rebuild its state "
    "from the file. Repeat it for several (1h and 4h candles: merged by time, as "
    "backtest --data does).",
)
@click.option("--event-id", help="With --recording: which event to test.")
@click.option(
    "--at",
    "at",
    metavar="TIME",
    help="With --recording, instead of --event-id: the first event at or after this UTC "
    "time (2025-03-01T12:00; a candle's time is its close).",
)
@click.option(
    "--from-audit",
    "audit_event",
    metavar="EVENT_ID",
    help="An event the daemon evaluated: replayed from its [daemon] record file, "
    "beside what the live hooks decided (needs --config).",
)
@click.option("--config", "config_path", type=click.Path(path_type=Path), help="Config file.")
@click.option(
    "--timeout-ms",
    type=Number(min=0, min_open=True),
    default=None,
    help="Per-hook budget (default 250).",
)
def test_command(
    path: Path,
    event_path: Path | None,
    state_path: Path | None,
    recording_spec: tuple[str, ...],
    event_id: str | None,
    at: str | None,
    audit_event: str | None,
    config_path: Path | None,
    timeout_ms: float | None,
) -> None:
    """Evaluate one hook file, or every hook of an agent directory in one worker.

    The event is --event (with --state), or a real one: --recording FILE
    --event-id ID (or --at TIME) rebuilds the candles, indicators and ticks the
    hook saw from a recording or CSV candles, and --from-audit ID does so from
    the daemon's own recording and prints what the live hooks decided. Positions and working orders come
    from the recording's account events; lastOutputs comes from the daemon's
    audit log with --from-audit (a bare --recording has none: empty).

    Each hook is compiled first, then evaluated under the daemon's deadline
    (--timeout-ms, 250 by default): a hook the daemon would time out fails here
    too. Decisions are checked as the daemon checks them (a TRADE_INTENT's
    intent included). Prints one JSON line per hook (its decision or the
    recorded error, with runtime_ms and compile_ms) and exits 0 only if every
    hook produced a valid decision.
    """
    if audit_event is not None:
        cfg = load_config_or_defaults(config_path)
        if not cfg.daemon.record:
            raise click.BadParameter(
                "the daemon records no events ([daemon] record is empty): set it (or run "
                "with --record) and events it evaluates can be replayed here",
                param_hint="--from-audit",
            )
        recording, event_id = Path(cfg.daemon.record), audit_event
        _live_decisions(cfg.audit_dir, audit_event)
        # What the recorder keeps: the file it moved aside when it was full, then this one.
        earlier = kept_part(recording)
        files = [earlier, recording] if earlier.exists() else [recording]
        recordings = [ReplaySection(path=str(f)) for f in files]
    elif recording_spec:
        (file, symbol, timeframe), *more = data_specs(recording_spec, "--recording")
        recordings = [
            ReplaySection(
                path=str(file),
                symbol=symbol or "BTC-USD",
                timeframe=timeframe or "5m",
                files=[ReplayFileSection(path=str(f), symbol=s, timeframe=t) for f, s, t in more],
            )
        ]
    if audit_event is not None or recording_spec:
        if (event_id is None) == (at is None) or event_path is not None or state_path:
            raise click.UsageError(
                "--recording takes --event-id or --at (one of them), and no --event or --state"
            )
        wanted: str | int = event_id if event_id is not None else utc_ms(at, "--at")
        live, state = replay_state(recordings, wanted, *_agent_of(path))
        echo(f"event {live.event_id} ({live.topic}) at {live.ts}", err=True)
        if audit_event is not None:
            state["lastOutputs"] = audit_outputs(
                cfg.audit_dir, _agent_dir(path).name, live.event_id
            )
        event = to_dict(live)
    else:
        if event_path is None:
            raise click.UsageError("pass --event, --recording with --event-id, or --from-audit")
        raw = _read_json(event_path, "event")
        try:
            event = to_dict(msgspec.convert(raw, FeedEvent))  # exactly what hooks get live
        except msgspec.ValidationError as exc:
            raise click.BadParameter(
                f"{event_path}: not a FeedEvent ({exc}); "
                "required: eventId, ts, source, topic, payload"
            ) from None
        state = _read_json(state_path, "state") if state_path else {}
        if not isinstance(state, dict):  # what hooks get is a mapping, as in the daemon
            raise click.BadParameter(
                f"{state_path}: the state must be a JSON object (candles, indicators, "
                f"positions, ...), not {type(state).__name__}",
                param_hint="--state",
            )
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
@state_dir_option
def resume_command(
    agent: str, hook: str | None, config_path: Path | None, state_dir: Path | None
) -> None:
    """Lift the pause of HOOK (a file stem, e.g. wake_two_green) or of the whole AGENT.

    The running daemon applies it within [hooks] reload_seconds; a stopped one at start.
    """
    store = _hook_store(config_path, state_dir)
    try:
        known = store.agents()
        if agent not in known:
            hint = f"; usage: hooks resume AGENT {agent}" if HOOK_NAME.match(f"{agent}.py") else ""
            names = ", ".join(sorted(known)) or "none yet"
            raise click.ClickException(f"unknown agent {agent!r} (agents that ran: {names}){hint}")
        if hook and not store.revisions(agent, hook):
            raise click.ClickException(f"unknown hook {agent}/{hook} (no revision recorded)")
        was_paused = store.request_resume(agent, hook or AGENT_WIDE)
        paused = [(a, h, r) for a, h, r, _ in store.pauses() if a == agent]
    finally:
        store.close()
    target = f"{agent}/{hook}" if hook else f"agent {agent}"
    echo(f"resumed {target}" if was_paused else f"{target} was not paused (resume sent)")
    for a, h, reason in paused:
        echo(f"  still paused: {a}/{h}: {reason}")


@hooks_group.command("paused")
@click.option("--config", "config_path", type=click.Path(path_type=Path), help="Config file.")
@state_dir_option
def paused_command(config_path: Path | None, state_dir: Path | None) -> None:
    """List paused hooks and agents."""
    store = _hook_store(config_path, state_dir)
    try:
        rows = store.pauses()
    finally:
        store.close()
    if not rows:
        echo("nothing is paused")
    for agent, hook, reason, _ in rows:
        echo(f"{agent}/{hook}: {reason}")
