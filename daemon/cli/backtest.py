"""``marketwake backtest``: an agent over a data file, with the wake-cost report."""

from __future__ import annotations

from pathlib import Path

import click

from daemon.errors import ConfigError
from daemon.logs import configure as configure_logging


@click.command("backtest")
@click.option(
    "--agent",
    "agent_dir",
    required=True,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="The agent directory (agents/<id>, with hooks/ and agent.toml).",
)
@click.option(
    "--data",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Candles as the replay feed reads them: CSV (time,open,high,low,close,volume) "
    "or a JSONL recording (marketwake run --record).",
)
@click.option("--symbol", default="BTC-USD", show_default=True, help="The CSV candles' symbol.")
@click.option("--timeframe", default="5m", show_default=True, help="The CSV candles' timeframe.")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("backtest-out"),
    show_default=True,
    help="Where the agent copy, the run's state and report.json go (replaced each run).",
)
@click.option(
    "--baseline-minutes",
    default=3.0,
    show_default=True,
    type=click.FloatRange(min=0.1),
    help="The timer agent compared against wakes every this many minutes.",
)
@click.option("--tokens-in", default=6000, show_default=True, help="Input tokens per run.")
@click.option("--tokens-out", default=800, show_default=True, help="Output tokens per run.")
@click.option("--price-in", default=3.0, show_default=True, help="Price per million input tokens.")
@click.option(
    "--price-out", default=15.0, show_default=True, help="Price per million output tokens."
)
@click.option(
    "--run-llm",
    is_flag=True,
    help="Run the agent's runner on each wake (its LLM, command or log) instead of counting.",
)
def backtest_command(
    agent_dir: Path,
    data: Path,
    symbol: str,
    timeframe: str,
    out: Path,
    baseline_minutes: float,
    tokens_in: int,
    tokens_out: int,
    price_in: float,
    price_out: float,
    run_llm: bool,
) -> None:
    """Replay DATA through one agent's real pipeline on event time and report what
    its hooks decided, how often it would have woken the LLM and at what cost
    (against a timer agent over the same market time), and its paper trades.

    Prints a summary and writes OUT/report.json. The live daemon's state is never
    touched; the same data gives the same report.
    """
    from daemon.backtest.report import CostModel
    from daemon.backtest.run import BacktestOptions, render, run_backtest

    configure_logging("console", "error")  # the report says what happened
    cost = CostModel(
        tokens_in_per_run=tokens_in,
        tokens_out_per_run=tokens_out,
        price_input_per_mtok=price_in,
        price_output_per_mtok=price_out,
    )
    opts = BacktestOptions(
        agent_dir=agent_dir,
        data=data,
        out=out,
        symbol=symbol,
        timeframe=timeframe,
        baseline_minutes=baseline_minutes,
        cost=cost,
        run_llm=run_llm,
    )
    try:
        report = run_backtest(opts)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    click.echo(render(report))
    click.echo(f"report: {out / 'report.json'}")
