"""The offline demo: the real daemon on a replay of a generated (synthetic) dataset.

No network: a seeded generator writes a labelled-synthetic candle CSV, the
replay feed publishes it through the real bus, state cache and recorder, and a
printer consumer shows each closed candle with its indicators. A summary
follows at the end. Everything the demo writes stays under ``--dir``.
"""

from __future__ import annotations

import os
import resource
import shlex
import shutil
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from rich.console import Console
from rich.text import Text

from daemon.app import run_daemon
from daemon.audit.reader import Follower, decision_of, iter_records
from daemon.audit.render import render
from daemon.bus import Subscription
from daemon.config import Config, CopytradeSection, DaemonSection, FeedsSection, HooksSection
from daemon.errors import ConfigError
from daemon.events import MARKET_CANDLE_CLOSED
from daemon.scratchdir import Scratch
from daemon.state import StateCache
from daemon.status import BusStatus, render_accounts
from daemon.trading.paper_store import PaperStore
from feeds.config import ReplaySection
from feeds.synthetic import generate_candles

DEMO_SYMBOL = "BTC-USD"
DEMO_TIMEFRAME = "1m"
DATA_FILE = f"synthetic_{DEMO_SYMBOL}_{DEMO_TIMEFRAME}.csv"
REPLACED = ("state", "copytrade-agents")  # in --dir, by each demo
DEMO_DIR = Scratch(
    option="--dir",
    replaced=REPLACED,
    marker=".marketwake-demo",
    required=DATA_FILE,
    known=frozenset({*REPLACED, DATA_FILE, "recording.jsonl"}),
)


@dataclass
class DemoOptions:
    directory: Path
    candles: int = 720
    speed: float = 2400.0
    seed: int = 7
    quiet: bool = False
    agents_dir: Path = Path("agents")
    # A leader agent trades the data; agents/follower mirrors it at half size.
    copytrade: bool = False


# The copy-trade demo's leader: long above EMA20, flat again below it.
LEADER_HOOK = """
def evaluate(event, state):
    symbol, close = event["symbol"], event["payload"]["close"]
    tf = event.get("timeframe") or "1m"
    ema = state["indicators"].get(symbol, {}).get(tf, {}).get("ema20")
    if ema is None:
        return {"decision": "IGNORE", "reason": "warming up"}
    held = symbol in state.get("positions", {})
    if not held and close > ema * 1.002:
        return {"decision": "TRADE_INTENT", "reason": "close above EMA20",
                "intent": {"action": "PLACE_MARKET_ORDER", "symbol": symbol, "side": "buy",
                           "volume": 0.01, "stopLoss": round(close * 0.98, 2),
                           "takeProfit": round(close * 1.03, 2)}}
    if held and close < ema * 0.998:
        return {"decision": "TRADE_INTENT", "reason": "close below EMA20",
                "intent": {"action": "CLOSE_POSITION", "symbol": symbol}}
    return {"decision": "IGNORE", "reason": "no change"}
"""


def copytrade_agents(opts: DemoOptions) -> Path:
    """A scratch agents dir under the demo dir: the leader, and the shipped follower
    enabled (``--agents`` must hold ``follower``)."""
    shipped = opts.agents_dir / "follower"
    if not shipped.is_dir():
        raise ConfigError(f"demo --copytrade: no {shipped} to copy (run it from the checkout)")
    root = opts.directory / "copytrade-agents"
    shutil.rmtree(root, ignore_errors=True)
    (root / "leader" / "hooks").mkdir(parents=True)
    (root / "leader" / "agent.toml").write_text(
        'topics = ["market.candle.closed"]\nstate_candles = 0\n'
    )
    (root / "leader" / "hooks" / "autotrade_ema_trend.py").write_text(LEADER_HOOK)
    shutil.copytree(shipped, root / "follower")
    toml = root / "follower" / "agent.toml"
    toml.write_text(toml.read_text().replace("enabled = false", "enabled = true"))
    return root


def self_command() -> str:
    """How the user's shell runs this marketwake again: ``marketwake`` when that is the
    one on PATH, else the venv's script (relative to the working directory when
    under it), else ``python -m daemon.cli``."""
    script = Path(sys.executable).parent / "marketwake"
    on_path = shutil.which("marketwake")
    if on_path and script.exists() and os.path.samefile(on_path, script):
        return "marketwake"
    if script.exists():
        absolute = Path(os.path.abspath(script))
        try:
            return str(absolute.relative_to(Path.cwd()))
        except ValueError:
            return str(absolute)
    return f"{sys.executable} -m daemon.cli"


# What the live stream shows from the audit log (the bus carries candles and orders).
_STREAMED_DECISIONS = frozenset({"WAKE", "ALERT", "TRADE_INTENT", "ERROR"})


def _streamed(rec: dict[str, Any]) -> bool:
    """Acted-on decisions and finished runs; suppressed ones go to the summary."""
    if rec.get("type") == "hook":
        return decision_of(rec) in _STREAMED_DECISIONS and rec.get("suppressedBy") == "none"
    return rec.get("type") == "run" and rec.get("status") != "started"


@dataclass
class Printer:
    """A bus consumer that prints closed candles as readable lines, with the hooks'
    decisions and the agent's runs as the audit log records them."""

    console: Console
    quiet: bool
    audit_dir: Path | None = None
    topics: Counter[str] = field(default_factory=Counter)
    state: StateCache = field(default_factory=StateCache)
    last_close: float | None = None
    _follower: Follower | None = None

    def print_audit(self) -> None:
        """Print what the audit log gained since the last call."""
        if self.quiet or self.audit_dir is None:
            return
        if self._follower is None:
            self._follower = Follower(self.audit_dir)
        for rec in self._follower.poll():
            if _streamed(rec):
                line = Text("  ")
                line.append_text(render(rec))
                self.console.print(line, soft_wrap=True)

    async def __call__(self, sub: Subscription) -> None:
        async for event in sub:
            self.topics[event.topic] += 1
            self.state.apply(event)
            if self.quiet:
                continue
            if event.topic == MARKET_CANDLE_CLOSED:
                self.print_audit()
                self._print_candle(event.ts, event.symbol or "?", event.payload)
            elif event.topic.startswith("account."):
                p = event.payload
                self.console.print(
                    f"[bold yellow]  {event.topic}[/] {event.symbol} "
                    + " ".join(
                        f"{k}={p[k]}" for k in ("side", "volume", "status", "price") if k in p
                    ),
                    soft_wrap=True,
                )

    def _print_candle(self, ts: str, symbol: str, p: dict[str, Any]) -> None:
        close = float(p["close"])
        change = 0.0 if self.last_close is None else (close / self.last_close - 1) * 100
        self.last_close = close
        colour = "green" if close >= float(p["open"]) else "red"
        ind = self.state.export(candles=0)["indicators"].get(symbol, {}).get(DEMO_TIMEFRAME, {})
        rsi = ind.get("rsi14")
        ema = ind.get("ema20")
        extras = []
        if ema is not None:
            extras.append(f"EMA20 {ema:,.1f}")
        if rsi is not None:
            extras.append(f"RSI14 {rsi:5.1f}")
        self.console.print(
            f"[dim]{ts[:16].replace('T', ' ')}[/] {symbol} {DEMO_TIMEFRAME} "
            f"[{colour}]close {close:>11,.2f} {change:+6.2f}%[/] "
            f"vol {float(p['volume']):8.2f}  " + "  ".join(extras),
            soft_wrap=True,
        )


def demo_config(opts: DemoOptions, csv_path: Path) -> Config:
    """An embedded config: replay of the synthetic CSV, the example agents (when the
    agents directory exists: run elsewhere, the demo shows the feed alone), state
    under the demo dir."""
    agents = opts.directory / "copytrade-agents" if opts.copytrade else opts.agents_dir
    return Config(
        hooks=HooksSection(agents_dir=str(agents), enabled=agents.is_dir()),
        copytrade=CopytradeSection(leader_agents=["leader"] if opts.copytrade else []),
        daemon=msgspec.convert(
            {"state_dir": str(opts.directory / "state"), "status_interval_seconds": 5.0},
            DaemonSection,
        ),
        feeds=FeedsSection(
            replay=ReplaySection(
                enabled=True,
                path=str(csv_path),
                format="csv",
                symbol=DEMO_SYMBOL,
                timeframe=DEMO_TIMEFRAME,
                speed=opts.speed,
                source="synthetic",
            )
        ),
    )


def run_demo(opts: DemoOptions, console: Console | None = None) -> int:
    """Generate data, run the daemon on it, print a summary. Returns an exit code."""
    console = console or Console()
    DEMO_DIR.refuse_inside(opts.directory, [("--agents", opts.agents_dir)])
    with DEMO_DIR.claim(opts.directory):  # held for the run: a second demo is refused
        return _run_demo(opts, console)


def _run_demo(opts: DemoOptions, console: Console) -> int:
    shutil.rmtree(opts.directory / "state", ignore_errors=True)  # every demo starts fresh
    csv_path = opts.directory / DATA_FILE
    generate_candles(csv_path, seed=opts.seed, n=opts.candles, timeframe=DEMO_TIMEFRAME)
    record_path = opts.directory / "recording.jsonl"
    record_path.unlink(missing_ok=True)
    pace = f"at {opts.speed:g}x" if opts.speed else "as fast as possible"
    console.print(
        f"[bold]marketwake demo[/] - replaying {opts.candles} SYNTHETIC {DEMO_TIMEFRAME} "
        f"candles (seed {opts.seed}) {pace}; no network used"
    )
    if opts.copytrade:
        copytrade_agents(opts)
        console.print(
            "copy trading: agent 'leader' trades, agent 'follower' mirrors it at half size"
        )
    elif not opts.agents_dir.is_dir():
        console.print(
            f"[yellow]no agents directory at {opts.agents_dir}: running without hooks "
            "(--agents DIR names one; the repository's agents/ holds the example)[/]"
        )
    audit_dir = opts.directory / "state" / "audit"
    printer = Printer(console, opts.quiet, audit_dir)
    started = time.perf_counter()
    status = run_daemon(
        demo_config(opts, csv_path), record_path=record_path, consumers=[("printer", printer)]
    )
    elapsed = time.perf_counter() - started
    printer.print_audit()  # the last flush
    _summary(console, printer, status.bus, elapsed, record_path)
    if not opts.copytrade:
        console.rule("the paper account (as marketwake status shows it)")
        lines = render_accounts(status.accounts)
        if not lines:
            console.print("  none: no agent traded (with no hooks, nothing proposes a trade)")
        for line in lines:
            console.print(f"  {line}", soft_wrap=True, markup=False)
    _audit_summary(console, opts.directory / "state" / "audit")
    if opts.copytrade:
        _accounts_summary(console, opts.directory / "state")
    return 0


def _accounts_summary(console: Console, state_dir: Path) -> None:
    """The leader's and the follower's paper accounts side by side."""
    store = PaperStore(state_dir / "paper.sqlite3")
    try:
        positions = store.positions()
        console.rule("copy trading: the two accounts")
        console.print(f"  {'':<22} {'leader':>12} {'follower':>12}")
        rows: dict[str, list[str]] = {"fills": [], "bought": [], "realized PnL": [], "open": []}
        for account in ("leader", "follower"):
            fills = store.fills(account)
            rows["fills"].append(str(len(fills)))
            rows["bought"].append(f"{sum(f.qty for f in fills if f.qty > 0):g}")
            rows["realized PnL"].append(f"{sum(f.realized - f.fee for f in fills):,.2f}")
            held = positions.get(account, {}).get(DEMO_SYMBOL)
            rows["open"].append(f"{held.quantity:g}" if held else "flat")
        for label, (lead, follow) in rows.items():
            console.print(f"  {label:<22} {lead:>12} {follow:>12}")
    finally:
        store.close()


def _audit_summary(console: Console, audit_dir: Path) -> None:
    """What the hooks decided and what came of it, read back from the audit log."""
    counts: Counter[str] = Counter()
    last_wake = None
    for rec in iter_records(audit_dir):
        kind = rec.get("type")
        if kind == "hook":
            decision = rec.get("decision") or "ERROR"
            by = rec.get("suppressedBy")
            counts[f"hook {decision}" + (f" (suppressed: {by})" if by != "none" else "")] += 1
            if decision == "WAKE" and (by == "none" or last_wake is None):
                last_wake = rec.get("traceId")  # prefer a wake that was acted on
        elif kind == "wake":
            counts[f"wake {rec.get('outcome')}"] += 1
        elif kind == "run":
            counts[f"run {rec.get('status')}"] += 1
        elif kind == "risk":
            counts["risk " + ("approved" if rec.get("approved") else "rejected")] += 1
        elif kind == "order":
            counts[f"order {rec.get('status')}"] += 1
    console.rule("hooks (from the audit log)")
    if not counts:
        console.print("  none: no hook was evaluated (no agents directory, or no enabled agent)")
    for key, n in sorted(counts.items()):
        console.print(f"  {key:<40} {n:>7}")
    for line in wake_story(counts):
        console.print(f"  {line}", soft_wrap=True, markup=False)
    mw, state = self_command(), shlex.quote(str(audit_dir.parent))
    console.print(f"  tail it:   {mw} audit tail --state-dir {state}", soft_wrap=True)
    console.print(f"  status:    {mw} status --state-dir {state}", soft_wrap=True)
    if last_wake:
        console.print(f"  ask why:   {mw} why {last_wake} --state-dir {state}", soft_wrap=True)


_SUPPRESSION = {
    "budget": "[wake] max_runs_per_hour was used up",
    "cooldown": "inside cooldown_after_run_seconds after a run",
    "dedupe": "the hook's dedupeKey was seen before",
    "cost": "[wake] max_cost_per_day was reached",
    "paused": "the hook or agent was paused",
}


def wake_story(counts: Counter[str]) -> list[str]:
    """Why N WAKE decisions became M runs, from the summary's counters."""
    decided = sum(n for k, n in counts.items() if k.startswith("hook WAKE"))
    if not decided:
        return []
    runs = counts["run started"]
    lines = [f"{decided} WAKE decisions -> {runs} agent runs:"]
    for key, n in sorted(counts.items()):
        if key.startswith("hook WAKE (suppressed: "):
            reason = key.removeprefix("hook WAKE (suppressed: ").rstrip(")")
            lines.append(f"  {n} suppressed: {_SUPPRESSION.get(reason, reason)}")
    merged = counts["wake queued"] + counts["wake woke"] - runs
    if merged > 0:
        lines.append(f"  {merged} merged into a run already pending (collect mode)")
    return lines


def _summary(
    console: Console, printer: Printer, bus: BusStatus, elapsed: float, record: Path
) -> None:
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    ind = printer.state.export(candles=0)["indicators"].get(DEMO_SYMBOL, {}).get(DEMO_TIMEFRAME)
    console.rule("summary")
    width = max(map(len, printer.topics), default=0)  # (marketplace.strategy.updated)
    for topic, n in sorted(printer.topics.items()):
        console.print(f"  {topic:<{width}} {n:>7}")
    console.print(
        f"  bus: published {bus.published}, delivered {bus.delivered}, coalesced {bus.coalesced}"
    )
    console.print(f"  wall time {elapsed:.2f}s, peak RSS {rss_mb:.0f} MiB")
    if ind:
        shown = {k: v for k, v in ind.items() if isinstance(v, float)}
        text = ", ".join(f"{k} {v:,.2f}" for k, v in shown.items())
        console.print(f"  last indicators: {text}", soft_wrap=True)
    console.print(
        f"  recording: {record} (replay it with feeds.replay, format jsonl)", soft_wrap=True
    )
