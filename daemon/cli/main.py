"""Entry point: ``marketwake <command>``. Commands live in small sibling modules."""

from __future__ import annotations

import sys

import click

from daemon import __version__
from daemon.cli.agent import agent_group
from daemon.cli.audit import audit_group, why_command
from daemon.cli.backtest import backtest_command
from daemon.cli.copytrade import copytrade_group
from daemon.cli.demo import demo_command
from daemon.cli.hooks import hooks_group
from daemon.cli.mcp import mcp_command
from daemon.cli.rag import rag_group
from daemon.cli.run import config_group, run_command, status_command
from daemon.errors import MarketwakeError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="marketwake")
def cli() -> None:
    """marketwake watches markets so your LLM trading agent does not have to.

    Feeds put events on a bus; sandboxed hooks decide whether to wake the
    agent, alert, or propose a trade; everything is audit-logged.
    """


cli.add_command(run_command)
cli.add_command(status_command)
cli.add_command(config_group)
cli.add_command(demo_command)
cli.add_command(audit_group)
cli.add_command(why_command)
cli.add_command(hooks_group)
cli.add_command(rag_group)
cli.add_command(mcp_command)
cli.add_command(agent_group)
cli.add_command(backtest_command)
cli.add_command(copytrade_group)


def _deliberate(exc: BaseException) -> MarketwakeError | None:
    """The MarketwakeError inside ``exc``, unwrapping task-group exception groups."""
    if isinstance(exc, MarketwakeError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _deliberate(inner)
            if found is not None:
                return found
    return None


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
        click.secho(f"error: {err}", fg="red", err=True)
        sys.exit(err.exit_code)
