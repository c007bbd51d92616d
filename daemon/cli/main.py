"""Entry point: ``marketwake <command>``. Commands live in small sibling modules,
imported when their command runs: ``status`` or ``why`` do not load the LLM
runner, its tools and their HTTP stack (~0.3 s at every start)."""

from __future__ import annotations

import importlib
import sys
import traceback
from typing import NamedTuple

import click

from daemon import __version__
from daemon.errors import MarketwakeError


class Where(NamedTuple):
    """Where a command lives, and its summary for ``--help`` (its help's first
    paragraph: ``--help`` lists the commands without importing them all;
    ``tests/test_cli.py`` keeps the two the same)."""

    module: str
    attribute: str
    summary: str


COMMANDS: dict[str, Where] = {
    "agent": Where("daemon.cli.agent", "agent_group", "Work with one agent outside the daemon."),
    "audit": Where(
        "daemon.cli.audit",
        "audit_group",
        "Read the audit log of hook evaluations, wakes, risk verdicts and orders.",
    ),
    "backtest": Where(
        "daemon.cli.backtest",
        "backtest_command",
        "Replay DATA through one agent's real pipeline on event time and report what its "
        "hooks decided, how often it would have woken the LLM and at what cost (against a "
        "timer agent over the same market time), and its paper trades.",
    ),
    "config": Where(
        "daemon.cli.run",
        "config_group",
        "Validate configuration files, and try the alert webhook they name.",
    ),
    "copytrade": Where(
        "daemon.cli.copytrade",
        "copytrade_group",
        "Copy trading: leaders' signals and what followers made of them.",
    ),
    "demo": Where(
        "daemon.cli.demo",
        "demo_command",
        "Run the daemon offline on a replay of generated, clearly synthetic candles.",
    ),
    "hooks": Where("daemon.cli.hooks", "hooks_group", "Work with agent hook files."),
    "mcp": Where(
        "daemon.cli.mcp",
        "mcp_command",
        "Serve the tools to an MCP host on stdin/stdout (Claude Desktop, Claude Code).",
    ),
    "rag": Where(
        "daemon.cli.rag",
        "rag_group",
        "Similar historical market states (embedded store or Qdrant; JSON-RPC 2.0 on TCP 7879).",
    ),
    "run": Where(
        "daemon.cli.run",
        "run_command",
        "Run the daemon: every enabled feed, the bus, the state cache.",
    ),
    "status": Where(
        "daemon.cli.run",
        "status_command",
        "Show a daemon's bus, feeds, hooks and paper accounts (running, or its last run).",
    ),
    "why": Where(
        "daemon.cli.audit",
        "why_command",
        "Explain what happened to an event (eventId) or trace (traceId), per agent, or how "
        "an order (its clientOrderId, as status and audit tail show it) or an agent's run "
        "(its runId: the events whose wakes it took) came about.",
    ),
}


class _Commands(click.Group):
    """A group whose commands are imported on first use; ``--help`` lists them from
    their summaries (importing them all took over a second)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        where = COMMANDS.get(cmd_name)
        if where is None:
            return None
        command = getattr(importlib.import_module(where.module), where.attribute)
        if not isinstance(command, click.Command):
            raise TypeError(f"{where.module}.{where.attribute} is not a click command")
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """As click lists them, from the summaries."""
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(map(len, names))
        rows = [
            (n, click.Command(n, help=COMMANDS[n].summary).get_short_help_str(limit)) for n in names
        ]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="marketwake")
def cli() -> None:
    """marketwake watches markets so your LLM trading agent does not have to.

    Feeds put events on a bus; sandboxed hooks decide whether to wake the
    agent, alert, or propose a trade; everything is audit-logged.
    """


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside task-group exception groups, in order."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _deliberate(exc: BaseException) -> MarketwakeError | None:
    """The MarketwakeError inside ``exc``, unwrapping task-group exception groups."""
    return next((e for e in _leaves(exc) if isinstance(e, MarketwakeError)), None)


def main() -> None:
    """Run the CLI; deliberate errors print one line and exit with their code."""
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except (MarketwakeError, BaseExceptionGroup) as exc:
        err = _deliberate(exc)
        if err is None:
            raise
        # What failed beside it is a bug or the cause (a full disk's OSError): shown whole.
        for other in _leaves(exc):
            if isinstance(other, Exception) and not isinstance(other, MarketwakeError):
                traceback.print_exception(other, file=sys.stderr)
        click.secho(f"error: {err}", fg="red", err=True)
        sys.exit(err.exit_code)
