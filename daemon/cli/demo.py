"""``marketwake demo``: the offline demo (what ``make run`` starts)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from daemon.cli.common import Number
from daemon.logs import configure as configure_logging


@click.command("demo")
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("demo-state"),
    show_default=True,
    help="Where the synthetic data, recording and state go.",
)
@click.option(
    "--candles",
    default=720,
    type=click.IntRange(min=10),
    show_default=True,
    help="Synthetic 1m candles to replay.",
)
@click.option(
    "--speed",
    default=2400.0,
    type=Number(min=0),
    show_default=True,
    help="Replay speed (60 = a minute per second; 0 = as fast as possible).",
)
@click.option("--seed", default=7, show_default=True, help="Generator seed (same seed, same data).")
@click.option("--quiet", is_flag=True, help="Only print the summary.")
@click.option(
    "--agents",
    "agents_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("agents"),
    show_default=True,
    help="Agent workspaces whose hooks evaluate the replay.",
)
@click.option(
    "--copytrade",
    is_flag=True,
    help="A leader agent trades the data and agents/follower mirrors it at half size.",
)
def demo_command(
    directory: Path,
    candles: int,
    speed: float,
    seed: int,
    quiet: bool,
    agents_dir: Path,
    copytrade: bool,
) -> None:
    """Run the daemon offline on a replay of generated, clearly synthetic candles.

    Shows a live stream of closed candles with indicators and ends with a
    summary. Nothing touches the network.
    """
    from daemon.demo import DemoOptions, run_demo

    configure_logging("console", "warning")
    opts = DemoOptions(directory, candles, speed, seed, quiet, agents_dir, copytrade)
    sys.exit(run_demo(opts))
