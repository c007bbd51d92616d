"""Small helpers shared by CLI commands."""

from __future__ import annotations

import glob
import math
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import click

from daemon import config as config_mod
from daemon.config import Config
from daemon.events import TIMEFRAMES
from daemon.printable import visible, visible_json, visible_lines

# An event or state JSON file a command reads (a state holds a few series of candles).
MAX_EVENT_FILE_BYTES = 16 * 1024 * 1024

F = TypeVar("F", bound=Callable[..., object])


def echo(text: str, err: bool = False, lines: bool = False) -> None:
    """``click.echo`` for text that quotes what hooks, models or webhooks wrote: their
    escape sequences and line breaks are shown, not obeyed (``daemon.printable``).
    ``lines``: the text's own line breaks and tabs are layout and stay (its parts
    from others must then have been made :func:`visible` one by one)."""
    click.echo(visible_lines(text) if lines else visible(text), err=err)


def echo_json(text: str) -> None:
    """Print a JSON document with what would act on a terminal spelled as ``\\u``
    escapes (the same JSON for a parser)."""
    click.echo(visible_json(text))


class Number(click.FloatRange):
    """A float option within a range that is a finite number: click's range lets
    ``nan`` through (it compares false with both bounds), and an unbounded one ``inf``
    (a NaN hook budget stopped every worker; a NaN baseline raised a traceback)."""

    name = "number"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


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


def utc_ms(text: str | None, option: str) -> int:
    """Epoch ms of a UTC date (``2025-03-01``) or time (``2025-03-01T12:00``); 0 if unset."""
    if not text:
        return 0
    try:
        moment = datetime.fromisoformat(text)  # 3.11 reads a trailing Z too
    except ValueError:
        raise click.BadParameter(
            f"{text!r}: expected a date like 2025-03-01 or 2025-03-01T12:00", param_hint=option
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def data_specs(specs: tuple[str, ...], option: str) -> list[tuple[Path, str, str]]:
    """Each ``FILE[=SYMBOL[:TIMEFRAME]]`` of ``specs`` as :func:`data_spec`, a FILE
    with ``*``, ``?`` or ``[`` (quoted, so the shell leaves it) standing for the
    files it matches, in name order (Binance's monthly files: one series)."""
    out: list[tuple[Path, str, str]] = []
    for spec in specs:
        path, sep, rest = spec.rpartition("=")
        if not sep or Path(spec).exists():
            path, rest = spec, ""
        out += [
            data_spec(f"{m}={rest}" if rest else str(m), option) for m in matching(path, option)
        ]
    return out


def matching(pattern: str, option: str) -> list[Path]:
    """The files ``pattern`` names: itself when it exists or has no ``*``, ``?`` or ``[``
    (checked later, by name), else the files it matches, in name order (BadParameter
    when none does)."""
    if Path(pattern).exists() or not any(c in pattern for c in "*?["):
        return [Path(pattern)]
    found = sorted(Path(p) for p in glob.glob(pattern) if Path(p).is_file())
    if not found:
        raise click.BadParameter(f"{pattern!r}: no file matches", param_hint=option)
    return found


def data_spec(spec: str, option: str) -> tuple[Path, str, str]:
    """``FILE[=SYMBOL[:TIMEFRAME]]`` as (path, symbol, timeframe), "" where not given
    (a file whose name has '=' is taken whole). The ``=`` part names a CSV's series;
    a recording carries its own, and naming one for it is refused."""
    path, sep, rest = spec.rpartition("=")
    if not sep or Path(spec).exists():
        path, rest = spec, ""
    symbol, _, timeframe = rest.partition(":")
    if not Path(path).exists():  # a special file is refused, by name, before reading
        raise click.BadParameter(f"{path!r}: no such file", param_hint=option)
    if timeframe and timeframe not in TIMEFRAMES:
        raise click.BadParameter(
            f"{spec!r}: timeframe must be one of {', '.join(TIMEFRAMES)}", param_hint=option
        )
    if rest and is_recording(Path(path)):
        raise click.BadParameter(
            f"{spec!r}: '={rest}' names a CSV's symbol and timeframe, and this is a "
            "recording, which carries its own (the agent's `symbols` limit what it evaluates)",
            param_hint=option,
        )
    return Path(path), symbol, timeframe


def is_recording(path: Path) -> bool:
    """Whether ``path`` replays as a recording (FeedEvents or Coinbase messages), not
    CSV candles; a file that cannot be read is left to the replay's own checks."""
    from daemon.errors import ReplayError
    from feeds.config import ReplaySection
    from feeds.replay import ReplayFeed

    try:
        return ReplayFeed(ReplaySection(path=str(path))).format() != "csv"
    except ReplayError:
        return False
