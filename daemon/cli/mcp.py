"""``marketwake mcp``: the agent's tools for desktop MCP hosts, over stdio."""

from __future__ import annotations

from pathlib import Path

import anyio
import click

from daemon import logs
from daemon.cli.common import load_config_or_defaults
from daemon.config import Config

_CONFIG = click.Path(dir_okay=False, path_type=Path)


@click.command("mcp")
@click.option("--config", "config_path", type=_CONFIG, help="Config file (default ./config.toml).")
def mcp_command(config_path: Path | None) -> None:
    """Serve the tools to an MCP host on stdin/stdout (Claude Desktop, Claude Code).

    The host starts this command itself; see README "The agent's tools (MCP)" for the JSON
    to add. Logs go to stderr ([daemon] log_format, log_level); stdout is the wire.
    It opens its own Coinbase connection when a tool first needs one.
    """
    cfg = load_config_or_defaults(config_path)
    logs.configure(cfg.daemon.log_format, cfg.daemon.log_level)
    anyio.run(_serve, cfg)


async def _serve(cfg: Config) -> None:
    from daemon.tools import registry
    from daemon.tools.context import open_context
    from daemon.tools.mcp_server import build_server, serve_stdio

    async with open_context(cfg) as ctx:
        await serve_stdio(build_server(registry(), ctx))
