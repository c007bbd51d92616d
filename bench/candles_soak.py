"""Live soak of the REST candle poller across restarts: is each closed candle
evaluated exactly once when the daemon is stopped, killed and started again?

    .venv/bin/python bench/candles_soak.py [--minutes 10] [--speed 600] [--restarts 8]

A real daemon (``marketwake run``, its own process) polls a local HTTP server
speaking Coinbase Advanced Trade's public REST (``GET /time``,
``GET /market/products/{id}/candles``: numbers as strings, newest first),
through ``agents/example`` (its three hooks evaluate every close: the two-green
wake, the doji's paper orders). The server's clock runs ``--speed`` times the
wall clock and ends the soak at about the present, so a 1m candle closes every
60/speed s and the daemon's event-time budgets, cooldowns and orders move with
it. ``--errors`` of the requests answer 503 or 429 (the poller retries).

``--restarts`` times, at seeded moments, the daemon is stopped (SIGTERM, or
SIGKILL for ``--kill-share`` of them), left down 1 to 5 s (that many server
minutes of closes to backfill, times the speed) and started again on the same
state dir. At the end, from the audit: per series, the closes the hooks saw
from the first to the last must be every bucket, each evaluated by each hook
once (a second row only where a kill tore the first: counted), and no order
written twice; the daemon's RSS at each stop, the state dir's size, and the
error lines of its log are printed. Not a test: it takes its ``--minutes``.

``--llm``: instead of the example, an agent whose one hook wakes on a close with
a small body (~8 % of them), with the LLM runner against a loopback Chat
Completions server (``--model-delay`` s an answer, two answers a run), in
collect mode, every wake kept in its run, and
``rerun_interrupted_within_seconds`` on. Then also: every run ends exactly
once, the tokens counted are the model's less at most one turn per kill, every
close the hook woke on is in a run that finished (or queued by the last stop,
or in a re-run a stop cut in turn: run once only), and each run a stop cut (a
kill, or a SIGTERM whose ``stop_timeout_seconds`` ran out) is run again exactly
once.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from datetime import UTC, datetime
from pathlib import Path

import anyio
from aiohttp import web
from procs import rss_kib  # bench/ is first on sys.path when run as a script
from soak_check import (
    audit_rows,
    check_runs,
    log_lines,
    loop_stalls,
    serve_app,
    start_model,
    status,
    tree_bytes,
)

ROOT = Path(__file__).resolve().parent.parent
PRODUCTS = ["BTC-USD", "ETH-USD", "SOL-USD", "DOGE-USD"]
GRANULARITY = {"ONE_MINUTE": 60, "FIVE_MINUTE": 300, "FIFTEEN_MINUTE": 900, "ONE_HOUR": 3600}
TIMEFRAME = {60: "1m", 300: "5m", 900: "15m", 3600: "1h"}
HOOKS = 3  # agents/example's
# --llm: the agent's one hook wakes on a close with a small body (~8 % of them).
SMALL_BODY_WAKE = """
def evaluate(event, state):
    p = event["payload"]
    if abs(p["close"] - p["open"]) <= p["open"] * 0.0001:
        return {"decision": "WAKE", "reason": "a small body"}
    return {"decision": "IGNORE", "reason": "no"}
"""
# Every wake in a run (none summarized), no debounce, and a run a stop cut runs again.
LLM_WAKE = """debounce_seconds = 0
max_collected = 1000
rerun_interrupted_within_seconds = 864000"""


def candle(product: str, seconds: int, start: int) -> dict[str, str]:
    """The bucket's candle, the same at every request: a slow wave plus seeded noise,
    some buckets green, some red, a few dojis."""
    rng = random.Random(f"{product}:{seconds}:{start}")
    base = 100.0 * (PRODUCTS.index(product) + 1)
    mid = base * (1 + 0.03 * math.sin(start / 25_000))
    o, c = mid * (1 + rng.gauss(0, 0.002)), mid * (1 + rng.gauss(0, 0.002))
    if rng.random() < 0.05:
        c = o * (1 + rng.gauss(0, 0.00002))  # a doji
    hi, lo = max(o, c) * (1 + abs(rng.gauss(0, 0.001))), min(o, c) * (1 - abs(rng.gauss(0, 0.001)))
    return {"start": str(start), "low": f"{lo:.4f}", "high": f"{hi:.4f}",
            "open": f"{o:.4f}", "close": f"{c:.4f}", "volume": f"{rng.uniform(1, 50):.3f}"}  # fmt: skip


class Exchange:
    """Coinbase's public time and candles on loopback, on a clock ``speed`` times the
    wall's that reaches the present after ``minutes``; ``errors`` of the candle
    requests fail (503, or 429 with a Retry-After)."""

    def __init__(self, minutes: float, speed: float, errors: float, seed: int) -> None:
        self.speed, self.errors = speed, errors
        self.rng = random.Random(seed)
        self.m0 = time.monotonic()
        self.t0 = time.time() - minutes * 60 * speed
        self.requests = Counter[str]()

    def now(self) -> float:
        return self.t0 + (time.monotonic() - self.m0) * self.speed

    async def time(self, request: web.Request) -> web.Response:
        self.requests["time"] += 1
        now = self.now()
        iso = datetime.fromtimestamp(now, UTC).isoformat().replace("+00:00", "Z")
        return web.json_response(
            {"iso": iso, "epochSeconds": str(int(now)), "epochMillis": str(int(now * 1000))}
        )

    async def candles(self, request: web.Request) -> web.Response:
        self.requests["candles"] += 1
        if self.rng.random() < self.errors:
            self.requests["failed"] += 1
            if self.rng.random() < 0.5:
                return web.json_response({"error": "unavailable"}, status=503)
            return web.json_response(
                {"error": "rate limited"}, status=429, headers={"Retry-After": "1"}
            )
        product = request.match_info["product"]
        q = request.query
        seconds = GRANULARITY.get(q.get("granularity", ""))
        if product not in PRODUCTS or seconds is None:
            return web.json_response({"error": "INVALID_ARGUMENT"}, status=400)
        forming = int(self.now()) // seconds * seconds
        first = int(q["start"]) // seconds * seconds
        last = min(int(q["end"]), forming)
        starts = range(last // seconds * seconds, first - 1, -seconds)  # newest first
        return web.json_response({"candles": [candle(product, seconds, s) for s in starts]})

    async def serve(self, sock: socket.socket, stop: threading.Event) -> None:
        app = web.Application()
        app.router.add_get("/api/v3/brokerage/time", self.time)
        app.router.add_get("/api/v3/brokerage/market/products/{product}/candles", self.candles)
        await serve_app(app, sock, stop)


def config(tmp: Path, port: int, products: list[str], timeframes: list[str], agents: Path) -> Path:
    path = tmp / "config.toml"
    path.write_text(
        f"""[daemon]
state_dir = "{tmp / "state"}"
log_format = "json"

[hooks]
agents_dir = "{agents}"

[feeds.coinbase_ws]
enabled = false

[feeds.candles]
enabled = true
base_url = "http://127.0.0.1:{port}/api/v3/brokerage"
products = {json.dumps(products)}
timeframes = {json.dumps(timeframes)}
poll_seconds = 1.0
"""
    )
    return path


def check(rows: list[dict[str, object]], hook_count: int) -> tuple[list[str], list[str]]:
    """Per series: closes seen, missing between the first and the last, and evaluated
    more than once by a hook; and the problems found."""
    seen: dict[str, Counter[tuple[int, str]]] = defaultdict(Counter)
    orders: Counter[tuple[str, str]] = Counter()
    for r in rows:
        if r.get("type") == "hook" and r.get("topic") == "market.candle.closed":
            _, symbol, tf, close = str(r["eventId"]).split(":")
            seen[f"{symbol} {tf}"][(int(close), str(r["hookId"]))] += 1
        elif r.get("type") == "order":
            orders[(str(r["clientOrderId"]), str(r["status"]))] += 1
    lines, problems = [], []
    for series, evaluated in sorted(seen.items()):
        step = {"1m": 60_000, "5m": 300_000, "15m": 900_000, "1h": 3_600_000}[series.split()[1]]
        closes = sorted({c for c, _ in evaluated})
        every = range(closes[0], closes[-1] + step, step)
        hooks = {h for _, h in evaluated}
        missing = [c for c in every if any(evaluated[(c, h)] == 0 for h in hooks)]
        twice = sum(n - 1 for n in evaluated.values() if n > 1)
        lines.append(
            f"{series}: {len(closes)} closes evaluated ({len(every)} buckets from the first"
            f" to the last), {len(missing)} missing, {twice} hook rows written again"
        )
        if missing:
            problems.append(f"{series}: closes missing, first {missing[:3]}")
        if len(hooks) != hook_count:
            problems.append(f"{series}: evaluated by {sorted(hooks)}, not {hook_count} hooks")
    twice_orders = [k for k, n in orders.items() if n > 1]
    lines.append(f"orders: {len({k[0] for k in orders})}, rows written twice: {len(twice_orders)}")
    if twice_orders:
        problems.append(f"order rows written twice: {twice_orders[:3]}")
    return lines, problems


def check_wakes(rows: list[dict[str, object]], state: Path) -> list[str]:
    """--llm: every close the hook woke on is in a run that finished, or in a run
    the last stop left queued, or its wake row says what suppressed it, or it was in
    a run a stop cut that is not run again, saying why (a re-run is run once only:
    one cut in turn is closed); a run a stop cut is run again, once (or is queued
    to at the end). Prints what it counted; returns the problems."""
    woke = {
        str(r["eventId"]) for r in rows if r.get("type") == "hook" and r.get("decision") == "WAKE"
    }
    suppressed = {
        str(r["eventId"]): str(r["suppressedBy"])
        for r in rows
        if r.get("type") == "wake" and r.get("suppressedBy") not in (None, "none")
    }
    finished: set[str] = set()
    not_again: set[str] = set()  # in a run a stop cut that the policy does not run again
    again: dict[str, str] = {}  # cut run -> the run that runs its wakes again
    redid: Counter[str] = Counter()  # cut run -> runs saying they redo it
    for r in rows:
        if r.get("type") != "run":
            continue
        ids = r.get("eventIds")
        if r.get("status") == "finished" and isinstance(ids, list):
            finished.update(map(str, ids))
        if "it is not run again" in str(r.get("error")) and isinstance(ids, list):
            not_again.update(map(str, ids))  # (e.g. a re-run cut in turn: once only)
        said = re.search(r"its wakes run again as (\S+)", str(r.get("error") or ""))
        if said:
            again[str(r["runId"])] = said.group(1).rstrip(";")
        if r.get("status") == "started" and (
            cut := re.search(r"again, for (\S+),", str(r.get("summary")))
        ):
            redid[cut.group(1)] += 1
    db = sqlite3.connect(state / "wake.sqlite3")
    try:
        pending = {
            run: json.loads(body)
            for run, body in db.execute("SELECT run_id, body FROM wake_pending")
        }
    finally:
        db.close()
    queued = {str(w["eventId"]) for body in pending.values() for w in body["wakes"]}
    lost = woke - finished - queued - suppressed.keys() - not_again
    print(
        f"wakes: {len(woke)} closes woke the agent; {len(woke & finished)} in finished runs,"
        f" {len(queued)} queued at the end, {len(suppressed)} suppressed"
        f" ({dict(Counter(suppressed.values()))}), {len(not_again - finished)} in a cut run not"
        f" run again (a re-run cut in turn), {len(lost)} lost;"
        f" {len(again)} runs cut by a stop run again"
    )
    problems = [f"wakes lost: {len(lost)}, first {sorted(lost)[:3]}"] if lost else []
    problems += [
        f"run {cut} was to run again as {rerun}, which started {redid[cut]} times"
        for cut, rerun in again.items()
        if redid[cut] != (rerun not in pending)  # (once, or queued at the end)
    ]
    return problems


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--speed", type=float, default=600.0, help="server seconds a wall second")
    ap.add_argument("--products", type=int, default=2, choices=range(1, len(PRODUCTS) + 1))
    ap.add_argument("--timeframes", default="1m,5m", help="of 1m, 5m, 15m, 1h")
    ap.add_argument("--restarts", type=int, default=8)
    ap.add_argument("--kill-share", type=float, default=0.5, help="of the stops: SIGKILL")
    ap.add_argument("--errors", type=float, default=0.02, help="of the candle requests: fail")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", type=Path, help="run in this (new) directory and keep it")
    ap.add_argument("--llm", action="store_true", help="an LLM agent on a loopback model")
    ap.add_argument("--model-delay", type=float, default=0.2, help="--llm: seconds per answer")
    args = ap.parse_args()
    timeframes = args.timeframes.split(",")
    if not (args.minutes > 0 and args.speed >= 1 and args.restarts >= 0):
        ap.error("--minutes must be above 0, --speed at least 1, --restarts not negative")
    if not (0 <= args.kill_share <= 1 and 0 <= args.errors < 1 and args.model_delay >= 0):
        ap.error(
            "--kill-share must be within 0..1, --errors within 0..1 (not 1),"
            " --model-delay not negative"
        )
    if not set(timeframes) <= set(TIMEFRAME.values()):
        ap.error(f"--timeframes: of {', '.join(TIMEFRAME.values())}")
    rng = random.Random(args.seed)
    products = PRODUCTS[: args.products]
    with tempfile.TemporaryDirectory() as d:
        tmp = args.keep or Path(d)
        tmp.mkdir(parents=True, exist_ok=True)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        stop = threading.Event()
        exchange = Exchange(args.minutes, args.speed, args.errors, args.seed)
        thread = threading.Thread(target=anyio.run, args=(exchange.serve, sock, stop), daemon=True)
        thread.start()
        agents, model = ROOT / "agents", None
        if args.llm:
            agents = tmp / "agents"
            model = start_model(
                args.model_delay, agents, stop,
                hook=SMALL_BODY_WAKE, topic="market.candle.closed", wake=LLM_WAKE,
                deadline=max(10.0, 3 * args.model_delay + 5),  # two answers: no timeouts
            )  # fmt: skip
        cfg = config(tmp, sock.getsockname()[1], products, timeframes, agents)
        log_path = tmp / "daemon.log"
        end = time.monotonic() + args.minutes * 60
        stops = sorted(rng.uniform(0.05, 0.95) * args.minutes * 60 for _ in range(args.restarts))
        at_stop: list[str] = []
        codes: list[int] = []
        kills = 0
        started = time.monotonic()
        try:
            for n in range(args.restarts + 1):
                begun = time.monotonic()
                with log_path.open("ab") as log:
                    daemon = subprocess.Popen(
                        [sys.executable, "-m", "daemon.cli", "run", "--config", str(cfg)],
                        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                    )  # fmt: skip
                until = started + stops[n] if n < len(stops) else end
                while time.monotonic() < until and daemon.poll() is None:
                    time.sleep(0.2)
                if daemon.poll() is not None:
                    sys.exit(f"the daemon exited by itself ({daemon.returncode}); see its log")
                rss, loop = rss_kib(daemon.pid), loop_stalls(status(tmp / "state"))
                kill = n < len(stops) and rng.random() < args.kill_share
                kills += kill
                daemon.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
                codes.append(daemon.wait(timeout=60))
                up = time.monotonic() - begun
                at_stop.append(
                    f"{'kill' if kill else 'term'} {rss / 1024:.0f} MiB (up {up:.0f} s, {loop})"
                )
                if n < len(stops):
                    time.sleep(rng.uniform(1.0, 5.0))
        finally:
            stop.set()
            thread.join(timeout=5)
        rows, torn = audit_rows(tmp / "state" / "audit")
        lines, problems = check(rows, 1 if args.llm else HOOKS)
        errors = log_lines(log_path, "error", "critical")
        stalls = [ln for ln in log_lines(log_path, "warning") if "loop stalled" in ln]
        print(
            f"{args.minutes:g} min at {args.speed:g}x ({args.minutes * args.speed / 60:.0f} server"
            f" hours), {len(products)} products x {timeframes}; requests {dict(exchange.requests)};"
            f" {args.restarts} restarts"
        )
        print(
            f"stops (daemon RSS and event loop stalls then): {', '.join(at_stop)}; exit codes {codes}"
        )
        print(f"state dir {tree_bytes(tmp / 'state') / 2**20:.1f} MiB; {len(rows)} audit rows,"
              f" {torn} torn lines; {len(errors)} error lines in the daemon's log")  # fmt: skip
        for line in lines:
            print(" ", line)
        for line in errors[:5] + stalls[:5]:
            print("  log:", line[:300])
        if args.llm:
            problems += check_runs(tmp / "state", model, kills)
            problems += check_wakes(rows, tmp / "state")
        print("problems: " + ("; ".join(problems) if problems else "none"))
        if problems:
            sys.exit(1)


if __name__ == "__main__":
    main()
