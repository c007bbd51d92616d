"""``marketwake backtest``: an agent over a data file, with the wake-cost report."""

from __future__ import annotations

import shlex
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click
import msgspec

from daemon.cli.common import Number, data_specs, echo, utc_ms
from daemon.demo import self_command
from daemon.errors import ConfigError
from daemon.logs import configure as configure_logging

if TYPE_CHECKING:
    from daemon.backtest.run import DataFile
    from daemon.service import Component

INTERRUPTED_EXIT = 130  # a backtest stopped by a signal (as a shell reports SIGINT)
DATA_ERROR_EXIT = 1  # a replay that failed part way (the report covers the part before)
PROGRESS_SECONDS = 0.2  # how often the progress bar reads the feeds' counters


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
    "data_specs",
    required=True,
    multiple=True,
    metavar="FILE[=SYMBOL[:TIMEFRAME]]",
    help="Candles as the replay feed reads them: CSV (open_time_ms,open,high,low,close,"
    "volume, or Binance's kline files as they come), a JSONL recording (marketwake run "
    "--record), or raw Coinbase Advanced Trade "
    "WebSocket messages, one per line (their ticks). Repeat it for several files, "
    "merged by time (a quoted pattern, e.g. 'BTCUSDT-5m-*.zip', stands for the files it "
    "matches); a CSV's symbol and timeframe after '=' (else --symbol, --timeframe).",
)
@click.option("--symbol", default="BTC-USD", show_default=True, help="The CSV candles' symbol.")
@click.option("--timeframe", default="5m", show_default=True, help="The CSV candles' timeframe.")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("backtest-out"),
    show_default=True,
    help=(
        "Where the agent copy, the run's state and report.json go (replaced each run): "
        "a new or empty directory, or an earlier backtest's."
    ),
)
@click.option(
    "--baseline-minutes",
    default=3.0,
    show_default=True,
    type=Number(min=0.1),
    help="The timer agent compared against wakes every this many minutes.",
)
@click.option(
    "--tokens-in",
    default=6000,
    type=click.IntRange(min=0),
    show_default=True,
    help="Input tokens per run.",
)
@click.option(
    "--tokens-out",
    default=800,
    type=click.IntRange(min=0),
    show_default=True,
    help="Output tokens per run.",
)
@click.option(
    "--price-in",
    default=3.0,
    type=Number(min=0),
    show_default=True,
    help="Price per million input tokens.",
)
@click.option(
    "--price-out",
    default=15.0,
    type=Number(min=0),
    show_default=True,
    help="Price per million output tokens.",
)
@click.option(
    "--cost-from",
    "cost_from",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="A daemon state dir: price each run at the mean cost of this agent's real LLM "
    "runs in its audit log (instead of the token estimate).",
)
@click.option("--from", "start", metavar="DATE", help="Only events at or after (UTC date or time).")
@click.option("--to", "end", metavar="DATE", help="Only events before (UTC date or time).")
@click.option(
    "--revision",
    "revisions",
    multiple=True,
    metavar="HOOK=HASH",
    help="Run a kept revision of a hook (the audit's revision, or a 6+ character prefix) "
    "instead of its file; repeatable.",
)
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("state"),
    show_default=True,
    help="The daemon's state dir, whose revisions/ keeps every hook revision it saw.",
)
@click.option(
    "--compare",
    "compare_dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="B: another agent directory, run over the same data and shown beside A.",
)
@click.option(
    "--compare-revision",
    "compare_revisions",
    multiple=True,
    metavar="HOOK=HASH",
    help="B: the same agent with these revisions (repeatable), beside A.",
)
@click.option(
    "--maker-fee-bps",
    default=0.0,
    show_default=True,
    type=Number(min=0, max=1000),
    help="Paper fee, basis points of notional, for a resting limit the market reached.",
)
@click.option(
    "--taker-fee-bps",
    default=0.0,
    show_default=True,
    type=Number(min=0, max=1000),
    help="Paper fee, basis points of notional, for market, stop and marketable orders.",
)
@click.option(
    "--slippage-bps",
    default=0.0,
    show_default=True,
    type=Number(min=0, max=1000),
    help="Market, stop and marketable orders fill this many basis points worse "
    "(a limit never past its limit).",
)
@click.option(
    "--hook-timeout-ms",
    default=250.0,
    show_default=True,
    type=Number(min=0, min_open=True, max=60_000),
    help="Each hook evaluation's wall-clock budget in the sandbox, as [hooks.sandbox] "
    "timeout_ms live. The one limit a busier machine can change a run by: the report "
    "counts the timeouts.",
)
@click.option(
    "--run-llm",
    is_flag=True,
    help="Run the agent's runner on each wake (its LLM, command or log) instead of "
    "counting. The tools answer as of each run's market time, from the replayed data; "
    "the LLM runs' real cost prices the report.",
)
@click.option(
    "--funding",
    "funding_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="With --run-llm: query_similar_patterns reads funding from this CSV(.gz) "
    "(funding_time_ms,funding_rate, or Binance's fundingRate files) as of each run, not "
    "from the exchange.",
)
@click.option(
    "--open-interest",
    "open_interest_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="With --run-llm: the same for open interest (the CSV `rag ingest` takes).",
)
@click.option(
    "--rag-store",
    "rag_store",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="With --run-llm: the embedded pattern store query_similar_patterns searches "
    "(default: ./state/rag, a daemon's store at its default state dir).",
)
def backtest_command(
    agent_dir: Path,
    data_specs: tuple[str, ...],
    symbol: str,
    timeframe: str,
    out: Path,
    baseline_minutes: float,
    tokens_in: int,
    tokens_out: int,
    price_in: float,
    price_out: float,
    cost_from: Path | None,
    start: str | None,
    end: str | None,
    revisions: tuple[str, ...],
    state_dir: Path,
    compare_dir: Path | None,
    compare_revisions: tuple[str, ...],
    maker_fee_bps: float,
    taker_fee_bps: float,
    slippage_bps: float,
    hook_timeout_ms: float,
    run_llm: bool,
    funding_file: Path | None,
    open_interest_file: Path | None,
    rag_store: Path | None,
) -> None:
    """Replay DATA through one agent's real pipeline on event time and report what
    its hooks decided, how often it would have woken the LLM and at what cost
    (against a timer agent over the same market time), and its paper trades.

    Prints a summary and writes OUT/report.json and OUT/report.html (plots: price
    with wakes, alerts and fills, equity, wakes per day). The live daemon's state
    is never touched; the same data gives the same report. With --compare DIR or
    --compare-revision, a second run B goes beside it (OUT/a, OUT/b), and
    OUT/report.json and OUT/report.html hold both and their differences.
    """
    from daemon.backtest.report import Comparison, CostModel, Report
    from daemon.backtest.run import (
        BacktestOptions,
        count_events,
        render,
        render_comparison,
        run_backtest,
        run_comparison,
    )
    from daemon.trading.matching import FillCosts

    configure_logging("console", "error")  # the report says what happened
    cost = CostModel(
        tokens_in_per_run=tokens_in,
        tokens_out_per_run=tokens_out,
        price_input_per_mtok=price_in,
        price_output_per_mtok=price_out,
    )
    if cost_from is not None:
        from daemon.audit.reader import AuditFilter, iter_records
        from daemon.backtest.report import priced_by_runs, run_spends

        rows = iter_records(cost_from / "audit", AuditFilter(types=frozenset({"run"})))
        spends = run_spends(rows, agent_dir.resolve().name)
        cost = priced_by_runs(cost, spends, str(cost_from), actual=False)
        if not spends:
            raise click.BadParameter(
                f"no finished LLM run of {agent_dir.resolve().name!r} in {cost_from / 'audit'}",
                param_hint="--cost-from",
            )
    for given, flag in ((funding_file, "--funding"), (open_interest_file, "--open-interest"),
                        (rag_store, "--rag-store")):  # fmt: skip
        if given is not None and not run_llm:
            raise click.UsageError(f"{flag} is read by the LLM runs' tools: it needs --run-llm")
    files = _data_files(data_specs)
    data = files[0].path
    symbol, timeframe = files[0].symbol or symbol, files[0].timeframe or timeframe
    opts = BacktestOptions(
        agent_dir=agent_dir,
        data=data,
        more_data=files[1:],
        out=out,
        symbol=symbol,
        timeframe=timeframe,
        baseline_minutes=baseline_minutes,
        cost=cost,
        run_llm=run_llm,
        from_ms=utc_ms(start, "--from"),
        to_ms=utc_ms(end, "--to"),
        revisions=_pairs(revisions, "--revision"),
        state_dir=state_dir,
        costs=FillCosts(
            maker_fee_bps=maker_fee_bps, taker_fee_bps=taker_fee_bps, slippage_bps=slippage_bps
        ),
        funding_file=funding_file,
        open_interest_file=open_interest_file,
        rag_store=rag_store,
        hook_timeout_ms=hook_timeout_ms,
    )
    try:
        bar = progress_bar(lambda: count_events(opts))
        if compare_dir is None and not compare_revisions:
            result: Report | Comparison = run_backtest(opts, bar)
        else:
            a = msgspec.structs.replace(opts, out=out / "a")
            b = msgspec.structs.replace(
                opts,
                out=out / "b",
                agent_dir=compare_dir or agent_dir,
                revisions={**opts.revisions, **_pairs(compare_revisions, "--compare-revision")},
            )
            labels = (_label(a.agent_dir, a.revisions), _label(b.agent_dir, b.revisions))
            result = run_comparison(a, b, out, bar, labels)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    if isinstance(result, Comparison):
        echo(render_comparison(result, labels), lines=True)
    else:
        echo(render(result), lines=True)
    page = out / "report.html"  # (none for a comparison cut short: each run has its own)
    echo(f"report: {out / 'report.json'}" + (f", {page} (plots)" if page.exists() else ""))
    if not isinstance(result, Comparison):
        mw, state = self_command(), shlex.quote(str(out / "state"))
        echo(f"look inside: {mw} status --state-dir {state}; {mw} audit tail --state-dir {state}")
    if isinstance(result, Report) and not result.complete:  # the report covers a part
        sys.exit(INTERRUPTED_EXIT if result.stopped_by == "signal" else DATA_ERROR_EXIT)


def progress_bar(count: Callable[[], int]) -> list[Component]:
    """Events replayed of ``count()`` with an ETA on stderr, for a terminal only:
    nothing (and no ``count()``, which reads the data) when stderr is a file or a pipe.

    It polls the feeds' counters a few times a second rather than reading the bus:
    a subscriber would cost every event a delivery and a task switch."""
    from contextlib import asynccontextmanager

    import anyio
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from daemon.service import Service

    console = Console(stderr=True)
    if not console.is_terminal:
        return []
    total = count()

    @asynccontextmanager
    async def show(service: Service) -> AsyncIterator[None]:
        columns = (
            TextColumn("replaying"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
        )
        with Progress(*columns, console=console) as bar:
            task = bar.add_task("replay", total=total)

            async def poll() -> None:
                while True:
                    bar.update(task, completed=service.published_by_feeds())
                    await anyio.sleep(PROGRESS_SECONDS)

            async with anyio.create_task_group() as tg:
                tg.start_soon(poll)
                try:
                    yield
                finally:
                    tg.cancel_scope.cancel()
            bar.update(task, completed=service.published_by_feeds())

    return [show]


def _data_files(specs: tuple[str, ...]) -> list[DataFile]:
    """``FILE[=SYMBOL[:TIMEFRAME]]`` (FILE: a path or a quoted pattern) as a backtest's
    data files."""
    from daemon.backtest.run import DataFile

    return [DataFile(path=p, symbol=s, timeframe=t) for p, s, t in data_specs(specs, "--data")]


def _pairs(items: tuple[str, ...], option: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        hook, sep, rev = item.partition("=")
        if not sep or not hook or not rev:
            raise click.BadParameter(f"{item!r}: expected HOOK=HASH", param_hint=option)
        out[hook] = rev
    return out


def _label(agent_dir: Path, revisions: dict[str, str]) -> str:
    pinned = ", ".join(f"{h}@{r}" for h, r in sorted(revisions.items()))
    return f"{agent_dir}" + (f" with {pinned}" if pinned else "")
