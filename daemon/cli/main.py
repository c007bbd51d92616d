"""Entry point: ``marketwake <command>``. Commands live in small sibling modules,
imported when their command runs: ``status`` or ``why`` do not load the LLM
runner, its tools and their HTTP stack (~0.3 s at every start)."""

from __future__ import annotations

import importlib
import sys
import traceback

import click

from daemon import __version__
from daemon.errors import MarketwakeError

# Command name -> (module, attribute).
COMMANDS: dict[str, tuple[str, str]] = {
    "agent": ("daemon.cli.agent", "agent_group"),
    "audit": ("daemon.cli.audit", "audit_group"),
    "backtest": ("daemon.cli.backtest", "backtest_command"),
    "config": ("daemon.cli.run", "config_group"),
    "copytrade": ("daemon.cli.copytrade", "copytrade_group"),
    "demo": ("daemon.cli.demo", "demo_command"),
    "hooks": ("daemon.cli.hooks", "hooks_group"),
    "mcp": ("daemon.cli.mcp", "mcp_command"),
    "rag": ("daemon.cli.rag", "rag_group"),
    "run": ("daemon.cli.run", "run_command"),
    "status": ("daemon.cli.run", "status_command"),
    "why": ("daemon.cli.audit", "why_command"),
}


class _Commands(click.Group):
    """A group whose commands are imported on first use (``--help`` imports them all,
    for their one-line descriptions)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        where = COMMANDS.get(cmd_name)
        if where is None:
            return None
        command = getattr(importlib.import_module(where[0]), where[1])
        if not isinstance(command, click.Command):
            raise TypeError(f"{where[0]}.{where[1]} is not a click command")
        return command


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
