"""Small helpers shared by CLI commands."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import click

from daemon import config as config_mod
from daemon.config import Config

# An event or state JSON file a command reads (a state holds a few series of candles).
MAX_EVENT_FILE_BYTES = 16 * 1024 * 1024

F = TypeVar("F", bound=Callable[..., object])


def state_dir_option(fn: F) -> F:
    """``--state-dir``, the same for every command that reads a daemon's state (a
    backtest's is ``<out>/state``)."""
    return click.option(
        "--state-dir",
        type=click.Path(path_type=Path),
        help="The daemon's state_dir (default: [daemon] state_dir of --config or "
        "./config.toml); a backtest's is OUT/state.",
    )(fn)


def load_config_or_defaults(config_path: Path | None) -> Config:
    """``--config`` if given; else ./config.toml if present; else the built-in defaults."""
    path = config_path or config_mod.DEFAULT_CONFIG_PATH
    if config_path is None and not path.exists():
        return config_mod.parse("")
    return config_mod.load(path)


def resolve_state_dir(config_path: Path | None, state_dir: Path | None) -> Path:
    """``--state-dir`` wins; otherwise ``[daemon] state_dir`` of the config."""
    if state_dir is not None:
        return state_dir
    return Path(load_config_or_defaults(config_path).daemon.state_dir)
