"""``marketwake audit tail`` and ``marketwake why``: read the audit log.

The audit directory is ``--dir`` if given, else ``<--state-dir>/audit``, else
the config's audit directory (``[audit] dir``, default
``<daemon.state_dir>/audit``) from ``--config`` or ``./config.toml``, else
``./state/audit``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import get_args

import click
import msgspec
from rich.console import Console

from daemon.audit.reader import AuditFilter, Follower, parse_since, tail
from daemon.audit.records import AuditRecord
from daemon.audit.render import render, to_json
from daemon.audit.why import collect, event_at, explain, render_explanation
from daemon.cli.common import Number, load_config_or_defaults, state_dir_option, utc_ms

DIR_HELP = (
    "Audit directory (default: STATE_DIR/audit with --state-dir, else [audit] dir of "
    "--config or ./config.toml, else ./state/audit)."
)
# Every record type the log holds (copy-trade signals included), in the union's order.
RECORD_TYPES = tuple(str(t.__struct_config__.tag) for t in get_args(AuditRecord))
DECISIONS = ("WAKE", "IGNORE", "ALERT", "TRADE_INTENT", "ERROR")


def audit_dir(
    directory: Path | None,
    config_path: Path | None,
    state_dir: Path | None = None,
    must_exist: bool = True,
) -> Path:
    """Where the audit log lives, by the precedence in the module docstring."""
    if directory is not None:
        where = directory
    elif state_dir is not None:
        where = state_dir / "audit"
    else:
        where = load_config_or_defaults(config_path).audit_dir
    if must_exist and not where.is_dir():
        raise click.ClickException(
            f"no audit log at {where}: pass --state-dir, --dir or the daemon's --config"
        )
    return where


def _since(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return parse_since(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--since") from None


def _console() -> Console:
    return Console(file=sys.stdout, highlight=False, soft_wrap=True)


@click.group("audit")
def audit_group() -> None:
    """Read the audit log of hook evaluations, wakes, risk verdicts and orders."""


@audit_group.command("tail")
@click.option("-f", "--follow", is_flag=True, help="Keep printing records as they are written.")
@click.option(
    "-n",
    "--lines",
    default=20,
    type=click.IntRange(min=0),
    show_default=True,
    help="How many past records to show.",
)
@click.option("--agent", help="Only this agent id.")
@click.option("--hook", help="Only this hook id.")
@click.option(
    "--decision",
    type=click.Choice(DECISIONS, case_sensitive=False),
    help="Only hook records with this decision (ERROR: the hook failed).",
)
@click.option("--symbol", help="Only this symbol.")
@click.option("--since", help="Only records newer than this: 15m, 2h, 3d or an RFC 3339 time.")
@click.option(
    "--from",
    "start",
    metavar="TIME",
    help="Only rows about market time at or after this (UTC date or time; the event "
    "time in a backtest or replay, where --since is when a row was written).",
)
@click.option("--to", "end", metavar="TIME", help="Only rows about market time before this.")
@click.option(
    "--type",
    "--kind",
    "types",
    multiple=True,
    type=click.Choice(RECORD_TYPES),
    help="Only these record types (repeatable); --kind run lists runs with their cost.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the stored JSON lines.")
@click.option("--dir", "directory", type=click.Path(path_type=Path), help=DIR_HELP)
@state_dir_option
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path),
    help="Config file (TOML) for state_dir.",
)
@click.option(
    "--poll",
    default=0.25,
    type=Number(min=0.01),
    show_default=True,
    hidden=True,
    help="Follow poll interval (s).",
)
def tail_command(
    follow: bool,
    lines: int,
    agent: str | None,
    hook: str | None,
    decision: str | None,
    symbol: str | None,
    since: str | None,
    start: str | None,
    end: str | None,
    types: tuple[str, ...],
    as_json: bool,
    directory: Path | None,
    state_dir: Path | None,
    config_path: Path | None,
    poll: float,
) -> None:
    """Show the latest audit records, filtered; with -f keep following."""
    where = audit_dir(directory, config_path, state_dir, must_exist=not follow)  # -f waits
    flt = AuditFilter(
        agent=agent,
        hook=hook,
        decision=decision,
        symbol=symbol,
        since_ms=_since(since),
        types=frozenset(types) if types else None,
        from_ms=utc_ms(start, "--from") if start else None,
        to_ms=utc_ms(end, "--to") if end else None,
    )
    console = _console()

    def show(rec: dict[str, object]) -> None:
        if as_json:
            click.echo(to_json(rec))
        else:
            console.print(render(rec))
        sys.stdout.flush()

    # Following starts first and the tail reads exactly up to where it starts: a batch
    # flushed meanwhile is shown once, after the tail, in order.
    follower = Follower(where, flt) if follow else None
    for rec in tail(where, flt, lines, upto=follower.offsets if follower else None):
        show(rec)
    if follower is None:
        return
    try:
        while True:
            batch = follower.poll()
            for rec in batch:
                show(rec)
            if not batch:
                time.sleep(poll)
    except KeyboardInterrupt:
        return  # Ctrl-C is how one stops following


@click.command("why")
@click.argument("ident", required=False)
@click.option(
    "--at",
    metavar="TIME",
    help="Instead of IDENT: the first event at or after this market time (UTC date or "
    "time, as a backtest's dates) a hook evaluated.",
)
@click.option("--symbol", help="With --at: only this symbol's events.")
@click.option("--agent", help="With --at: only the events this agent evaluated.")
@click.option("--since", help="Only search records newer than this: 15m, 2h, 3d or a time.")
@click.option("--json", "as_json", is_flag=True, help="Print the explanation as JSON.")
@click.option("--dir", "directory", type=click.Path(path_type=Path), help=DIR_HELP)
@state_dir_option
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path),
    help="Config file (TOML) for state_dir.",
)
def why_command(
    ident: str | None,
    at: str | None,
    symbol: str | None,
    agent: str | None,
    since: str | None,
    as_json: bool,
    directory: Path | None,
    state_dir: Path | None,
    config_path: Path | None,
) -> None:
    """Explain what happened to an event (eventId) or trace (traceId), per agent,
    or how an order (its clientOrderId, as status and audit tail show it) or an
    agent's run (its runId: the events whose wakes it took) came about.

    With --at TIME (and --symbol, --agent) instead of IDENT: the first event at or
    after that market time. Exits 1 when the audit log has no record of it.
    """
    if (ident is None) == (at is None):
        raise click.UsageError("name an eventId, traceId, clientOrderId or runId, or --at TIME")
    if ident is not None and (symbol or agent):
        raise click.UsageError("--symbol and --agent go with --at")
    where = audit_dir(directory, config_path, state_dir)
    if ident is None:
        found = event_at(where, utc_ms(at, "--at"), symbol, agent)
        if found is None:
            click.echo(f"no event at or after {at} in {where}", err=True)
            sys.exit(1)
        ident = found
    exp = explain(collect(where, ident, _since(since)), ident)
    if as_json:
        click.echo(msgspec.json.encode(exp).decode())
    else:
        console = _console()
        for line in render_explanation(exp):
            console.print(line)
    if not exp.found:
        sys.exit(1)


# Also reachable as ``marketwake audit why`` until the top-level command is registered.
audit_group.add_command(why_command)
