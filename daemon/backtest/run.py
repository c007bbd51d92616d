"""``marketwake backtest``: one agent through the real pipeline over a data file.

The agent directory is copied under ``--out`` (the report then describes the
exact files that ran), and the daemon runs there on its own state dir: the
replay feed, the bus, the agent's sandboxed hooks, the wake scheduler and the
paper broker, all on event time (the same data gives the same report at any
speed). Nothing of the live daemon's state is read or written. Wakes are
counted, not run, unless ``run_llm`` is set. The report is folded from the
run's audit rows and paper fills afterwards.
"""

from __future__ import annotations

import heapq
import os
import shutil
import stat
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import msgspec

from daemon.agents.revisions import RevisionStore
from daemon.agents.store import HookStore
from daemon.agents.workspace import AGENT_FILE, load_agent_config
from daemon.app import run_daemon
from daemon.audit.reader import iter_lines
from daemon.backtest.html import Envelope, Series, render_comparison_html, render_html
from daemon.backtest.report import (
    RUNS_FAILED,
    BrokenHook,
    Comparison,
    CostModel,
    MarkToMarket,
    Report,
    Tally,
    WorkingOrder,
    compare,
    counted,
    figure,
    figures,
    priced_by_runs,
    timer_baseline,
    trades_of,
)
from daemon.config import (
    Config,
    DaemonSection,
    FeedsSection,
    HooksSection,
    StateSection,
    TradingSection,
    unexpanded,
)
from daemon.errors import ConfigError, ReplayError
from daemon.events import TIMEFRAMES, iso_ms
from daemon.printable import visible
from daemon.rag.config import RagConfig
from daemon.scratchdir import Scratch
from daemon.service import Component
from daemon.status import Status
from daemon.tools.snapshot import CANDLES as SNAPSHOT_CANDLES
from daemon.trading.matching import FillCosts
from daemon.trading.paper_store import FillRow, PaperStore
from feeds.config import ReplayFileSection, ReplaySection
from feeds.replay import ReplayFeed, until_bad
from hooks_runtime.config import SandboxConfig
from hooks_runtime.hookfile import HOOK_NAME

REPLACED = ("agents", "state")  # in --out, by each run
# --run-llm: once the first this many runs all failed, the backtest stops (a model
# not running would fail every run, each after the runner's retries or deadline).
RUN_FUSE = 3
OUT = Scratch(
    option="--out",
    replaced=REPLACED,
    marker=".marketwake-backtest",
    required="report.json",
    known=frozenset({*REPLACED, "report.json", "report.html", "a", "b", "synthetic-5m.csv"}),
)


class DataFile(msgspec.Struct, frozen=True, kw_only=True):
    """One more data file, merged with the first by event time; a CSV's symbol and
    timeframe ("" = the options')."""

    path: Path
    symbol: str = ""
    timeframe: str = ""


class BacktestOptions(msgspec.Struct, frozen=True, kw_only=True):
    """What to run, on what, and how to price it."""

    agent_dir: Path
    data: Path
    out: Path
    symbol: str = "BTC-USD"
    timeframe: str = "5m"
    baseline_minutes: float = 3.0
    cost: CostModel = msgspec.field(default_factory=CostModel)
    run_llm: bool = False
    # Only events with from_ms <= time < to_ms (0: no bound).
    from_ms: int = 0
    to_ms: int = 0
    # hook id -> a kept revision (hash or unique prefix) to run instead of the file.
    revisions: dict[str, str] = msgspec.field(default_factory=dict)
    # The daemon state dir whose revisions/ keeps the sources.
    state_dir: Path = Path("state")
    costs: FillCosts = msgspec.field(default_factory=FillCosts)
    more_data: list[DataFile] = msgspec.field(default_factory=list)
    # With run_llm, what query_similar_patterns reads instead of the exchange and the
    # default store (None: those).
    funding_file: Path | None = None
    open_interest_file: Path | None = None
    rag_store: Path | None = None
    # The sandbox's wall-clock budget per hook evaluation (the daemon's default).
    hook_timeout_ms: float = SandboxConfig().timeout_ms


def replay_section(opts: BacktestOptions) -> ReplaySection:
    """The replay the backtest runs: the data file, flat out, within from/to."""
    return ReplaySection(
        enabled=True,
        path=str(opts.data.resolve()),
        symbol=opts.symbol,
        timeframe=opts.timeframe,
        speed=0.0,
        from_ms=opts.from_ms,
        to_ms=opts.to_ms,
        files=[
            ReplayFileSection(path=str(f.path.resolve()), symbol=f.symbol, timeframe=f.timeframe)
            for f in opts.more_data
        ],
    )


def rag_config(opts: BacktestOptions) -> RagConfig:
    """The pattern tool's settings: its store and its funding / open-interest files."""
    default = RagConfig()
    exchange = msgspec.structs.replace(
        default.exchange,
        funding_file=str(opts.funding_file.resolve()) if opts.funding_file else "",
        open_interest_file=(
            str(opts.open_interest_file.resolve()) if opts.open_interest_file else ""
        ),
    )
    # A daemon's store at its default state dir (./state/rag), unless one is named.
    where = opts.rag_store.resolve() if opts.rag_store is not None else Path("state", "rag")
    store = msgspec.structs.replace(default.store, path=str(where))
    return msgspec.structs.replace(default, exchange=exchange, store=store)


def held_candles(opts: BacktestOptions) -> int:
    """Candles the state caches keep per series. With LLM runs, enough of the finest
    timeframe replayed for the snapshot tool to build 50 whole 4 h candles from it
    (docs/tools.md, "On event time"); the daemon's default otherwise."""
    default = StateSection().max_candles
    if not opts.run_llm:
        return default
    steps = [TIMEFRAMES[f.timeframe or opts.timeframe] for f in opts.more_data]
    finest = min([TIMEFRAMES[opts.timeframe], *steps])
    return max(default, (SNAPSHOT_CANDLES + 1) * TIMEFRAMES["4h"] // finest)


def _special_files(directory: str, names: list[str]) -> set[str]:
    """Entries that are neither directories, regular files nor links."""
    special = set()
    for name in names:
        mode = os.lstat(os.path.join(directory, name)).st_mode
        if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
            special.add(name)
    return special


def check(opts: BacktestOptions) -> None:
    """ConfigError unless the agent, the data file and ``out`` can be used (before
    anything reads the data: a FIFO there would block)."""
    agent_dir = opts.agent_dir.resolve()
    if not (agent_dir / "hooks").is_dir():
        raise ConfigError(f"{opts.agent_dir}: not an agent directory (no hooks/ inside)")
    named: set[Path] = set()
    for data in (opts.data, *(f.path for f in opts.more_data)):
        if not data.is_file():
            what = "is not a regular file" if data.exists() else "does not exist"
            raise ConfigError(f"{data}: the data file {what}")
        if data.resolve() in named:  # every event twice, each evaluated once
            raise ConfigError(f"--data {data} is given twice")
        named.add(data.resolve())
    out = opts.out.resolve()
    if out == agent_dir or agent_dir in out.parents:
        raise ConfigError(f"--out {opts.out} must not be inside the agent directory")
    OUT.check(opts.out)
    inputs = [("--agent", agent_dir)]
    inputs += [("--data", f) for f in (opts.data, *(m.path for m in opts.more_data))]
    if opts.revisions:  # read (after the replacing) only for them
        inputs.append(("--state-dir", opts.state_dir))
    OUT.refuse_inside(opts.out, inputs)
    if opts.from_ms and opts.to_ms and opts.from_ms >= opts.to_ms:
        raise ConfigError("--from must be before --to: nothing lies between them")
    if opts.run_llm:
        runner = load_agent_config(agent_dir / AGENT_FILE).wake.runner
        missing = unexpanded(runner.api_key.reveal()) if runner.kind == "llm" else []
        if missing:  # every run would fail the same way, and the report look fine
            raise ConfigError(
                f"--run-llm: {agent_dir.name}'s [wake.runner] api_key reads ${{{missing[0]}}}, "
                "which is not set in the environment (export it, or point base_url at a "
                "local model)"
            )


def prepare(opts: BacktestOptions) -> Config:
    """A fresh ``out`` with a copy of the agent, and the daemon config that runs it."""
    check(opts)
    agent_dir, out = opts.agent_dir.resolve(), opts.out.resolve()
    for stale in REPLACED:
        shutil.rmtree(out / stale, ignore_errors=True)
    copy = out / "agents" / agent_dir.name
    # Links stay links (the workspace loader refuses them, as live); FIFOs, sockets
    # and devices are not copied (reading one could block or never end).
    shutil.copytree(agent_dir, copy, symlinks=True, ignore=_special_files)
    kept = RevisionStore(opts.state_dir / "revisions")
    for hook, wanted in opts.revisions.items():
        if not HOOK_NAME.match(f"{hook}.py"):
            raise ConfigError(f"--revision {hook}={wanted}: {hook!r} is not a hook name")
        _, source = kept.get(wanted)
        (copy / "hooks" / f"{hook}.py").write_text(source, encoding="utf-8")
    return Config(
        daemon=DaemonSection(
            state_dir=str(out / "state"),
            clock="event",
            log_format="console",
            log_level="error",
            durable=False,  # a scratch dir: no fsync per paper order
        ),
        # The agents are loaded once; without LLM runs no tool reads the daemon's own
        # market state (each agent keeps its own): no account is without an agent,
        # and each candle is one indicator update and one broker delivery lighter.
        hooks=HooksSection(
            agents_dir=str(out / "agents"),
            run_agents=opts.run_llm,
            reload_seconds=0,
            include_disabled=True,  # the agent named, even if not enabled live yet
            stop_after_failed_runs=RUN_FUSE if opts.run_llm else 0,
            sandbox=SandboxConfig(timeout_ms=opts.hook_timeout_ms),
        ),
        state=StateSection(shared=opts.run_llm, max_candles=held_candles(opts)),
        rag=rag_config(opts),
        feeds=FeedsSection(replay=replay_section(opts)),
        trading=TradingSection(
            paper_maker_fee_bps=opts.costs.maker_fee_bps,
            paper_taker_fee_bps=opts.costs.taker_fee_bps,
            paper_slippage_bps=opts.costs.slippage_bps,
        ),
    )


def run_backtest(opts: BacktestOptions, components: Sequence[Component] = ()) -> Report:
    """Run the agent over the data and write ``report.json`` and ``report.html`` into
    ``opts.out``, which it holds for the run (see :data:`OUT`); ``components`` run
    beside the daemon's own (a progress bar)."""
    return _backtest(opts, components)[0]


def _backtest(opts: BacktestOptions, components: Sequence[Component]) -> tuple[Report, Series]:
    """:func:`run_backtest`, with what its plots drew."""
    with OUT.claim(opts.out.resolve()):
        return _run(opts, components)


def _run(opts: BacktestOptions, components: Sequence[Component]) -> tuple[Report, Series]:
    config = prepare(opts)
    started = time.perf_counter()
    status = run_daemon(config, components=components, agents="all")  # the one it runs
    seconds = time.perf_counter() - started
    out = opts.out.resolve()
    agent = opts.agent_dir.resolve().name
    tally = Tally(agent).read(iter_lines(out / "state" / "audit"))
    period = tally.period()
    first, last = period or (0, -1)  # none: no timer period
    # Runs that ran a model (--run-llm) price the wakes and the timer baseline at what
    # they really cost, whatever the options' estimate (or --cost-from) said.
    model = priced_by_runs(opts.cost, tally.llm_runs, "this backtest")
    baseline = timer_baseline(first, last, opts.baseline_minutes, model)
    cost = model.cost(tally.runs)
    account = load_agent_config(out / "agents" / agent / AGENT_FILE).account or agent
    store = PaperStore(out / "state" / "paper.sqlite3")
    try:
        fills = store.fills(account)
        working = [
            WorkingOrder(
                symbol=o.symbol,
                side=o.side,
                order_type=o.order_type,
                volume=o.volume,
                price=o.limit_price or o.stop_price,
                since=iso_ms(o.created_ms),
            )
            for o in sorted(store.working_orders(), key=lambda o: o.created_ms)
            if o.account_id == account and o.role == "entry"
        ]
    finally:
        store.close()
    fuse = config.hooks.stop_after_failed_runs
    if fuse and tally.runs == tally.runs_failed == fuse:  # the scheduler stopped the replay
        stopped_by = (
            f"{RUNS_FAILED}the first {fuse} agent runs all failed, the first with "
            f"{tally.first_run_error}"
        )
    else:
        stopped_by = _stopped_by(status)
    # The plots and the marked equity cover what the figures do (an interrupted run:
    # up to its last event).
    wakes, alerts = tally.markers("WAKE"), tally.markers("ALERT")
    plotted = _symbols(tally, opts.symbol)
    drawn = _replayed(
        config, [*plotted, *{f.symbol: None for f in fills}], None if not stopped_by else last,
        {s: {t for t, sym in (*wakes, *alerts) if sym == s} for s in plotted}, fills,
    )  # fmt: skip
    trades = msgspec.structs.replace(
        trades_of(fills, first, last),
        max_drawdown_marked=round(drawn.marked.max_drawdown, 8),
        unrealized_at_end=round(drawn.marked.unrealized(), 8),
    )
    hook_store = HookStore(out / "state" / "hooks.sqlite3")
    try:
        broken = [
            BrokenHook(hook=h, revision=r, error=e) for h, r, e in hook_store.compile_errors(agent)
        ]
    finally:
        hook_store.close()
    events = sum(f.stats.get("published", 0) for f in status.feeds)
    left_out = sum(
        f.stats.get(k, 0)
        for f in status.feeds
        for k in ("account_events_left_out", "other_messages_left_out")
    )
    duplicates = sum(f.stats.get("duplicate_rows", 0) for f in status.feeds)
    delivery = status.components.get("delivery")
    repeated = delivery.get("skipped", 0) if isinstance(delivery, dict) else 0
    report = Report(
        agent=agent,
        data=data_name([opts.data.name, *(f.path.name for f in opts.more_data)]),
        events=events,
        first_event=iso_ms(first) if period else "",
        last_event=iso_ms(last) if period else "",
        hooks=tally.hooks(),
        wakes=tally.wakes,
        runs=tally.runs,
        runs_failed=tally.runs_failed,
        first_run_error=tally.first_run_error[:300],
        intents_approved=tally.approved,
        intents_rejected=tally.rejected,
        rejected_by=tally.rejected_by(),
        wakes_suppressed=tally.wakes_suppressed(),
        wakes_merged=tally.merged,
        cost_model=model,
        cost=cost,
        baseline=baseline,
        cost_ratio=round(cost / baseline.cost, 6) if baseline.cost else None,
        trades=trades,
        fill_costs=opts.costs,
        broken=broken,
        working_at_end=working,
        seconds=round(seconds, 3),
        events_per_second=round(events / seconds, 1) if seconds else 0.0,
        complete=not stopped_by,
        stopped_by=stopped_by,
        left_out=left_out,
        duplicate_rows=duplicates,
        repeated_events=repeated,
        data_span=_data_span(opts) if not events and (opts.from_ms or opts.to_ms) else "",
    )
    _write_json(out / "report.json", report)
    series = Series(
        prices={s: drawn.prices[s].points() for s in plotted},
        marked=drawn.at,
        wakes=wakes,
        alerts=alerts,
        fills=fills,
        equity=drawn.equity.points(),
    )
    (out / "report.html").write_text(render_html(report, series), encoding="utf-8")
    return report, series


def _stopped_by(status: Status) -> str:
    """Why the replay ended before its data did, or before the agent evaluated all of
    it ("" when neither): a feed's error, else a signal (Ctrl-C once the data is read
    but not yet evaluated is one too)."""
    feeds = status.feeds
    if all(f.finished for f in feeds) and not status.interrupted:
        return ""
    errors = [f.error or f"{f.name} failed" for f in feeds if f.failed]
    return "; ".join(errors) or "signal"


def _data_span(opts: BacktestOptions) -> str:
    """The time of the data's first and last events, whatever ``--from`` / ``--to``
    say (read again: only when none fell within them), or "" when it has none."""
    section = msgspec.structs.replace(replay_section(opts), from_ms=0, to_ms=0)
    first = last = None
    try:
        for ts, _ in ReplayFeed(section).selected():
            first = ts if first is None else first
            last = ts
    except ReplayError:
        return ""  # a bad row: the run said so
    return f"{iso_ms(first)} .. {iso_ms(last)}" if first is not None and last is not None else ""


def data_name(names: list[str]) -> str:
    """The data files as the report names them: each of a few, the first and last of
    many (a year of Binance's monthly files)."""
    if len(names) <= 3:
        return " + ".join(names)
    return f"{names[0]} + ... + {names[-1]} ({len(names)} files)"


def count_events(opts: BacktestOptions) -> int:
    """How many events the replay will publish (for a progress bar)."""
    check(opts)
    return sum(1 for _ in until_bad(ReplayFeed(replay_section(opts)).selected()))


class _Replayed:
    """One pass over the replayed closes: each plotted symbol's price line (thinned
    as it is read), its price at its markers' times, and the equity marked to
    market at every close."""

    def __init__(self, fills: Sequence[FillRow], plotted: dict[str, set[int]]) -> None:
        self.prices = {symbol: Envelope() for symbol in plotted}
        self.at: dict[str, dict[int, float]] = {symbol: {} for symbol in plotted}
        self.marked = MarkToMarket(fills)
        self.equity = Envelope()
        self._times = plotted

    def close(self, ts_ms: int, symbol: str, price: float) -> None:
        self.equity.add((ts_ms, self.marked.close(ts_ms, symbol, price)))
        line = self.prices.get(symbol)
        if line is None:
            return
        line.add((ts_ms, price))
        if ts_ms in self._times[symbol]:
            self.at[symbol][ts_ms] = price


def _replayed(
    config: Config,
    symbols: list[str],
    until: int | None,
    times: dict[str, set[int]],
    fills: Sequence[FillRow],
) -> _Replayed:
    """The closes of ``symbols`` up to ``until`` (None: all), merged by time, through
    a :class:`_Replayed` (``times``: per plotted symbol, its markers' times). A replay
    that stopped (``until``) on data it could not read stops the drawing there too."""
    feed = ReplayFeed(config.feeds.replay)
    streams = [_tagged(feed, symbol) for symbol in dict.fromkeys(symbols)]
    drawn = _Replayed(fills, times)
    try:
        for t, symbol, close in heapq.merge(*streams):
            if until is not None and t > until:
                break
            drawn.close(t, symbol, close)
    except ReplayError:
        if until is None:
            raise  # read whole by the run, unreadable now: the report would not match
    return drawn


def _tagged(feed: ReplayFeed, symbol: str) -> Iterator[tuple[int, str, float]]:
    """``symbol``'s closes, each with its symbol (for merging several by time)."""
    for t, close in feed.closes(symbol):
        yield t, symbol, close


def _symbols(tally: Tally, first: str) -> list[str]:
    """The symbols to plot: those the hooks evaluated, in the order they first met
    them, ``first`` (the first data file's) ahead; ``first`` alone when none was."""
    seen = tally.symbols
    return sorted(seen, key=lambda s: s != first) if seen else [first]


def run_comparison(
    a: BacktestOptions,
    b: BacktestOptions,
    out: Path,
    components: Sequence[Component] = (),
    labels: tuple[str, str] = ("A", "B"),
) -> Comparison | Report:
    """Run ``a`` and ``b`` (into ``out``/a and ``out``/b) and write both, with their
    differences, to ``out``/report.json and side by side to ``out``/report.html
    (``labels`` name them there). A run stopped before the data's end (a signal)
    ends the comparison, B not started after an interrupted A: that run's report is
    returned, and is ``out``/report.json (its page is in its own directory)."""
    with OUT.claim(out.resolve()):
        first, drawn = _backtest(a, components)
        second, drawn_b = _backtest(b, components) if first.complete else (first, drawn)
        if not second.complete:
            _write_json(out / "report.json", second)
            (out / "report.html").unlink(missing_ok=True)  # an earlier run's, not this one
            return second
        result = compare(first, second)
        _write_json(out / "report.json", result)
        page = render_comparison_html(result, labels, (drawn, drawn_b))
        (out / "report.html").write_text(page, encoding="utf-8")
        return result


def _write_json(path: Path, report: Report | Comparison) -> None:
    path.write_bytes(msgspec.json.format(msgspec.json.encode(report)) + b"\n")


def render_comparison(result: Comparison, labels: tuple[str, str]) -> str:
    """Both summaries, then the differences as a table."""
    # (each summary's lines are shown safe already, and kept apart: not escaped again)
    labelled = [visible(f"A: {labels[0]}"), render(result.a), ""]
    labelled += [visible(f"B: {labels[1]}"), render(result.b), ""]
    rows = figures(result.a, result.b)
    width = max(map(len, rows)) + 2
    table = [f"  {'':<{width}}{'A':>14}{'B':>14}{'B - A':>14}"]
    for name, (va, vb) in rows.items():
        shown = (figure(name, va), figure(name, vb), figure(name, result.diff[name], "+"))
        table.append(f"  {name:<{width}}" + "".join(f"{x:>14}" for x in shown))
    return "\n".join([*labelled, *table])


def render(report: Report) -> str:
    """The terminal summary."""
    b, t = report.baseline, report.trades
    span = f", {report.first_event} .. {report.last_event}" if report.first_event else ""
    lines = [
        (
            f"backtest of {report.agent} on {report.data}: {report.events} events{span} "
            f"({report.seconds:.1f} s, {report.events_per_second:,.0f} events/s)"
        )
    ]
    note = report.incomplete()
    if note is not None:
        lines.append(f"  {note[0]}: {note[1]}")
    if report.left_out:
        lines.append(
            f"  {report.left_out} recorded lines left out: account events (this run's broker "
            "makes its own) or Coinbase messages with no ticks or candles"
        )
    if report.repeated_events:
        lines.append(
            f"  {counted(report.repeated_events, 'event')} came twice (the same event id: data "
            "files that overlap), evaluated once"
        )
    if report.duplicate_rows:
        lines.append(
            f"  {counted(report.duplicate_rows, 'duplicate row')} of the data skipped: the same "
            "candle as the row before, once is enough"
        )
    if not report.events and report.data_span:
        lines.append(
            f"  nothing was replayed: the data's events run {report.data_span}, "
            "none within --from/--to"
        )
    elif not report.events:
        lines.append("  nothing was replayed: the data has no events (within --from/--to)")
    elif not report.first_event:
        lines.append(
            "  no hook evaluated any event: compare the agent's topics and symbols "
            "(agent.toml) with the data's (--symbol, --timeframe)"
        )
    for h in report.hooks:
        decided = ", ".join(f"{k} {v}" for k, v in h.decisions.items()) or "none"
        held = ", ".join(f"{k} {v}" for k, v in h.suppressed.items())
        lines.append(
            f"  {h.hook} @{h.revision[:8]}: {counted(h.evaluations, 'evaluation')}: {decided}"
            + (f"; {h.failed()}" if h.errors else "")
            + (f"; {h.not_run()}" if h.skipped else "")
            + (f"; suppressed: {held}" if held else "")
        )
    for bad in report.broken:
        lines.append(f"  {bad.hook} @{bad.revision[:8]}: did not compile, never ran: {bad.error}")
    lines.append(
        f"  {counted(report.wakes, 'WAKE decision')} -> {counted(report.runs, 'agent run')}"
        + (f" ({report.wake_fates()})" if report.wake_fates() else "")
        + (
            f"; {report.runs_failed} of the runs failed or timed out (the first: "
            f"{report.first_run_error})"
            if report.runs_failed
            else ""
        )
    )
    ratio = f"{report.cost_ratio:.1%}" if report.cost_ratio is not None else "n/a"
    lines.append(
        f"  {report.cost_model.label} {report.cost:.2f} vs {b.cost:.2f} for a timer agent every "
        f"{b.minutes:g} min ({counted(b.runs, 'run')}): {ratio} of it ({report.cost_model.source})"
    )
    if verdicts := report.verdicts():
        lines.append(f"  risk: {verdicts}")
    lines.append(
        f"  trades: {counted(t.fills, 'fill')}, {t.closing_fills} closing, win rate {t.win_rate:.0%}, "
        f"realized PnL {t.realized_pnl:.2f}, max drawdown {t.max_drawdown:.2f} "
        f"({t.max_drawdown_marked:.2f} marked to market), exposure {t.exposure:.0%}, "
        f"fees {t.fees:.2f}"
        + (f", open at the end {t.unrealized_at_end:+.2f}" if t.unrealized_at_end else "")
    )
    if report.working_at_end:
        lines.append(f"  still working at the end: {report.still_working()}")
    if t.closing_fills:
        pf = f"{t.profit_factor:.2f}" if t.profit_factor is not None else "n/a (no loss)"
        lines.append(
            f"  closing fills: average win {t.avg_win:.2f}, average loss {t.avg_loss:.2f}, "
            f"largest loss {t.largest_loss:.2f}, profit factor {pf}"
        )
    c = report.fill_costs
    if c != FillCosts():
        lines.append(
            f"  simulated with fees {c.maker_fee_bps:g} bps maker, {c.taker_fee_bps:g} bps "
            f"taker, slippage {c.slippage_bps:g} bps on taker fills"
        )
    return "\n".join(map(visible, lines))  # hook errors are quoted
