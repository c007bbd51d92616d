"""Real-data check: kill -9 a replay at random moments, restart it, and compare what
it did with the same replay run once without a kill.

    .venv/bin/python bench/kill9_check.py [--data FILE] [--candles 3000] [--runs 5]

Replays the first candles of real BTCUSDT 5m data (``../shared/data``, not part of
the repo; synthetic candles when it is absent) through ``agents/example`` with the
daemon's durable defaults. One run goes through untouched (the reference). Each
other run is started, SIGKILLed after 0.4 to 2 s, and started again until it
finishes by itself. Compared with the reference: each (event, hook)'s decision
and what suppressed it (its newest row: an event whose write a kill tore is
evaluated again, and both rows stay), the paper account's orders and fills, and
the wake runs of the last two days (older run history is pruned, by each process at
its first run, so at different moments), and that no order row was written
twice. Other rows written after an action (the run's, a step of an order's)
may be lost by a kill and are only counted by kind, as are torn lines, hook
rows written again and intents acted on at a restart. Prints one line per run
and the share of runs identical to the reference.

``--runner-seconds S`` gives the example agent a runner that takes S seconds (a
command: ``sleep S``) and ``[wake] rerun_interrupted_within_seconds``, so kills
land during runs: the check is then that the wakes the reference ran are run
here too (a run a kill cut runs once more at the restart), each by one finished
run, except a re-run cut in turn (not run a third time: counted apart); the
wake runs' start times are not compared (a re-run starts later). ``--wake KEY=VALUE``
sets the example's ``[wake]`` keys then: ``max_runs_per_hour=3`` puts the hourly budget
in play (the example's 12 never binds on this data), ``cooldown_after_run_seconds=400``
the cooldown (the example's 10 s is shorter than a candle); a re-run is the run it
redoes (docs/wake.md), so the verdicts must still be the reference's.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from candles import head  # bench/ is on the path when run as a script

from daemon.wake.store import KEEP_SECONDS, PRUNE_EVERY_SECONDS
from feeds.synthetic import generate_candles

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data" / "normalized" / "binance_spot_BTCUSDT_5m.csv.gz"


@dataclass
class Outcome:
    """What a replay did, as far as a restart must not change it (and the rest)."""

    # Per (event, hook): the newest row's decision and what suppressed it.
    hook_rows: dict[tuple[str, str], tuple[str, str]]
    again: int  # hook rows of an event evaluated again (its first write torn by a kill)
    torn: int  # lines a kill tore mid-write
    orders: list[tuple[str, str]]
    fills: list[tuple[str, float, float, int]]
    # Start times of the wake runs no history prune can have taken (each process
    # prunes at its first run, so when rows older than the kept two days go differs).
    wake_runs: list[float]
    # The other rows by (type, what they are about, state): written after an
    # action, a kill may lose some; none may be written twice.
    other_rows: Counter[tuple[str, str, str]]
    # Per event id: the wake runs that finished with it (each wake: exactly one).
    finished: Counter[str]
    reruns: int  # runs a kill cut whose wakes ran again
    cut: set[str]  # event ids of runs a kill cut that were not run again

    def differs(self, ref: Outcome, runs_compared: bool = True) -> list[str]:
        twice = self.other_rows - ref.other_rows
        woken = set(self.finished) | self.cut
        return [
            name
            for name, mine, theirs in (
                ("hook rows", self.hook_rows, ref.hook_rows),
                ("orders", self.orders, ref.orders),
                ("fills", self.fills, ref.fills),
                (
                    "wake runs",
                    self.wake_runs if runs_compared else [],
                    ref.wake_runs if runs_compared else [],
                ),
                ("order rows written twice", +Counter(k for k in twice if k[0] == "order"), {}),
                ("events woken", woken, set(ref.finished)),
                ("wakes run twice", {e for e, n in self.finished.items() if n > 1}, set()),
            )
            if mine != theirs
        ]

    def detail(self, ref: Outcome, first: int = 5) -> list[str]:
        """The first differing hook rows (by event id) and woken events, to look into
        with ``--keep``."""
        keys = sorted(set(self.hook_rows) | set(ref.hook_rows))
        rows = [
            f"  hook row {event} {hook}: reference {ref.hook_rows.get((event, hook))},"
            f" here {self.hook_rows.get((event, hook))}"
            for event, hook in keys
            if self.hook_rows.get((event, hook)) != ref.hook_rows.get((event, hook))
        ]
        woken = set(self.finished) | self.cut
        return [
            *rows[:first],
            *([f"  ... {len(rows) - first} more hook rows"] if len(rows) > first else []),
            *(f"  woken here only: {e}" for e in sorted(woken - set(ref.finished))[:first]),
            *(
                f"  woken in the reference only: {e}"
                for e in sorted(set(ref.finished) - woken)[:first]
            ),
        ]

    def lost(self, ref: Outcome) -> str:
        """The other rows the reference has and this run lost, by kind."""
        kinds = Counter(
            f"{t} {state}" for t, _, state in (ref.other_rows - self.other_rows).elements()
        )
        return ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items())) or "none"


def other_key(row: dict[str, Any]) -> tuple[str, str, str]:
    """A non-hook row by what a restart must not write twice."""
    kind = str(row.get("type"))
    if kind == "order":
        return kind, row["clientOrderId"], row["status"]
    if kind == "risk":
        return kind, str(row.get("clientOrderId")), str(row["approved"])
    if kind in ("run", "wake"):
        about = row.get("eventId") or ",".join(row.get("eventIds") or ())
        return kind, str(about), str(row.get("status") or row.get("outcome"))
    return kind, "", ""


def slow_agents(tmp: Path, seconds: float, wake: Sequence[str] = ()) -> Path:
    """A copy of the repo's agents whose example takes ``seconds`` a run and re-runs
    a run a kill cut, with the ``[wake]`` keys of ``wake`` (``KEY=VALUE`` each)."""
    agents = tmp / "agents"
    shutil.copytree(ROOT / "agents", agents)
    toml = agents / "example" / "agent.toml"
    text = toml.read_text()
    for old, new in (
        ("[wake]\n", "[wake]\nrerun_interrupted_within_seconds = 86400\n"),
        ('kind = "log" ', f'kind = "command"\ncommand = ["sleep", "{seconds:g}"]\n# '),
    ):
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    for setting in wake:
        key, _, value = setting.partition("=")
        line = f"{key.strip()} = {value}".replace("\\", "\\\\")  # a literal replacement
        text, n = re.subn(rf"(?m)^{re.escape(key.strip())} = \S+", line, text)
        if n != 1:
            raise SystemExit(f"--wake {setting}: no single {key!r} in the example's agent.toml")
    toml.write_text(text)
    return agents


def config(tmp: Path, csv: Path, state: str, agents: Path = ROOT / "agents") -> Path:
    path = tmp / f"{state}.toml"
    path.write_text(
        f'[daemon]\nstate_dir = "{tmp / state}"\nlog_format = "json"\nlog_level = "warning"\n'
        f'[hooks]\nagents_dir = "{agents}"\n'
        "[feeds.coinbase_ws]\nenabled = false\n[feeds.candles]\nenabled = false\n"
        f'[feeds.replay]\nenabled = true\npath = "{csv}"\nformat = "csv"\n'
        'symbol = "BTCUSDT"\ntimeframe = "5m"\n'
    )
    return path


def command(cfg: Path) -> list[str]:
    return [sys.executable, "-m", "daemon.cli", "run", "--config", str(cfg)]


def killed_run(cfg: Path, rng: random.Random, log: Path) -> int:
    """Start, SIGKILL at a random moment, start again, until a run ends by itself
    (its warnings appended to ``log``); returns the number of kills."""
    kills = 0
    while True:
        with (
            log.open("ab") as out,
            subprocess.Popen(command(cfg), cwd=ROOT, stdout=out, stderr=out) as proc,
        ):
            try:
                proc.wait(timeout=rng.uniform(0.4, 2.0))
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                kills += 1
                continue
        if proc.returncode:
            raise SystemExit(f"the daemon exited {proc.returncode}: run it by hand on {cfg}")
        return kills


def outcome(state: Path) -> Outcome:
    hooks: dict[tuple[str, str], tuple[str, str]] = {}
    other: Counter[tuple[str, str, str]] = Counter()
    runs: dict[str, RunRows] = {}
    again = torn = 0
    for f in sorted((state / "audit").glob("audit-*.jsonl")):
        for line in f.read_bytes().splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                torn += 1  # a line a kill cut short
                continue
            if row.get("type") == "hook":
                key = (row["eventId"], row["hookId"])
                again += key in hooks
                hooks[key] = (row["decision"], row["suppressedBy"])
            else:
                other[other_key(row)] += 1
                if row.get("type") == "run":
                    runs.setdefault(row["runId"], RunRows()).add(row)
    paper = sqlite3.connect(state / "paper.sqlite3")
    wake = sqlite3.connect(state / "wake.sqlite3")
    try:
        finished, reruns, cut = wakes_run(wake, runs)
        return Outcome(
            hooks,
            again,
            torn,
            paper.execute(
                "SELECT client_order_id, status FROM orders ORDER BY client_order_id"
            ).fetchall(),
            paper.execute(
                "SELECT client_order_id, signed_qty, price, ts_ms FROM fills"
                " ORDER BY client_order_id, ts_ms"
            ).fetchall(),
            [
                started
                for (started,) in wake.execute(
                    "SELECT started_at FROM wake_runs WHERE started_at >"
                    " (SELECT MAX(started_at) FROM wake_runs) - ? ORDER BY started_at",
                    (KEEP_SECONDS - PRUNE_EVERY_SECONDS,),
                )
            ],
            other,
            finished,
            reruns,
            cut,
        )
    finally:
        paper.close()
        wake.close()


@dataclass
class RunRows:
    """What a run's audit rows say: the events its wakes came from and the run a stop
    cut that it does again. Its start row is handed to the OS before its runner is
    called, so a kill does not lose it; a run killed before that row is closed at the
    restart by a row naming its events too (the store kept them until then)."""

    events: set[str] = field(default_factory=set)
    rerun_of: str | None = None

    def add(self, row: dict[str, Any]) -> None:
        self.events.update(e for e in row.get("eventIds") or () if e)
        again = re.search(r"again, for (\S+), which a stop cut", row.get("summary") or "")
        if again:
            self.rerun_of = again.group(1)


def wakes_run(
    wake: sqlite3.Connection, runs: dict[str, RunRows]
) -> tuple[Counter[str], int, set[str]]:
    """Over the run store's last unpruned days (how each run ended) and the runs' audit
    rows (the events it took): per event id, the wake runs that finished with it; how
    many runs a kill cut ran again; and the events of cut runs that were not run
    again."""
    ended = wake.execute(
        "SELECT run_id, status FROM wake_runs WHERE kind = 'wake' AND started_at >"
        " (SELECT MAX(started_at) FROM wake_runs) - ?",
        (KEEP_SECONDS - PRUNE_EVERY_SECONDS,),
    ).fetchall()
    again = {r.rerun_of for run_id, _ in ended if (r := runs.get(run_id)) and r.rerun_of}
    finished: Counter[str] = Counter()
    cut: set[str] = set()
    for run_id, status in ended:
        ids = runs[run_id].events if run_id in runs else set()
        if status == "ok":
            finished.update(ids)
        elif status == "interrupted" and run_id not in again:
            cut.update(ids)
    return finished, len(again), cut


def main(
    data: Path,
    candles: int,
    runs: int,
    seed: int,
    keep: Path | None,
    runner_s: float,
    wake: Sequence[str] = (),
) -> None:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as d:
        tmp = keep or Path(d)
        tmp.mkdir(parents=True, exist_ok=True)
        csv = tmp / "candles.csv"
        if data.exists():
            head(data, csv, candles)
        else:
            print(f"{data} not found: synthetic candles")
            generate_candles(csv, seed=seed, n=candles, timeframe="5m")
        agents = slow_agents(tmp, runner_s, wake) if runner_s else ROOT / "agents"
        start = time.perf_counter()
        with (tmp / "ref.log").open("wb") as out:
            cmd = command(config(tmp, csv, "ref", agents))
            subprocess.run(cmd, cwd=ROOT, check=True, stdout=out, stderr=out)
        ref = outcome(tmp / "ref")
        ref_s = time.perf_counter() - start
        print(
            f"reference: {candles} candles in {ref_s:.1f}s, {len(ref.hook_rows)} hook rows, "
            f"{len(ref.orders)} orders, {len(ref.fills)} fills, {len(ref.wake_runs)} wake runs in the last (unpruned) two days"
        )
        same = 0
        for n in range(runs):
            cfg = config(tmp, csv, f"run{n}", agents)
            log = tmp / f"run{n}.log"
            kills = killed_run(cfg, rng, log)
            logged = [
                json.loads(line) for line in log.read_bytes().splitlines() if line[:1] == b"{"
            ]
            redone = sum(e["event"].startswith("trade intent cut short") for e in logged)
            interrupted = sum(
                e.get("runs", 0) for e in logged if e["event"] == "runs interrupted by the stop"
            )
            got = outcome(tmp / f"run{n}")
            diff = got.differs(ref, runs_compared=not runner_s)
            same += not diff
            print(
                f"run {n}: {kills} kills; {'differs in ' + ', '.join(diff) if diff else 'same'}"
                f" ({redone} intents cut short by a kill and acted on at the restart;"
                f" {got.torn} torn lines, {got.again} hook rows evaluated again after one;"
                f" runs closed as interrupted: {interrupted}, their wakes run again: {got.reruns},"
                f" events of cut runs not run again: {len(got.cut)}; rows lost: {got.lost(ref)})"
            )
            for line in got.detail(ref) if diff else []:
                print(line)
        print(f"identical to the reference: {same} of {runs} runs")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--candles", type=int, default=3000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", type=Path, help="run in this (new) directory and keep it")
    ap.add_argument(
        "--runner-seconds",
        type=float,
        default=0.0,
        help="the example's runs take this long (sleep) and a run a kill cut runs again",
    )
    ap.add_argument(
        "--wake",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="with --runner-seconds: one of the example's [wake] keys, e.g."
        " max_runs_per_hour=3 or cooldown_after_run_seconds=400 (repeat for more)",
    )
    args = ap.parse_args()
    if args.wake and not args.runner_seconds:
        ap.error("--wake needs --runner-seconds")
    main(
        args.data,
        args.candles,
        args.runs,
        args.seed,
        args.keep,
        args.runner_seconds,
        args.wake,
    )
