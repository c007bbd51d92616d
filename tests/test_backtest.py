"""marketwake backtest: the real pipeline on event time, and its wake-cost report."""

from __future__ import annotations

import gzip
import json
import re
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import time
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path
from random import Random

import msgspec
import pytest
from click.testing import CliRunner

from daemon.audit.reader import iter_records
from daemon.backtest.html import Series, render_comparison_html
from daemon.backtest.report import (
    CostModel,
    Report,
    Tally,
    compare,
    timer_baseline,
    trades_of,
)
from daemon.backtest.run import (
    OUT,
    BacktestOptions,
    DataFile,
    data_name,
    render,
    run_backtest,
    run_comparison,
)
from daemon.cli.main import cli
from daemon.config import Config
from daemon.errors import ConfigError, StateDirInUse
from daemon.events import encode, iso_ms
from daemon.service import Component
from daemon.trading.paper_store import FillRow
from feeds.config import ReplaySection
from feeds.replay import ReplayFeed
from feeds.synthetic import generate_candles
from tests.binance import monthly_zips
from tests.stops import stop_when

WAKE_GREEN = """
def evaluate(event, state):
    c = event["payload"]
    if c["close"] > c["open"]:
        return {"decision": "WAKE", "reason": "green", "dedupeKey": "g:" + event["eventId"]}
    return {"decision": "IGNORE", "reason": "red"}
"""
BUY_TENTH = """
def evaluate(event, state):
    c = event["payload"]
    if int(c["closeTimeMs"] / 300000) % 10:
        return {"decision": "IGNORE", "reason": "not now"}
    side = "buy" if not state["positions"] else "sell"
    intent = {"action": "PLACE_MARKET_ORDER", "symbol": event["symbol"], "side": side,
              "volume": 0.001}
    if side == "buy":
        intent["stopLoss"] = c["close"] * 0.5
    return {"decision": "TRADE_INTENT", "reason": side, "dedupeKey": "t:" + event["eventId"],
            "intent": intent}
"""
TOML = "[wake]\nmax_runs_per_hour = 2\ncooldown_after_run_seconds = 0\ndebounce_seconds = 0\n"


def agent(root: Path) -> Path:
    hooks = root / "alpha" / "hooks"
    hooks.mkdir(parents=True)
    (root / "alpha" / "agent.toml").write_text(TOML)
    (hooks / "wake_green.py").write_text(WAKE_GREEN)
    (hooks / "autotrade_tenth.py").write_text(BUY_TENTH)
    return root / "alpha"


def test_same_data_same_report_and_the_counts_are_the_audits(tmp_path: Path) -> None:
    data = tmp_path / "c.csv"
    generate_candles(data, seed=3, n=600, timeframe="5m")
    opts = BacktestOptions(agent_dir=agent(tmp_path / "agents"), data=data, out=tmp_path / "out")
    first = run_backtest(opts)
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    rows = list(iter_records(tmp_path / "out" / "state" / "audit"))
    again = run_backtest(opts)  # --out is replaced: a fresh state, the same answers
    timings = {"seconds", "events_per_second"}
    assert {k: v for k, v in json.loads((tmp_path / "out" / "report.json").read_text()).items()
            if k not in timings} == {k: v for k, v in report.items() if k not in timings}  # fmt: skip
    assert again.hooks == first.hooks and again.trades == first.trades

    hooks = {h.hook: h for h in first.hooks}
    assert first.events == 600 and all(h.evaluations == 600 for h in hooks.values())
    wakes = sum(1 for r in rows if r["type"] == "hook" and r["decision"] == "WAKE")
    assert hooks["wake_green"].decisions["WAKE"] == first.wakes == wakes > 100
    assert first.runs == sum(1 for r in rows if r["type"] == "run" and r["status"] != "started")
    # 600 bars of 5 min = 50 hours at <= 2 runs an hour (the budget, on event time)
    assert 0 < first.runs <= 2 * 51 and first.wakes_suppressed.get("budget", 0) > 0
    # every WAKE ran, alone or merged into another's run, or was suppressed
    assert first.runs + first.wakes_merged + sum(first.wakes_suppressed.values()) == first.wakes
    assert first.baseline.runs == 599 * 5 // 3 + 1  # every 3 min from the first bar to the last
    assert first.cost == CostModel().cost(first.runs)
    assert first.cost_ratio == pytest.approx(first.cost / first.baseline.cost, abs=1e-6)
    trades = hooks["autotrade_tenth"].decisions["TRADE_INTENT"]
    assert first.trades.fills == trades and first.trades.closing_fills == trades // 2
    assert (first.intents_approved, first.intents_rejected) == (trades, 0)
    # the copy that ran is kept beside the report
    assert (tmp_path / "out" / "agents" / "alpha" / "hooks" / "wake_green.py").exists()


def test_intents_the_risk_engine_refused_are_counted_by_reason(tmp_path: Path) -> None:
    """Every other intent lacks its stop-loss: the report counts those rejections by
    the risk engine's code, beside the approved ones, as the audit recorded them."""
    data = tmp_path / "c.csv"
    generate_candles(data, seed=5, n=40, timeframe="5m")
    hooks = tmp_path / "agents" / "alpha" / "hooks"
    hooks.mkdir(parents=True)
    (hooks.parent / "agent.toml").write_text(TOML)
    (hooks / "autotrade_sloppy.py").write_text(
        "def evaluate(event, state):\n"
        "    c = event['payload']\n"
        "    intent = {'action': 'PLACE_MARKET_ORDER', 'symbol': event['symbol'],\n"
        "              'side': 'buy', 'volume': 0.0001}\n"
        "    if int(c['closeTimeMs'] / 300000) % 2:\n"
        "        intent['stopLoss'] = c['close'] * 0.5\n"
        "    return {'decision': 'TRADE_INTENT', 'reason': 'x', 'intent': intent}\n"
    )
    out = tmp_path / "out"
    report = run_backtest(BacktestOptions(agent_dir=hooks.parent, data=data, out=out))
    risk = [r for r in iter_records(out / "state" / "audit") if r["type"] == "risk"]
    refused = [r for r in risk if not r["approved"]]
    assert len(risk) == 40 and len(refused) == 20
    assert report.intents_approved == 20 == report.trades.fills
    assert report.intents_rejected == 20
    assert report.rejected_by == {"STOP_LOSS_REQUIRED": 20}
    assert "risk: 20 intents approved, 20 rejected (STOP_LOSS_REQUIRED 20)" in render(report)
    assert "STOP_LOSS_REQUIRED 20" in (out / "report.html").read_text()


def test_timer_baseline_and_cost_arithmetic() -> None:
    model = CostModel(tokens_in_per_run=1000, tokens_out_per_run=100,
                      price_input_per_mtok=3.0, price_output_per_mtok=15.0)  # fmt: skip
    assert model.cost(10) == pytest.approx(10 * (0.003 + 0.0015))
    hour = timer_baseline(0, 3_600_000, 3, model)
    assert (hour.runs, hour.cost) == (21, model.cost(21))  # at 0, 3, ..., 60 minutes
    assert timer_baseline(0, 179_999, 3, model).runs == 1
    assert timer_baseline(5, 0, 3, model).runs == 0


def test_an_empty_replay_and_a_silent_agent_say_so(tmp_path: Path) -> None:
    """No candles in the range: the summary says nothing was replayed and the timer
    agent is not charged a run. Candles the agent's hooks never evaluate (another
    symbol): the summary says where to look."""
    data = tmp_path / "c.csv"
    generate_candles(data, seed=3, n=50, timeframe="5m")
    alpha = agent(tmp_path / "agents")
    empty = run_backtest(
        BacktestOptions(agent_dir=alpha, data=data, out=tmp_path / "empty", to_ms=1)
    )
    assert (empty.events, empty.baseline.runs, empty.cost_ratio) == (0, 0, None)
    # It says when the data does run: a --from/--to that misses it is plain to see.
    first, last = (iso_ms(t + 300_000) for t in _open_times(data)[::49])
    assert empty.data_span == f"{first} .. {last}"
    assert f"nothing was replayed: the data's events run {first} .. {last}" in render(empty)
    assert "no hook evaluated" not in render(empty)  # one reason, the first
    assert "0 events (" in render(empty).splitlines()[0]
    (alpha / "agent.toml").write_text('symbols = ["ETH-USD"]\n' + TOML)
    silent = run_backtest(BacktestOptions(agent_dir=alpha, data=data, out=tmp_path / "silent"))
    assert silent.events == 50 and silent.baseline.runs == 0
    text = render(silent)
    assert "no hook evaluated any event" in text and " .. " not in text.splitlines()[0]


def _open_times(csv: Path) -> list[int]:
    return [int(line.split(",", 1)[0]) for line in csv.read_text().splitlines()[1:]]


def test_trades_from_the_fills() -> None:
    # (ts, price, signed qty, realized): open, close +5, open, close -3, ..., then one
    # left open at the end
    pnl = [0, 5, 0, -3, 0, -4, 0, 10, 0]
    fills = [fill(i * 10, 1.0 if i % 2 == 0 else -1.0, p) for i, p in enumerate(pnl)]
    t = trades_of(fills, 0, 100)
    assert (t.fills, t.closing_fills, t.wins) == (9, 4, 2)
    assert (t.realized_pnl, t.max_drawdown, t.win_rate) == (8, 7, 0.5)
    assert t.exposure == (4 * 10 + 20) / 100  # four 10 ms trades, then open from 80 to 100
    assert t.fees == 0.0
    # closes +5, -3, -4, +10: wins average 7.5, losses -3.5, gross 15 over 7
    assert (t.avg_win, t.avg_loss, t.largest_loss) == (7.5, -3.5, -4.0)
    assert t.profit_factor == round(15 / 7, 4)
    assert trades_of([]).win_rate == 0.0 and trades_of([]).exposure == 0.0
    assert trades_of(fills[:2]).profit_factor is None  # one win, no loss to divide by
    # a fee of 1 a fill: PnL net of 9, the +5 close still a win, drawdown deeper by fees
    paid = trades_of([msgspec.structs.replace(f, fee=1.0) for f in fills], 0, 100)
    assert (paid.fees, paid.realized_pnl, paid.wins) == (9.0, -1.0, 2)
    assert paid.max_drawdown == 12.0  # from +3 (after the +5 close) down to -9 (before +10)
    # each close net of its own fee: +4, -4, -5, +9
    assert (paid.avg_win, paid.avg_loss, paid.profit_factor) == (6.5, -4.5, round(13 / 9, 4))


def fill(ts: int, qty: float, realized: float = 0.0, symbol: str = "BTC-USD") -> FillRow:
    return FillRow(ts_ms=ts, symbol=symbol, price=100.0, qty=qty, realized=realized, fee=0.0)


def test_equity_marked_to_market_sees_what_the_realized_curve_hides() -> None:
    """A long that falls 10 under water and recovers before it closes: the realized
    curve drops by its fee only, the marked one by 10.5. Fills are taken before a
    close of their time, a fill between closes at the next close of any symbol, and
    each symbol's position at its own last close."""
    from daemon.backtest.report import MarkToMarket

    fills = [
        FillRow(ts_ms=1, symbol="BTC", price=100.0, qty=1.0, realized=0.0, fee=0.5),
        FillRow(ts_ms=4, symbol="BTC", price=105.0, qty=-1.0, realized=5.0, fee=0.5),
        FillRow(ts_ms=5, symbol="ETH", price=10.0, qty=-2.0, realized=0.0, fee=0.0),
    ]
    m = MarkToMarket(fills)
    curve = [m.close(t, s, p) for t, s, p in [
        (1, "BTC", 100.0), (2, "BTC", 90.0), (3, "BTC", 95.0), (4, "BTC", 105.0),
        (5, "BTC", 106.0), (6, "ETH", 12.0), (7, "BTC", 107.0),
    ]]  # fmt: skip
    assert curve == pytest.approx([-0.5, -10.5, -5.5, 4.0, 4.0, 0.0, 0.0])
    assert m.max_drawdown == pytest.approx(10.5)  # from the start (0) down to -10.5
    assert m.unrealized() == pytest.approx(-4.0)  # short 2 ETH from 10, marked at 12
    assert trades_of(fills, 0, 7).max_drawdown == pytest.approx(0.5)  # realized: the fee only


def test_exposure_counts_each_symbols_position_on_its_own() -> None:
    """A long in one symbol and a short of the same size in another are two open
    positions, not a flat book: exposed from the first fill until both close."""
    fills = [fill(0, 1.0), fill(10, -1.0, symbol="ETH-USD"), fill(30, -1.0, 2.0),
             fill(60, 1.0, 1.0, symbol="ETH-USD")]  # fmt: skip
    assert trades_of(fills, 0, 100).exposure == 0.6


def test_the_command_prints_the_summary_and_refuses_a_non_agent(tmp_path: Path) -> None:
    data = tmp_path / "c.csv"
    generate_candles(data, seed=4, n=120, timeframe="5m")
    args = ["backtest", "--agent", str(agent(tmp_path / "agents")), "--data", str(data),
            "--out", str(tmp_path / "out"), "--baseline-minutes", "5"]  # fmt: skip
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    assert "120 events" in res.output and "timer agent every 5 min (120 runs)" in res.output
    assert "WAKE decisions ->" in res.output
    page = tmp_path / "out" / "report.html"
    assert f"report: {tmp_path / 'out' / 'report.json'}, {page} (plots)" in res.output
    # The commands it suggests run as printed, on the run's own state dir.
    [hint] = [line for line in res.output.splitlines() if line.startswith("look inside: ")]
    status_cmd, tail_cmd = (shlex.split(c) for c in hint.removeprefix("look inside: ").split("; "))
    status = CliRunner().invoke(cli, status_cmd[status_cmd.index("status") :])
    assert status.exit_code == 0 and "account " in status.output, status.output
    assert "agent alpha: 2 hooks," in status.output
    # A backtest keeps no shared market cache: status says so instead of zeros.
    assert "state: no shared cache" in status.output and "candles_held" not in status.output
    tail_args = tail_cmd[tail_cmd.index("audit") :]
    tail = CliRunner().invoke(cli, [*tail_args, "-n", "1", "--type", "hook"])
    assert tail.exit_code == 0 and len(tail.output.splitlines()) == 1, tail.output
    # Rows by market time: the wakes and runs of those hours too, not by when written.
    hours = ["--from", "2024-01-01T01:00", "--to", "2024-01-01T05:00", "-n", "1000", "--json"]
    window = CliRunner().invoke(cli, [*tail_args, *hours])
    assert window.exit_code == 0, window.output
    rows = [json.loads(line) for line in window.output.splitlines()]
    assert all("2024-01-01T01:00" <= r["eventTs"] < "2024-01-01T05:00" for r in rows)
    assert {"hook", "wake", "run"} <= {r["type"] for r in rows}
    assert sum(r["type"] == "hook" for r in rows) == 2 * 48  # two hooks, 48 bars
    assert "replaying" not in res.stderr  # no terminal, no progress bar
    # In a terminal the bar reads the feeds' counters; it shows the whole replay at the end.
    shown = CliRunner().invoke(cli, args, env={"TTY_COMPATIBLE": "1"})
    assert shown.exit_code == 0 and "120 events" in shown.stdout, shown.output
    assert "replaying" in shown.stderr and "120/120" in shown.stderr, shown.stderr
    bad = CliRunner().invoke(cli, ["backtest", "--agent", str(tmp_path), "--data", str(data)])
    assert bad.exit_code == 2 and "not an agent directory" in bad.output
    for option, value in [("--from", "yesterday"), ("--revision", "wake_green"),
                          ("--revision", "../x=abcdef12"), ("--tokens-in", "-5"),
                          ("--price-out", "-1"), ("--hook-timeout-ms", "0"),
                          ("--hook-timeout-ms", "60001"), ("--hook-timeout-ms", "nan"),
                          ("--baseline-minutes", "nan"), ("--price-in", "inf")]:  # fmt: skip
        bad = CliRunner().invoke(cli, [*args, option, value])
        assert bad.exit_code == 2 and option in bad.output, bad.output
    backwards = CliRunner().invoke(cli, [*args, "--from", "2026-02-01", "--to", "2026-01-01"])
    assert backwards.exit_code == 2 and "--from must be before --to" in backwards.output


def test_a_quoted_pattern_takes_binance_monthly_files_as_they_come(tmp_path: Path) -> None:
    """``--data 'BTCUSDT-5m-*.zip=BTCUSDT:5m'``: each matching zip (Binance's kline
    rows, microseconds) in name order, one series; the same report as the candles in
    one CSV of marketwake's layout. A pattern matching nothing names itself."""
    whole = tmp_path / "c.csv"
    generate_candles(whole, seed=4, n=120, timeframe="5m")
    rows = whole.read_text().splitlines()[1:]
    months = tmp_path / "months"
    monthly_zips(rows, months, "BTCUSDT-5m", 300_000, [50, 90])
    alpha = agent(tmp_path / "agents")
    reports = []
    for data, out in ((f"{months}/BTCUSDT-5m-*.zip=BTCUSDT:5m", "a"), (f"{whole}=BTCUSDT:5m", "b")):
        res = CliRunner().invoke(
            cli, ["backtest", "--agent", str(alpha), "--data", data, "--out", str(tmp_path / out)]
        )
        assert res.exit_code == 0, res.output
        report = json.loads((tmp_path / out / "report.json").read_text())
        reports.append({k: v for k, v in report.items() if k not in ("data", "seconds",
                        "events_per_second")})  # fmt: skip
    assert reports[0] == reports[1] and reports[0]["events"] == 120
    named = json.loads((tmp_path / "a" / "report.json").read_text())["data"]
    assert named == "BTCUSDT-5m-2025-01.zip + BTCUSDT-5m-2025-02.zip + BTCUSDT-5m-2025-03.zip"
    year = [f"BTCUSDT-5m-2025-{m:02d}.zip" for m in range(1, 13)]
    assert data_name(year) == "BTCUSDT-5m-2025-01.zip + ... + BTCUSDT-5m-2025-12.zip (12 files)"
    none = CliRunner().invoke(cli, ["backtest", "--agent", str(alpha), "--data",
                                    f"{months}/ETH*.zip", "--out", str(tmp_path / "c")])  # fmt: skip
    assert none.exit_code == 2 and "ETH*.zip': no file matches" in none.output


def test_out_is_refused_unless_a_backtest_made_it(tmp_path: Path) -> None:
    """A run replaces agents/ and state/ in --out: a directory of anything else (the
    project root, a live state dir) is refused and left as it was."""
    data = tmp_path / "c.csv"
    generate_candles(data, seed=4, n=30, timeframe="5m")
    root = tmp_path / "project"
    alpha = agent(root / "agents")
    (root / "state").mkdir()
    (root / "state" / "paper.sqlite3").write_bytes(b"live")
    args = ["backtest", "--agent", str(alpha), "--data", str(data), "--out"]
    for out in (root, root / "state"):
        res = CliRunner().invoke(cli, [*args, str(out)])
        assert res.exit_code == 2 and "did not write" in res.output, res.output
    compared = CliRunner().invoke(cli, [*args, str(root), "--compare", str(alpha)])
    assert compared.exit_code == 2 and "did not write" in compared.output
    assert (root / "state" / "paper.sqlite3").read_bytes() == b"live"
    assert sorted(p.name for p in root.iterdir()) == ["agents", "state"]
    assert (alpha / "hooks" / "wake_green.py").exists()
    # A new or empty directory becomes a backtest's, and the next run may replace it.
    empty = tmp_path / "empty"
    empty.mkdir()
    for out in (tmp_path / "new", empty, empty):
        res = CliRunner().invoke(cli, [*args, str(out)])
        assert res.exit_code == 0, res.output
        assert (out / ".marketwake-backtest").is_file() and (out / "report.json").is_file()
    # An older version's output (no marker) is recognized by its layout.
    older = tmp_path / "older"
    (older / "state").mkdir(parents=True)
    (older / "report.json").write_text("{}")
    assert CliRunner().invoke(cli, [*args, str(older)]).exit_code == 0
    # What the run would replace cannot also be its input.
    copy = empty / "agents" / "alpha"
    inside = CliRunner().invoke(cli, ["backtest", "--agent", str(copy), "--data", str(data),
                                      "--out", str(empty)])  # fmt: skip
    assert inside.exit_code == 2 and "--agent" in inside.output and "inside --out" in inside.output
    assert (copy / "hooks" / "wake_green.py").exists()
    # One run at a time: a second one would replace what the first is writing.
    with OUT.claim(empty.resolve()):
        busy = CliRunner().invoke(cli, [*args, str(empty)])
    assert isinstance(busy.exception, StateDirInUse)  # exit 2 from `marketwake`
    assert "is in use by pid" in str(busy.exception)
    (tmp_path / "file").write_text("x")
    res = CliRunner().invoke(cli, [*args, str(tmp_path / "file")])
    assert res.exit_code == 2 and "is a file" in res.output
    with pytest.raises(ConfigError, match="not a directory"):
        run_backtest(BacktestOptions(agent_dir=alpha, data=data, out=tmp_path / "file"))


WAKE_RED = WAKE_GREEN.replace('c["close"] > c["open"]', 'c["close"] < c["open"]')


def test_an_old_revision_runs_again_beside_the_new_one(tmp_path: Path) -> None:
    """The daemon keeps each revision's source as it first sees it; after an edit,
    --compare-revision runs the kept one (B) beside the file (A) over the same data,
    and --from/--to cut the data."""
    data = tmp_path / "c.csv"
    generate_candles(data, seed=5, n=300, timeframe="5m")
    alpha = agent(tmp_path / "agents")
    first = run_backtest(BacktestOptions(agent_dir=alpha, data=data, out=tmp_path / "old"))
    (old,) = [h for h in first.hooks if h.hook == "wake_green"]
    kept = tmp_path / "old" / "state" / "revisions" / f"{old.revision}.py"
    assert kept.read_text() == WAKE_GREEN
    (alpha / "hooks" / "wake_green.py").write_text(WAKE_RED)  # the author edits the hook

    args = ["backtest", "--agent", str(alpha), "--data", str(data), "--out", str(tmp_path / "cmp"),
            "--state-dir", str(tmp_path / "old" / "state"),
            "--compare-revision", f"wake_green={old.revision[:8]}"]  # fmt: skip
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    both = json.loads((tmp_path / "cmp" / "report.json").read_text())
    a = {h["hook"]: h for h in both["a"]["hooks"]}["wake_green"]
    b = {h["hook"]: h for h in both["b"]["hooks"]}["wake_green"]
    assert b["revision"] == old.revision and b["decisions"] == old.decisions
    assert a["revision"] != old.revision and a["decisions"]["WAKE"] != old.decisions["WAKE"]
    assert both["diff"]["wakes"] == both["b"]["wakes"] - both["a"]["wakes"]
    assert "B - A" in res.output and f"wake_green@{old.revision[:8]}" in res.output
    assert f"{tmp_path / 'cmp' / 'report.html'} (plots)" in res.output
    out = res.output.splitlines()
    # each summary as the single run prints it, line by line (not one escaped line)
    assert "\\n" not in res.output
    for run, label in ((both["a"], "A"), (both["b"], "B")):
        summary = render(msgspec.convert(run, Report)).splitlines()
        at = out.index(summary[0])
        assert out[at - 1].startswith(f"{label}: ") and out[at : at + len(summary)] == summary
    head = next(i for i, line in enumerate(out) if line.rstrip().endswith("B - A"))
    table = out[head : head + 1 + len(both["diff"])]
    assert len({len(line) for line in table}) == 1, table  # aligned, however long a name
    shown = {line.split()[0]: line.split()[1:] for line in table[1:]}
    assert shown["win_rate"][0].endswith("%") and shown["win_rate"][-2:][1] == "pp"
    assert all(x.lstrip("+-").replace(",", "").isdigit() for x in shown["fills"])
    assert all(x.rsplit(".", 1)[1].isdigit() and len(x.rsplit(".")[1]) == 2 for x in shown["cost"])
    # the page side by side: the same figures as the table, each hook's revisions, both
    # equity curves, and each run's own page beside it
    page = (tmp_path / "cmp" / "report.html").read_text()
    cells = TableCells()
    cells.feed(page)
    on_page = {row[0]: " ".join(row[1:]) for row in cells.rows if row and row[0] in shown}
    assert on_page == {name: " ".join(cells) for name, cells in shown.items()}
    assert [r for r in cells.rows if r and r[0] == "wake_green"] == [
        [
            "wake_green",
            f"@{a['revision'][:8]}: " + ", ".join(f"{k} {v}" for k, v in a["decisions"].items()),
            f"@{old.revision[:8]}: " + ", ".join(f"{k} {v}" for k, v in b["decisions"].items()),
        ]
    ]
    curves = re.findall(r'<polyline points="[^"]+" class="([a-z-]+)"', page)
    assert curves == ["equity", "other", "bar-b"]  # A's and B's equity, B's wakes per day
    assert all((tmp_path / "cmp" / x / "report.html").exists() for x in "ab")

    unknown = CliRunner().invoke(cli, [*args[:7], "--revision", "wake_green=abcdef99"])
    assert unknown.exit_code == 2 and "is not kept in" in unknown.output

    cut = ["backtest", "--agent", str(alpha), "--data", str(data), "--out", str(tmp_path / "cut"),
           "--from", "2024-01-01T01:00", "--to", "2024-01-01T03:00"]  # fmt: skip
    res = CliRunner().invoke(cli, cut)
    assert res.exit_code == 0, res.output
    report = json.loads((tmp_path / "cut" / "report.json").read_text())
    assert report["events"] == 24  # two hours of 5-minute bars (closing 01:00 .. 02:55)
    assert report["first_event"] == "2024-01-01T01:00:00.000Z"


def test_the_html_report_draws_what_the_audit_holds(tmp_path: Path) -> None:
    """report.html is one self-contained page (no scripts, no external links): the price
    line, a marker per wake that ran and per fill, the equity curve, wakes that ran per day."""
    from collections import Counter
    from html.parser import HTMLParser

    data = tmp_path / "c.csv"
    generate_candles(data, seed=3, n=600, timeframe="5m")
    out = tmp_path / "out"
    report = run_backtest(BacktestOptions(agent_dir=agent(tmp_path / "agents"), data=data, out=out))

    class Page(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.tags: Counter[tuple[str, str]] = Counter()
            self.external: list[str] = []

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            a = dict(attrs)
            self.tags[(tag, a.get("class") or "")] += 1
            if tag == "script" or any(k in ("src", "href") for k in a):
                self.external.append(tag)

    page = Page()
    page.feed((out / "report.html").read_text())
    rows = list(iter_records(out / "state" / "audit"))
    ran = [r for r in rows if r["type"] == "hook" and r["decision"] == "WAKE"
           and r["suppressedBy"] == "none"]  # fmt: skip
    assert page.external == []
    assert page.tags[("polyline", "price")] == 1 and page.tags[("polyline", "equity")] == 1
    assert page.tags[("polyline", "marked")] == 1  # the equity marked to market beside it
    assert page.tags[("circle", "wake")] == len(ran)
    assert page.tags[("rect", "buy")] + page.tags[("rect", "sell")] == report.trades.fills
    days = {str(r["eventTs"])[:10] for r in ran}
    assert page.tags[("rect", "bar")] == len(days)


# One limit buy far below the market, on the first candle: it never fills.
LOWBALL = """
def evaluate(event, state):
    c = event["payload"]["close"]
    return {"decision": "TRADE_INTENT", "reason": "lowball", "dedupeKey": "once",
            "intent": {"action": "PLACE_LIMIT_ORDER", "symbol": event["symbol"], "side": "buy",
                       "volume": 0.01, "openPrice": round(c * 0.2, 2),
                       "stopLoss": round(c * 0.1, 2)}}
"""


def test_an_entry_order_still_working_at_the_end_is_reported(tmp_path: Path) -> None:
    """An entry that never filled held the account's orders open for the whole run:
    the summary, report.json and the page name it, and when it was placed."""
    root = tmp_path / "agents" / "low"
    (root / "hooks").mkdir(parents=True)
    (root / "agent.toml").write_text("[risk]\nlimit_price_band_pct = 90\n")
    (root / "hooks" / "autotrade_low.py").write_text(LOWBALL)
    data = tmp_path / "c.csv"
    generate_candles(data, seed=2, n=100, timeframe="5m")
    report = run_backtest(BacktestOptions(agent_dir=root, data=data, out=tmp_path / "out"))
    [held] = report.working_at_end
    assert (held.side, held.order_type, held.volume) == ("buy", "limit", 0.01)
    assert held.since == report.first_event and held.price is not None
    said = render(report)
    assert "still working at the end: 1 entry order, the oldest a buy limit 0.01 BTC-USD @ " in said
    assert f"working since {report.first_event[:10]} " in said
    saved = json.loads((tmp_path / "out" / "report.json").read_text())
    assert saved["working_at_end"][0]["since"] == report.first_event
    assert "entry orders working at the end" in (tmp_path / "out" / "report.html").read_text()


def test_realized_equity_is_drawn_in_steps_over_the_whole_period() -> None:
    """Between two closing fills months apart realized PnL did not move: the curve is
    flat there and steps at each fill, from 0 at the start to the end of the run."""
    from daemon.backtest.html import _steps

    drawn = _steps([(100, 5.0), (900, -2.0)], start=0, end=1000)
    assert drawn == [(0, 0.0), (100, 0.0), (100, 5.0), (900, 5.0), (900, -2.0), (1000, -2.0)]
    from itertools import pairwise

    assert all(a[0] == b[0] or a[1] == b[1] for a, b in pairwise(drawn))  # no slope
    assert _steps([], 0, 10) == []


def test_thinning_keeps_the_extremes() -> None:
    from daemon.backtest.html import thin

    points = [(i, float((i * 7919) % 1000)) for i in range(10_000)]
    thinned = thin(points, limit=200)
    assert len(thinned) <= 200 and thinned == sorted(thinned)
    assert thinned[0] == points[0] and thinned[-1] == points[-1]  # the whole period
    assert min(p for _, p in thinned) == 0.0 and max(p for _, p in thinned) == 999.0


@pytest.mark.parametrize("n", [1, 2, 97, 98, 99, 1_000, 10_007])
@pytest.mark.parametrize("limit", [100, 101])
def test_envelope_thins_a_stream_in_bounded_buckets(n: int, limit: int) -> None:
    """The streaming thinning keeps every point while they fit, then each bucket's low
    and high over buckets of equal size: the extremes of any stretch a bucket spans,
    the first and last points, and never more than ``limit`` points."""
    from daemon.backtest.html import Envelope

    random = Random(n)
    points = [(i, random.uniform(0, 1000)) for i in range(n)]
    line = Envelope(limit)
    for p in points:
        line.add(p)
    kept = line.points()
    assert kept == sorted(kept) and set(kept) <= set(points)
    assert len(kept) <= limit
    assert kept[0] == points[0] and kept[-1] == points[-1]
    cap = limit // 2 - 1
    if n <= 2 * cap:
        assert kept == points  # buckets of two keep both
        return
    size = 2
    while -(-n // size) > cap:
        size *= 2
    for i in range(0, n, size):  # each bucket's extremes are drawn
        bucket = points[i : i + size]
        assert min(bucket, key=lambda p: p[1]) in kept
        assert max(bucket, key=lambda p: p[1]) in kept
    assert Envelope().points() == []


def test_cost_measured_from_the_agents_real_runs(tmp_path: Path) -> None:
    """--cost-from prices each run at the mean cost of the agent's finished LLM runs in
    a daemon's audit (other agents, unfinished runs and runs without a model ignored)."""
    from daemon.audit.records import LlmReport, RunRecord
    from daemon.audit.writer import AuditWriter

    def run(agent_id: str, status: str, cost: float | None) -> RunRecord:
        llm = None if cost is None else LlmReport(provider="openai", model="m", cost=cost)
        return RunRecord(ts="2026-01-01T00:00:00.000Z", agent_id=agent_id, run_id=f"r{cost}",
                         runner="llm" if llm else "log", status=status, llm=llm)  # type: ignore[arg-type]  # fmt: skip

    live = tmp_path / "live"
    w = AuditWriter(live / "audit")
    for rec in [run("alpha", "finished", 0.02), run("alpha", "finished", 0.04),
                run("alpha", "failed", 9.0), run("beta", "finished", 5.0),
                run("alpha", "finished", None)]:  # fmt: skip
        w.write(rec)
    w.close()
    data = tmp_path / "c.csv"
    generate_candles(data, seed=4, n=120, timeframe="5m")
    alpha = agent(tmp_path / "agents")
    args = ["backtest", "--agent", str(alpha), "--data", str(data), "--out", str(tmp_path / "o")]
    res = CliRunner().invoke(cli, [*args, "--cost-from", str(live)])
    assert res.exit_code == 0, res.output
    report = json.loads((tmp_path / "o" / "report.json").read_text())
    assert report["cost_model"]["measured_per_run"] == pytest.approx(0.03)
    assert report["cost"] == pytest.approx(0.03 * report["runs"])
    assert f"mean of 2 LLM runs in {live}" in res.output
    assert "estimated LLM cost" in res.output  # another run's cost: still an estimate
    empty = tmp_path / "empty"
    (empty / "audit").mkdir(parents=True)
    res = CliRunner().invoke(cli, [*args, "--cost-from", str(empty)])
    assert res.exit_code == 2 and "no finished LLM run of 'alpha'" in res.output
    # a local model's runs cost nothing: their mean tokens, at the report's prices
    local = tmp_path / "local"
    w = AuditWriter(local / "audit")
    for tokens in (1000, 3000):
        llm = LlmReport(provider="openai", model="m", cost=0.0, tokens_in=tokens, tokens_out=100)
        w.write(RunRecord(ts="2026-01-01T00:00:00.000Z", agent_id="alpha", run_id=f"l{tokens}",
                          runner="llm", status="finished", llm=llm))  # fmt: skip
    w.close()
    res = CliRunner().invoke(cli, [*args, "--cost-from", str(local)])
    assert res.exit_code == 0, res.output
    report = json.loads((tmp_path / "o" / "report.json").read_text())
    model = report["cost_model"]
    assert (model["tokens_in_per_run"], model["measured_per_run"]) == (2000, None)
    assert f"mean tokens of 2 LLM runs in {local} (priced at 0 there)" in res.output


def test_real_runs_price_the_report_by_cost_or_else_by_tokens() -> None:
    """Runs with a cost give their mean cost; runs that cost nothing (no prices in the
    runner: a local model) give their mean tokens at the report's prices; none: the
    estimate as given."""
    from daemon.backtest.report import RunSpend, priced_by_runs

    estimate = CostModel(price_input_per_mtok=2.0, price_output_per_mtok=10.0)
    paid = priced_by_runs(estimate, [RunSpend(0.01, 10, 1), RunSpend(0.03, 30, 3)], "here")
    assert paid.cost(10) == pytest.approx(0.2) and paid.source == "mean of 2 LLM runs in here"
    free = priced_by_runs(estimate, [RunSpend(0.0, 1000, 100), RunSpend(None, 3000, 300)], "here")
    assert (free.tokens_in_per_run, free.tokens_out_per_run) == (2000, 200)
    assert free.cost(10) == pytest.approx(10 * (2000 * 2.0 + 200 * 10.0) / 1e6)
    assert free.measured_per_run is None and "mean tokens of 2 LLM runs" in free.source
    assert priced_by_runs(estimate, [], "here") == estimate


COUNT_HELD = """
def evaluate(event, state):
    s, tf = event["symbol"], event["timeframe"]
    held = len(state["candles"][s][tf])
    count = state["indicators"][s][tf]["count"]
    return {"decision": "IGNORE", "reason": str(held) + " " + str(count)}
"""


def test_a_later_from_starts_with_the_candles_before_it(tmp_path: Path) -> None:
    """--from a day into the data: the first evaluation already sees 50 candles and
    indicators over the 500 before it (as a daemon that had been running), where a
    cold start saw one; the candles before --from are never evaluated."""
    data = tmp_path / "c.csv"
    generate_candles(data, seed=6, n=900, timeframe="5m")
    root = tmp_path / "agents" / "alpha"
    (root / "hooks").mkdir(parents=True)
    (root / "agent.toml").write_text("")
    (root / "hooks" / "wake_held.py").write_text(COUNT_HELD)
    start = 1_704_067_200_000 + 600 * 300_000  # the close of the 600th candle
    opts = BacktestOptions(agent_dir=root, data=data, out=tmp_path / "o", from_ms=start)
    report = run_backtest(opts)
    rows = [r for r in iter_records(tmp_path / "o" / "state" / "audit") if r["type"] == "hook"]
    assert report.events == len(rows) == 301  # the candles closing at --from and after
    assert rows[0]["reason"] == "50 501" and rows[-1]["reason"] == "50 801"
    assert rows[0]["eventTs"] == iso_ms(start)


def test_special_files_in_the_agent_dir_never_hang_the_copy(tmp_path: Path) -> None:
    """A FIFO beside the hooks is left out of the copy; a hook that is a link stays a
    link, which the workspace refuses as live (a clear error naming it, exit 2); a data
    path that is not a regular file is named as such."""
    import os

    data = tmp_path / "c.csv"
    generate_candles(data, seed=4, n=60, timeframe="5m")
    alpha = agent(tmp_path / "agents")
    os.mkfifo(alpha / "notes.fifo")
    args = ["backtest", "--agent", str(alpha), "--data", str(data), "--out", str(tmp_path / "o")]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    assert not (tmp_path / "o" / "agents" / "alpha" / "notes.fifo").exists()

    (alpha / "hooks" / "wake_linked.py").symlink_to("/dev/zero")
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 2 and "wake_linked" in res.output, res.output

    fifo = tmp_path / "data.fifo"
    os.mkfifo(fifo)
    res = CliRunner().invoke(cli, [*args[:4], str(fifo), *args[5:]])
    assert res.exit_code == 2 and "not a regular file" in res.output, res.output


CHROMIUM = shutil.which("chromium")


def screenshot(page: Path, png: Path) -> bytes:
    """``page`` as headless Chromium draws it at 1200x900 (flags that keep it off the
    network: this machine's is closed)."""
    subprocess.run(
        [
            str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
            "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync",
            f"--user-data-dir={png.parent / 'chromium-profile'}", "--window-size=1200,900",
            f"--screenshot={png}", page.as_uri(),
        ],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return png.read_bytes()


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium (.ci/run installs Debian's)")
def test_the_html_report_renders_in_a_browser(tmp_path: Path) -> None:
    """Headless Chromium screenshots report.html: a 1200x900 PNG with far more drawn
    on it than on an empty page of the same size."""
    data = tmp_path / "c.csv"
    generate_candles(data, seed=3, n=600, timeframe="5m")
    out = tmp_path / "out"
    run_backtest(BacktestOptions(agent_dir=agent(tmp_path / "agents"), data=data, out=out))
    report = screenshot(out / "report.html", tmp_path / "report.png")
    blank_page = tmp_path / "blank.html"
    blank_page.write_text("<!doctype html><html><body></body></html>")
    blank = screenshot(blank_page, tmp_path / "blank.png")
    assert report[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", report[16:24])  # the IHDR chunk
    assert (width, height) == (1200, 900)
    assert len(report) > 5 * len(blank), (len(report), len(blank))


def test_fees_and_slippage_come_off_the_pnl(tmp_path: Path) -> None:
    """Fees come off the realized PnL exactly; slippage moves the taker fills' prices
    against the agent; the report says what it was simulated with."""
    from daemon.trading.matching import FillCosts

    data = tmp_path / "c.csv"
    generate_candles(data, seed=3, n=300, timeframe="5m")
    alpha = agent(tmp_path / "agents")
    free = run_backtest(BacktestOptions(agent_dir=alpha, data=data, out=tmp_path / "free"))
    paid = run_backtest(
        BacktestOptions(
            agent_dir=alpha,
            data=data,
            out=tmp_path / "paid",
            costs=FillCosts(maker_fee_bps=10, taker_fee_bps=60),
        )
    )
    assert free.trades.fees == 0 and paid.trades.fills == free.trades.fills > 0
    assert paid.trades.fees > 0
    assert paid.trades.realized_pnl == pytest.approx(free.trades.realized_pnl - paid.trades.fees)
    assert free.fill_costs == FillCosts() and "simulated with" not in render(free)
    slipped = run_backtest(
        BacktestOptions(
            agent_dir=alpha, data=data, out=tmp_path / "slip", costs=FillCosts(slippage_bps=5)
        )
    )
    assert slipped.trades.fills == free.trades.fills and slipped.trades.fees == 0
    assert slipped.trades.realized_pnl < free.trades.realized_pnl
    assert slipped.fill_costs.slippage_bps == 5
    saved = msgspec.json.decode((tmp_path / "slip" / "report.json").read_bytes())
    assert saved["fill_costs"]["slippage_bps"] == 5
    assert "simulated with fees 0 bps maker, 0 bps taker, slippage 5 bps" in render(slipped)


def test_several_data_files_are_merged_by_time(tmp_path: Path) -> None:
    btc, eth = tmp_path / "btc.csv", tmp_path / "eth.csv"
    generate_candles(btc, seed=3, n=120, timeframe="5m")
    generate_candles(eth, seed=4, n=60, timeframe="5m")
    args = ["backtest", "--agent", str(agent(tmp_path / "agents")), "--data", str(btc),
            "--data", f"{eth}=ETH-USD:5m", "--out", str(tmp_path / "out")]  # fmt: skip
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["data"] == "btc.csv + eth.csv" and report["events"] == 180
    rows = list(iter_records(tmp_path / "out" / "state" / "audit"))
    evaluated = [(r["symbol"], r["eventTs"]) for r in rows if r["type"] == "hook"]
    assert {s for s, _ in evaluated} == {"BTC-USD", "ETH-USD"}
    assert [t for _, t in evaluated] == sorted(t for _, t in evaluated)  # one time line
    # a price plot per symbol, each with its own wakes and fills (not the other's)
    page = (tmp_path / "out" / "report.html").read_text()
    plots = page.split("<svg viewBox")[1:3]
    assert [p.split('class="title">')[1].split(":")[0] for p in plots] == ["BTC-USD", "ETH-USD"]
    ran = Counter(r["symbol"] for r in rows if r["type"] == "hook" and r["decision"] == "WAKE"
                  and r["suppressedBy"] == "none")  # fmt: skip
    assert [p.count('class="wake"') for p in plots] == [ran["BTC-USD"], ran["ETH-USD"]]
    fills = Counter(r["symbol"] for r in rows if r["type"] == "order" and r["status"] == "FILLED")
    assert [p.count('class="buy"') + p.count('class="sell"') for p in plots] == [
        fills["BTC-USD"],
        fills["ETH-USD"],
    ]
    bad = CliRunner().invoke(cli, [*args[:5], "--data", f"{eth}=ETH-USD:7m"])
    assert bad.exit_code == 2 and "timeframe must be one of" in bad.output


@pytest.mark.parametrize("max_collected", [20, 1])
def test_wakes_merged_into_one_run_are_told_apart_from_those_not_run(
    tmp_path: Path, max_collected: int
) -> None:
    """Two symbols' candles close together and both wake: collect mode runs the agent
    once for the pair, and the report says where the other WAKE went, counting the
    wakes a run only summarizes (``max_collected``) too."""
    btc, eth = tmp_path / "btc.csv", tmp_path / "eth.csv"
    generate_candles(btc, seed=3, n=40, timeframe="5m")
    generate_candles(eth, seed=4, n=40, timeframe="5m")
    root = tmp_path / "agents" / "alpha"
    (root / "hooks").mkdir(parents=True)
    (root / "agent.toml").write_text(
        "[wake]\nmax_runs_per_hour = 100\ncooldown_after_run_seconds = 0\n"
        f'queue_mode = "collect"\ndebounce_seconds = 2\nmax_collected = {max_collected}\n'
    )
    (root / "hooks" / "wake_all.py").write_text(
        "def evaluate(event, state):\n"
        "    return {'decision': 'WAKE', 'reason': 'closed', 'dedupeKey': event['eventId']}\n"
    )
    opts = BacktestOptions(
        agent_dir=root,
        data=btc,
        out=tmp_path / "out",
        more_data=[DataFile(path=eth, symbol="ETH-USD")],
    )
    report = run_backtest(opts)
    assert (report.wakes, report.runs, report.wakes_merged) == (80, 40, 40)
    assert report.wakes_suppressed == {}
    runs = [r for r in iter_records(tmp_path / "out" / "state" / "audit") if r["type"] == "run"]
    assert {r["wakes"] for r in runs} == {2}  # started and finished rows alike
    assert {len(r["eventIds"]) for r in runs} == {min(2, max_collected)}
    assert "80 WAKE decisions -> 40 agent runs (40 merged into another's run by collect mode)" in (
        render(report)
    )
    assert (
        "merged into another&#x27;s run</th><td>40"
        in (tmp_path / "out" / "report.html").read_text()
    )


def test_the_report_reader_skips_what_is_not_an_audit_row() -> None:
    """Broken, truncated, odd-typed or foreign lines are skipped; rows of other agents
    are not counted."""
    lines = [
        b'{"type":"hook","agentId":"alpha","hookId":"wake_a","decision":"WAKE"}\n',
        b'{"type":"hook","agentId":"alpha","hookId":\n',  # cut short
        b"\x00\xff garbage\n",
        b'{"type":"hook","agentId":7,"decision":"WAKE"}\n',  # wrong type
        b"[1, 2, 3]\n",
        b'{"type":"hook","agentId":"beta","hookId":"wake_b","decision":"WAKE"}\n',
        b'{"type":"run","agentId":"alpha","status":"ok","extra":{"deep":[1,2]}}\n',
    ]
    tally = Tally("alpha").read(lines)
    assert [(h.hook, h.evaluations, h.decisions) for h in tally.hooks()] == [
        ("wake_a", 1, {"WAKE": 1})
    ]
    assert (tally.wakes, tally.runs, tally.period()) == (1, 1, None)  # no eventTs: no period
    assert tally.markers("WAKE") == []  # nor a time to draw it at


def test_the_report_reader_counts_risk_rows_by_reason_and_spans_every_event_time() -> None:
    """A risk row's reasons are objects (counted by code) where a wake row's are
    strings (not the report's business); a risk row whose reasons are damaged still
    counts as rejected. The period spans the hook rows' event times, whichever
    order they come in, an event's rows together."""

    def hook(ts: str) -> bytes:
        row = {"type": "hook", "agentId": "alpha", "hookId": "h", "decision": "IGNORE"}
        return json.dumps(row | {"eventTs": ts}).encode() + b"\n"

    refused = [{"code": "MAX_NOTIONAL", "message": "too big"}, {"code": "STOP"}]
    lines = [
        hook("2025-01-01T00:05:00.000Z"),
        hook("2025-01-01T00:05:00.000Z"),
        b'{"type":"wake","agentId":"alpha","reasons":["two green candles"]}\n',
        json.dumps(
            {"type": "risk", "agentId": "alpha", "approved": False, "reasons": refused}
        ).encode(),
        b'{"type":"risk","agentId":"alpha","approved":false,"reasons":["odd"]}\n',
        b'{"type":"risk","agentId":"alpha","approved":true,"reasons":[]}\n',
        hook("2024-12-31T23:55:00.000Z"),  # an earlier time after a later one
        hook("not a time"),
        hook("2025-01-01T00:10:00.000Z"),
    ]
    tally = Tally("alpha").read(lines)
    assert (tally.approved, tally.rejected) == (1, 2)
    assert tally.wakes_suppressed() == {}  # a wake row that dropped nothing counts nothing
    assert tally.rejected_by() == {"MAX_NOTIONAL": 1, "STOP": 1}
    assert [h.evaluations for h in tally.hooks()] == [5]
    assert tally.period() == (1735689300000, 1735690200000)


def test_the_report_reader_accounts_for_every_wake() -> None:
    """Each WAKE decision ran (alone, or merged into another's run), was suppressed as
    it was decided (its hook row), or was queued and then dropped before its run (the
    wake rows: one a wake, one for a run's summarized earlier wakes)."""

    def row(**fields: object) -> bytes:
        return json.dumps({"agentId": "alpha"} | fields).encode() + b"\n"

    def woke(i: int, by: str = "none") -> bytes:
        ts = iso_ms(1_704_067_200_000 + i * 300_000)
        return row(type="hook", hookId="w", decision="WAKE", suppressedBy=by, eventId=f"e{i}",
                   eventTs=ts, symbol="X")  # fmt: skip

    lines = [
        *[woke(i) for i in range(8)],
        woke(8, "budget"),
        woke(9, "cooldown"),
        row(type="run", status="started", wakes=3),
        row(type="run", status="finished", wakes=3),
        row(type="run", status="failed", wakes=1, error="APIConnectionError: refused"),
        row(type="run", status="timeout", wakes=1, error="later"),
        row(type="wake", outcome="queued", suppressedBy="none"),
        # e3, e4 and e6 queued into run r1, which is dropped: e6 on a row of its own,
        # e3 and e4 summarized on one (max_collected 1); e1's run r0 started.
        *[row(type="wake", outcome="queued", eventId=f"e{i}", runId="r1") for i in (3, 4, 6)],
        row(type="wake", outcome="woke", eventId="e1", runId="r0"),
        row(type="run", status="started", runId="r0", wakes=1),
        row(
            type="wake",
            outcome="suppressed",
            suppressedBy="paused",
            dropped=1,
            eventId="e6",
            runId="r1",
        ),
        row(type="wake", outcome="suppressed", suppressedBy="paused", dropped=2, runId="r1"),
        row(type="wake", outcome="suppressed", suppressedBy="budget"),  # as decided: no
    ]
    tally = Tally("alpha").read(lines)
    assert (tally.wakes, tally.runs, tally.merged) == (10, 3, 2)
    assert (tally.runs_failed, tally.first_run_error) == (2, "APIConnectionError: refused")
    suppressed = tally.wakes_suppressed()
    assert suppressed == {"budget": 1, "cooldown": 1, "paused": 3}
    assert tally.runs + tally.merged + sum(suppressed.values()) == tally.wakes
    # Drawn on the page: the wakes that acted, less those dropped (by event, and those
    # summarized by the run they were queued into).
    drawn = [at for at, _ in tally.markers("WAKE")]
    assert drawn == [1_704_067_200_000 + i * 300_000 for i in (0, 1, 2, 5, 7)]
    # damaged counts (negative, or not a number: the row is not one) count nothing
    odd = Tally("alpha").read([
        row(type="run", status="finished", wakes=-3),
        row(type="wake", outcome="suppressed", suppressedBy="paused", dropped=-4),
        row(type="wake", outcome="suppressed", suppressedBy="paused", dropped="many"),
    ])  # fmt: skip
    assert (odd.runs, odd.merged, odd.wakes_suppressed()) == (1, 0, {})


class TableCells(HTMLParser):
    """The text of each table row's cells (header cells too), in order."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append("".join(self._cell))
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def stop_after(published: int) -> Component:
    """Stops the daemon as a signal would, once ``published`` events are on the bus."""
    return stop_when(lambda service: service.bus.published >= published)


def test_a_stopped_backtest_says_its_report_is_partial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C / SIGTERM: the report of what was replayed is written, marked
    incomplete (json, terminal, html), and a comparison does not start B."""
    import daemon.backtest.run as backtest_run

    real = backtest_run.prepare

    def roomy(o: BacktestOptions) -> Config:
        # The agent drains a full queue at the stop: on a loaded box that outlasts the
        # default 8 s stop timeout, whose cut (events left for a restart) is not the point.
        cfg = real(o)
        return msgspec.structs.replace(
            cfg, daemon=msgspec.structs.replace(cfg.daemon, stop_timeout_seconds=300)
        )

    monkeypatch.setattr(backtest_run, "prepare", roomy)
    data = tmp_path / "c.csv"
    generate_candles(data, seed=5, n=20_000, timeframe="5m")
    opts = BacktestOptions(agent_dir=agent(tmp_path / "agents"), data=data, out=tmp_path / "out")
    report = run_backtest(opts, [stop_after(6000)])  # past a full agent queue
    assert not report.complete and 3000 < report.events < 20_000  # (the bus counts fills too)
    assert all(h.evaluations == report.events for h in report.hooks)  # what was replayed
    assert json.loads((tmp_path / "out" / "report.json").read_text())["complete"] is False
    assert "INTERRUPTED" in render(report)
    assert report.stopped_by == "signal"
    assert "INTERRUPTED" in (tmp_path / "out" / "report.html").read_text()
    whole = run_backtest(BacktestOptions(agent_dir=opts.agent_dir, data=data, out=tmp_path / "w",
                                         to_ms=1_704_067_200_000 + 400 * 300_000))  # fmt: skip
    assert whole.complete and "INTERRUPTED" not in render(whole)

    out = tmp_path / "cmp"
    a = BacktestOptions(agent_dir=opts.agent_dir, data=data, out=out / "a")
    b = BacktestOptions(agent_dir=opts.agent_dir, data=data, out=out / "b")
    (out / "report.html").parent.mkdir()
    (out / OUT.marker).touch()  # an earlier backtest's out: its page must not outlive it
    (out / "report.json").write_text("{}")
    (out / "report.html").write_text("an earlier comparison")
    got = run_comparison(a, b, out, [stop_after(300)])
    assert isinstance(got, Report) and not got.complete
    assert not (out / "b").exists() and not (out / "report.html").exists()
    assert json.loads((out / "report.json").read_text())["complete"] is False


def test_ctrl_c_exits_130_after_the_partial_report(tmp_path: Path) -> None:
    data = tmp_path / "c.csv"
    generate_candles(data, seed=5, n=60_000, timeframe="5m")
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "daemon.cli", "backtest", "--agent", str(agent(tmp_path / "a")),
           "--data", str(data), "--out", str(out)]  # fmt: skip
    proc = subprocess.Popen(
        cmd, cwd=Path(__file__).resolve().parents[1], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not list((out / "state" / "audit").glob("audit-*")) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, stderr
    assert "INTERRUPTED" in stdout and "report:" in stdout


def test_a_data_error_part_way_is_reported_not_hidden(tmp_path: Path) -> None:
    """A bad row in the middle of the data ends the replay there: the report covers
    the rows before it, says why (the file and line), and the command exits 1."""
    data = tmp_path / "c.csv"
    generate_candles(data, seed=5, n=300, timeframe="5m")
    lines = data.read_text().splitlines()
    lines[151] = lines[151].split(",", 1)[0] + ",abc,1,1,1,1"
    data.write_text("\n".join(lines) + "\n")
    alpha = agent(tmp_path / "agents")
    report = run_backtest(BacktestOptions(agent_dir=alpha, data=data, out=tmp_path / "out"))
    assert not report.complete and report.events == 150
    assert "c.csv:152" in report.stopped_by and "abc" in report.stopped_by
    assert "DATA ERROR: the replay failed: " in render(report)
    page = (tmp_path / "out" / "report.html").read_text()
    data_end = iso_ms(int(lines[-1].split(",", 1)[0]) + 300_000)[:16]
    assert report.last_event[:16] in page and data_end not in page  # the plot stops there too
    res = CliRunner().invoke(
        cli, ["backtest", "--agent", str(alpha), "--data", str(data), "--out", str(tmp_path / "o")]
    )
    assert res.exit_code == 1 and "DATA ERROR" in res.output and "c.csv:152" in res.output


def test_a_bad_line_part_way_through_a_recording_is_reported_too(tmp_path: Path) -> None:
    """The same for a JSONL recording: the report's price plot reads the recording
    again, and stops at the bad line instead of failing on it (found by fuzzing: the
    command exited 2 with no report)."""
    csv = tmp_path / "c.csv"
    generate_candles(csv, seed=5, n=300, timeframe="5m")
    events = list(ReplayFeed(ReplaySection(enabled=True, path=str(csv), symbol="BTC-USD",
                                           timeframe="5m")).events())  # fmt: skip
    lines = [encode(e).decode() for e in events]
    lines[150] = lines[150].replace('"ts":"', '"ts":["', 1)  # no FeedEvent: ts is no string
    data = tmp_path / "rec.jsonl"
    data.write_text("\n".join(lines) + "\n")
    alpha = agent(tmp_path / "agents")
    report = run_backtest(BacktestOptions(agent_dir=alpha, data=data, out=tmp_path / "out"))
    assert not report.complete and report.events == 150 and "rec.jsonl:151" in report.stopped_by
    assert (tmp_path / "out" / "report.html").exists()
    res = CliRunner().invoke(
        cli, ["backtest", "--agent", str(alpha), "--data", str(data), "--out", str(tmp_path / "o")]
    )
    assert res.exit_code == 1 and "DATA ERROR" in res.output and "rec.jsonl:151" in res.output


def test_an_event_the_sandbox_cannot_be_sent_is_each_hooks_error_once(tmp_path: Path) -> None:
    """A recorded payload with an integer beyond 64 bits: an `unsendable` error row per
    hook for that event, every other event evaluated (the events queued before it
    failed too: their lookahead sized it)."""
    csv = tmp_path / "c.csv"
    generate_candles(csv, seed=5, n=120, timeframe="5m")
    events = list(ReplayFeed(ReplaySection(enabled=True, path=str(csv), symbol="BTC-USD",
                                           timeframe="5m")).events())  # fmt: skip
    lines = [encode(e).decode() for e in events]
    lines[60] = lines[60].replace('"volume":', '"volume":1' + "0" * 40 + ',"was":', 1)
    data = tmp_path / "rec.jsonl"
    data.write_text("\n".join(lines) + "\n")
    report = run_backtest(
        BacktestOptions(agent_dir=agent(tmp_path / "agents"), data=data, out=tmp_path / "out")
    )
    assert report.complete and report.events == 120
    rows = list(iter_records(tmp_path / "out" / "state" / "audit"))
    hooks = [r for r in rows if r["type"] == "hook"]
    assert len(hooks) == 2 * 120  # the agent's two hooks, every event
    refused = [r for r in hooks if r["error"]]
    assert [r["eventId"] for r in refused] == [events[60].event_id] * 2
    assert all(r["error"].startswith("unsendable: ") for r in refused)


def test_an_agent_not_enabled_live_is_backtested_all_the_same(tmp_path: Path) -> None:
    """`enabled = false` keeps an agent out of the live daemon; a backtest that names
    it runs it (trying an agent before enabling it is what a backtest is for)."""
    data = tmp_path / "c.csv"
    generate_candles(data, seed=5, n=60, timeframe="5m")
    alpha = agent(tmp_path / "agents")
    (alpha / "agent.toml").write_text("enabled = false\n" + TOML)
    report = run_backtest(BacktestOptions(agent_dir=alpha, data=data, out=tmp_path / "out"))
    assert report.complete and {h.evaluations for h in report.hooks} == {60}


def test_hooks_that_fail_or_never_compile_are_in_the_report(tmp_path: Path) -> None:
    """A hook that fails every evaluation shows its first error; one that does not
    compile is listed as never run (it used to be absent from the report)."""
    data = tmp_path / "c.csv"
    generate_candles(data, seed=5, n=40, timeframe="5m")
    alpha = agent(tmp_path / "agents")
    hooks = alpha / "hooks"
    (hooks / "wake_imports.py").write_text("import os\ndef evaluate(e, s):\n    return None\n")
    (hooks / "wake_broken.py").write_text("def evaluate(event, state)\n    return None\n")
    out = tmp_path / "out"
    report = run_backtest(BacktestOptions(agent_dir=alpha, data=data, out=out))
    failing = next(h for h in report.hooks if h.hook == "wake_imports")
    # Five failures pause it (the defaults); the rest are skipped, not failed, and
    # the report says from when, since nobody resumes a hook during a backtest.
    assert failing.errors == 5 and failing.skipped == {"paused": 35}
    assert failing.errors + sum(failing.skipped.values()) == failing.evaluations == 40
    assert "import of 'os' is not allowed" in failing.first_error
    rows = iter_records(out / "state" / "audit")
    paused = [r for r in rows if (r.get("error") or "").startswith("paused:")]
    assert failing.paused_from == paused[0]["eventTs"]
    (broken,) = report.broken
    assert broken.hook == "wake_broken" and "SyntaxError" in broken.error
    assert "wake_broken" not in {h.hook for h in report.hooks}
    text = render(report)
    assert "wake_broken @" in text and "did not compile, never ran" in text
    assert "(first: " in text and "did not compile" in (out / "report.html").read_text()
    assert f"not run: paused 35 (paused from {failing.paused_from} to the end" in text


def test_timeouts_are_counted_apart_with_the_budget_the_run_gave(tmp_path: Path) -> None:
    """A timeout is the one outcome a busier machine can change: the report counts
    them apart from other errors and names the knob; --hook-timeout-ms sets it."""
    data = tmp_path / "c.csv"
    generate_candles(data, seed=5, n=30, timeframe="5m")
    alpha = agent(tmp_path / "agents")
    hooks = alpha / "hooks"
    (hooks / "wake_spin.py").write_text(
        "def evaluate(e, s):\n"
        "    if e['payload']['close'] * 100 % 3 < 1:\n"
        "        while True:\n"
        "            pass\n"
        "    if e['payload']['close'] * 100 % 3 < 2:\n"
        "        return {'decision': 'IGNORE', 'reason': 'x' + 1}\n"
        "    return {'decision': 'IGNORE', 'reason': 'fine'}\n"
    )
    out = tmp_path / "out"
    report = run_backtest(BacktestOptions(agent_dir=alpha, data=data, out=out, hook_timeout_ms=120))
    spin = next(h for h in report.hooks if h.hook == "wake_spin")
    rows = [r for r in iter_records(out / "state" / "audit") if r.get("hookId") == "wake_spin"]
    failed = [r["error"] for r in rows if r.get("error") and r["error"].split(":")[0] not in (
        "paused", "backoff")]  # fmt: skip
    timeouts = [e for e in failed if e.startswith("timeout:")]
    assert timeouts and len(timeouts) < len(failed) == spin.errors, failed
    assert spin.timeouts == len(timeouts)
    # the run's budget, not the default 250 ms (a fresh worker's first evaluation
    # has the compile budget on top: 1120 ms)
    assert all(e.endswith("120 ms budget") for e in timeouts), timeouts
    text = render(report)
    assert f"{spin.errors} errors, {spin.timeouts} of them timeouts (wall clock" in text
    assert "--hook-timeout-ms" in text and "of them timeouts" in (out / "report.html").read_text()
    others = next(h for h in report.hooks if h.hook != "wake_spin")
    assert others.timeouts == 0 and "timeouts" not in others.failed()


def test_an_evaluation_over_its_budget_is_a_timeout_however_late_it_is_read(
    tmp_path: Path,
) -> None:
    """A hook of ~100+ ms under a 20 ms budget: every evaluation is a timeout. Before,
    a lookahead request's results were read once they were all in (its caller busy
    elsewhere) and each was accepted, as was a fresh worker's first evaluation under
    the compile budget: the hook never timed out after its first worker."""
    data = tmp_path / "c.csv"
    generate_candles(data, seed=5, n=30, timeframe="5m")
    alpha = agent(tmp_path / "agents")
    for hook in (alpha / "hooks").iterdir():
        hook.unlink()
    (alpha / "hooks" / "wake_heavy.py").write_text(
        "def evaluate(e, s):\n"
        "    total = 0\n"
        "    for i in range(1000000):\n"
        "        total += i\n"
        "    return {'decision': 'IGNORE', 'reason': str(total)}\n"
    )
    report = run_backtest(
        BacktestOptions(agent_dir=alpha, data=data, out=tmp_path / "out", hook_timeout_ms=20)
    )
    (heavy,) = report.hooks
    assert heavy.decisions == {}, heavy
    assert heavy.errors == heavy.timeouts == 5 and heavy.skipped == {"paused": 25}


WAKE_HIGH_TICK = """
def evaluate(event, state):
    if event["payload"]["price"] > 102:
        return {"decision": "WAKE", "reason": "high", "dedupeKey": event["eventId"]}
    return {"decision": "IGNORE", "reason": "low"}
"""


def test_a_raw_coinbase_recording_is_backtested_on_its_ticks(tmp_path: Path) -> None:
    """Raw Advanced Trade messages (a heartbeat between tickers) as --data: the hooks
    evaluate the ticks, the report counts what it left out and plots the tick prices."""
    root = tmp_path / "agents" / "ticker"
    (root / "hooks").mkdir(parents=True)
    (root / "agent.toml").write_text(
        'topics = ["market.price.tick"]\n[wake]\ncooldown_after_run_seconds = 0\n'
        "debounce_seconds = 0\n"
    )
    (root / "hooks" / "wake_high.py").write_text(WAKE_HIGH_TICK)
    lines = []
    for i in range(40):
        ts = iso_ms(1_778_051_289_000 + 60_000 * i)
        price = str(100 + (i % 4))
        tick = {"type": "ticker", "product_id": "BTC-USD", "price": price}
        events = [{"type": "update", "tickers": [tick]}]
        lines.append(
            {"channel": "ticker", "timestamp": ts, "sequence_num": 2 * i, "events": events}
        )
        beat = [{"current_time": ts, "heartbeat_counter": str(i)}]
        lines.append({"channel": "heartbeats", "timestamp": ts, "sequence_num": 2 * i + 1,
                      "events": beat})  # fmt: skip
    data = tmp_path / "session.jsonl"
    data.write_text("".join(json.dumps(line) + "\n" for line in lines))
    report = run_backtest(BacktestOptions(agent_dir=root, data=data, out=tmp_path / "out"))
    assert (report.events, report.left_out) == (40, 40)
    (hook,) = report.hooks
    assert hook.evaluations == 40 and hook.decisions == {"IGNORE": 30, "WAKE": 10}
    assert report.runs == 10 and "40 recorded lines left out" in render(report)
    page = (tmp_path / "out" / "report.html").read_text()
    assert "No prices" not in page and page.count('class="wake"') == 10
    # a recording carries its symbols: a CSV's '=SYMBOL' on it is refused, not ignored
    args = ["backtest", "--agent", str(root), "--data", f"{data}=ETH-USD",
            "--out", str(tmp_path / "out")]  # fmt: skip
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 2 and "carries its own" in res.output


def _no_trades() -> Report:
    """A report of two events that did nothing (for the comparison page's tests)."""
    return Report(
        agent="alpha", data="c.csv", events=2, first_event="", last_event="", hooks=[],
        wakes=0, runs=0, wakes_suppressed={}, cost_model=CostModel(), cost=0.0,
        baseline=timer_baseline(0, 600_000, 3.0, CostModel()), cost_ratio=None,
        trades=trades_of([], 0, 600_000),
    )  # fmt: skip


def test_a_comparison_page_of_runs_without_trades_says_so() -> None:
    """Neither run traded (closes were marked all the same): the page says there is no
    equity to draw; one run's trades are drawn alone."""
    bare = _no_trades()
    closes = Series(prices={}, marked={}, wakes=[], alerts=[], fills=[], equity=[(0, 0.0)])
    page = render_comparison_html(compare(bare, bare), ("A", "B"), (closes, closes))
    assert "No trades in either run" in page and "<polyline" not in page
    fill = FillRow(ts_ms=300_000, symbol="BTC-USD", qty=-1.0, price=10.0, realized=2.5, fee=0.0)
    traded = msgspec.structs.replace(closes, fills=[fill])
    page = render_comparison_html(compare(bare, bare), ("A", "B"), (closes, traded))
    assert page.count("<polyline") == 1 and 'class="other"' in page
    assert "No wakes ran." in page


def test_a_comparison_page_draws_both_runs_wakes_per_day() -> None:
    """Each day's WAKEs that ran on one scale: A's as bars, B's as a step line over
    them (the day B woke twice as often is twice as high), both figures on hover."""
    bare = _no_trades()
    day = 86_400_000

    def woke(*days: int) -> Series:
        wakes = [(d * day + i, "X") for i, d in enumerate(days)]
        return Series(prices={}, marked={}, wakes=wakes, alerts=[], fills=[], equity=[])

    page = render_comparison_html(compare(bare, bare), ("A", "B"), (woke(0, 1), woke(0, 0, 2)))
    bars = re.findall(r'<rect [^>]*y="([0-9.]+)" [^>]*class="bar"', page)
    hovers = re.findall(r'class="hover"><title>([^<]+)</title>', page)
    assert hovers == ["1970-01-01: A 1, B 2", "1970-01-02: A 1, B 0", "1970-01-03: A 0, B 1"]
    (line,) = re.findall(r'<polyline points="([^"]+)" class="bar-b"', page)
    ys = [float(p.split(",")[1]) for p in line.split()]
    bottom = ys[2]  # (day 2: B woke none)
    assert len(bars) == 2 and all(float(y) == ys[4] for y in bars)  # A's 1 = B's 1 (day 3)
    assert bottom - ys[0] == 2 * (bottom - float(bars[0]))  # B's 2 is twice A's 1


def test_a_duplicate_row_is_replayed_once_and_reported(tmp_path: Path) -> None:
    """Data that repeats a row (two exports that overlap) backtests as the data without
    the repeat, and the summary says how many rows it skipped."""
    data, doubled = tmp_path / "c.csv", tmp_path / "doubled.csv"
    generate_candles(data, seed=3, n=120, timeframe="5m")
    rows = data.read_text().splitlines(keepends=True)
    doubled.write_text("".join([*rows[:60], rows[59], *rows[60:]]))
    alpha = agent(tmp_path / "agents")
    once = run_backtest(BacktestOptions(agent_dir=alpha, data=data, out=tmp_path / "once"))
    twice = run_backtest(BacktestOptions(agent_dir=alpha, data=doubled, out=tmp_path / "twice"))
    assert (twice.events, twice.duplicate_rows, once.duplicate_rows) == (120, 1, 0)
    assert twice.hooks == once.hooks and twice.trades == once.trades
    assert "1 duplicate row of the data skipped" in render(twice)
    assert "duplicate row" not in render(once)


def test_a_truncated_gzip_gives_the_report_of_what_it_held(tmp_path: Path) -> None:
    """A download cut short: the replay stops where the file breaks, and the report
    (its plots read the file again, up to there) covers the rows before it."""
    data = tmp_path / "c.csv"
    generate_candles(data, seed=3, n=3000, timeframe="5m")
    cut = tmp_path / "cut.csv.gz"
    packed = gzip.compress(data.read_bytes())
    cut.write_bytes(packed[: len(packed) // 2])
    out = tmp_path / "out"
    report = run_backtest(BacktestOptions(agent_dir=agent(tmp_path / "agents"), data=cut, out=out))
    assert not report.complete and "cannot read" in report.stopped_by
    assert 0 < report.events < 3000
    assert "DATA ERROR" in (out / "report.html").read_text()


def test_files_that_overlap_are_evaluated_once_and_one_file_twice_is_refused(
    tmp_path: Path,
) -> None:
    """Two exports of one series that overlap publish the shared candles twice, under
    the same event ids: the agent evaluates each once, and the summary says how many
    came twice. The same file named twice is a mistake: refused before the run."""
    data, later = tmp_path / "c.csv", tmp_path / "later.csv"
    generate_candles(data, seed=3, n=120, timeframe="5m")
    rows = data.read_text().splitlines(keepends=True)
    later.write_text("".join([rows[0], *rows[81:]]))  # the last 40 candles again
    alpha = agent(tmp_path / "agents")
    alone = run_backtest(BacktestOptions(agent_dir=alpha, data=data, out=tmp_path / "alone"))
    both = run_backtest(
        BacktestOptions(
            agent_dir=alpha, data=data, out=tmp_path / "both", more_data=[DataFile(path=later)]
        )
    )
    assert (both.events, both.repeated_events, alone.repeated_events) == (160, 40, 0)
    assert both.hooks == alone.hooks and both.trades == alone.trades
    assert "40 events came twice (the same event id" in render(both)
    twice = BacktestOptions(
        agent_dir=alpha, data=data, out=tmp_path / "twice", more_data=[DataFile(path=data)]
    )
    with pytest.raises(ConfigError, match="is given twice"):
        run_backtest(twice)
