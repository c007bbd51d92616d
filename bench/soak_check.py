"""Live soak on loopback: is the daemon safe to leave running? A real daemon
(``marketwake run``, its own process) takes Coinbase ticker frames from a local
WebSocket server (Coinbase's message format) at ``--rate`` a second for
``--minutes``, through ``agents/example`` (its three hooks evaluate every tick),
with a small audit bound (``--audit-mb``) so parts roll, compress, get their id
index and are deleted within the run.

    .venv/bin/python bench/soak_check.py [--minutes 10] [--rate 200] [--products 4]

Every ``--every`` seconds it samples the daemon's RSS, its sandbox workers' RSS
(summed), the state dir's bytes and the audit files; once a minute it prints
them with the daemon's own counters (``status --json``: events published and
coalesced, hook evaluations). At the end: each figure's growth per minute over
the second half of the run, against the first half's (the same run's baseline:
warm-up shows as a first half that grew more; a leak as a second half that grows
as much). A price walk with an occasional 24 h change below -8 % makes the crash
hook ALERT now and then (then dedupe and cooldown suppress it for the day).

``--llm``: instead of the example, an agent whose hook wakes on about one tick
in fifty, with the LLM runner (``provider = "openai"``) against a local
Chat Completions server: each run calls ``get_positions`` then answers, about
one run a second (collect mode, a 0.5 s debounce). That soaks the wake
scheduler, the run store and the model conversations too.

``--restarts N``: the daemon is stopped N times at seeded moments (SIGKILL for
``--kill-share`` of them, else SIGTERM), left down 1 to 3 s and started again
on the same state dir (the audit unbounded then, so every row stays). The
growth figures then mean little (each process starts afresh); instead the run
check: every run the audit shows started ended exactly once (finished, failed,
or closed as interrupted at the next start), and, with ``--llm``, the tokens
the run store counted against the budget are the model's, less at most one
turn per kill (the turn a kill cut before its usage was written), never more.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
from aiohttp import web
from coinbase_frames import subscriptions_ack, ticker_frame  # bench/: first on sys.path
from procs import children, rss_kib
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

ROOT = Path(__file__).resolve().parent.parent
PRODUCTS = ["BTC-USD", "ETH-USD", "SOL-USD", "DOGE-USD", "XRP-USD", "ADA-USD", "LTC-USD"]


class Ticker:
    """The frames one connection is sent: a random walk per product."""

    def __init__(self, products: list[str], seed: int) -> None:
        self.rng = random.Random(seed)
        self.prices = {p: 100.0 * (i + 1) for i, p in enumerate(products)}
        self.seq = 0

    def frame(self, product: str) -> str:
        price = self.prices[product] = self.prices[product] * (1 + self.rng.gauss(0, 0.0005))
        change = -9.0 if self.rng.random() < 0.001 else self.rng.uniform(-5, 5)
        self.seq += 1
        return ticker_frame(self.seq, product, f"{price:.4f}", f"{change:.3f}")


class Server:
    """Acks subscriptions; streams ticker frames at ``rate`` a second to a connection
    subscribed to the ticker channel, until ``stop`` (no heartbeats: the ticks keep
    the daemon's idle watchdog quiet)."""

    def __init__(self, products: list[str], rate: float) -> None:
        self.products, self.rate = products, rate
        self.sent = 0
        self.connections = 0
        self.close_codes: list[int | None] = []
        self.stop = threading.Event()

    async def handler(self, ws: ServerConnection) -> None:
        self.connections += 1
        ticker = Ticker(self.products, self.connections)
        async with anyio.create_task_group() as tg:
            try:
                async for text in ws:
                    msg = json.loads(text)
                    channel = msg.get("channel")
                    ticker.seq += 1
                    await ws.send(subscriptions_ack(ticker.seq, msg))
                    if channel == "ticker" and msg.get("type") == "subscribe":
                        tg.start_soon(self._stream, ws, ticker)
            except ConnectionClosed:
                pass
        self.close_codes.append(ws.close_code)  # how the daemon said goodbye

    async def _stream(self, ws: ServerConnection, ticker: Ticker) -> None:
        start, i = time.monotonic(), 0
        while not self.stop.is_set():
            try:
                await ws.send(ticker.frame(self.products[i % len(self.products)]))
            except ConnectionClosed:
                return  # the daemon went (its stop): the handler sees it too
            i += 1
            self.sent += 1
            ahead = start + i / self.rate - time.monotonic()
            if ahead > 0:
                await anyio.sleep(ahead)
            elif i % 64 == 0:
                await anyio.lowlevel.checkpoint()

    async def serve(self, sock: socket.socket) -> None:
        async with serve(self.handler, sock=sock, max_size=2**20):
            await anyio.to_thread.run_sync(self.stop.wait)


WAKE_HOOK = """
def evaluate(event, state):
    price = event["payload"].get("price") or 0
    if int(price * 10000) % 50 == 0:
        return {"decision": "WAKE", "reason": "price ends in 50: " + str(price)}
    return {"decision": "IGNORE", "reason": "no"}
"""


def llm_agent(
    agents: Path,
    port: int,
    *,
    hook: str = WAKE_HOOK,
    topic: str = "market.price.tick",
    wake: str = "debounce_seconds = 0.5",
    deadline: float = 10.0,
) -> None:
    """The ``--llm`` agent: a wake hook (on ticks unless ``topic`` says otherwise), the
    LLM runner on a loopback model; ``wake`` adds or replaces lines of its ``[wake]``."""
    agent = agents / "soak"
    (agent / "hooks").mkdir(parents=True)
    (agent / "hooks" / "wake_soak.py").write_text(hook)
    (agent / "AGENT.md").write_text("Check the positions, then say what you would do.\n")
    (agent / "agent.toml").write_text(
        f"""topics = ["{topic}"]
state_candles = 0

[wake]
max_runs_per_hour = 3600
cooldown_after_run_seconds = 0
queue_mode = "collect"
{wake}

[wake.runner]
kind = "llm"
provider = "openai"
base_url = "http://127.0.0.1:{port}/v1"
model = "soak"
max_tool_calls = 2
deadline_seconds = {deadline:g}
"""
    )


class Model:
    """Chat Completions on loopback: the first turn of a run calls ``get_positions``,
    the turn with its result answers."""

    TOKENS_IN = 900  # a request's prompt tokens, as its answer reports them

    def __init__(self, delay: float = 0.0) -> None:
        self.requests = 0
        self.answered = 0  # answers sent (a stop may cut a request during the delay)
        self.delay = delay  # seconds before each answer: runs a stop can land in

    async def completions(self, request: web.Request) -> web.Response:
        self.requests += 1
        body = await request.json()
        if self.delay:
            await anyio.sleep(self.delay)
        self.answered += 1
        answered = any(m.get("role") == "tool" for m in body.get("messages", []))
        if answered:
            message: dict[str, object] = {"role": "assistant", "content": "Nothing to do."}
            finish = "stop"
        else:
            call = {"id": f"call-{self.requests}", "type": "function",
                    "function": {"name": "get_positions", "arguments": "{}"}}  # fmt: skip
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
            finish = "tool_calls"
        choice = {"index": 0, "message": message, "finish_reason": finish}
        usage = {"prompt_tokens": self.TOKENS_IN, "completion_tokens": 40,
                 "total_tokens": self.TOKENS_IN + 40}  # fmt: skip
        answer = {
            "id": f"chatcmpl-{self.requests}", "object": "chat.completion", "created": 0,
            "model": "soak", "choices": [choice], "usage": usage,
        }  # fmt: skip
        return web.json_response(answer)

    async def serve(self, sock: socket.socket, stop: threading.Event) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.completions)
        await serve_app(app, sock, stop)


def start_model(delay: float, agents: Path, stop: threading.Event, **agent: Any) -> Model:
    """A loopback :class:`Model` serving in a thread of its own until ``stop``, and the
    ``--llm`` agent written in ``agents`` to use it (``agent``: :func:`llm_agent`'s
    options)."""
    model, sock = Model(delay), socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    llm_agent(agents, sock.getsockname()[1], **agent)
    threading.Thread(target=anyio.run, args=(model.serve, sock, stop), daemon=True).start()
    return model


async def serve_app(app: web.Application, sock: socket.socket, stop: threading.Event) -> None:
    """Serve ``app`` on the listening ``sock`` until ``stop`` is set."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    try:
        await anyio.to_thread.run_sync(stop.wait)
    finally:
        await runner.cleanup()


def tree_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total


def status(state_dir: Path) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-m", "daemon.cli", "status", "--state-dir", str(state_dir), "--json"],
        cwd=ROOT, capture_output=True, check=False, timeout=30,
    )  # fmt: skip
    try:
        found = json.loads(done.stdout)
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def log_lines(path: Path, *levels: str) -> list[str]:
    """The daemon's log lines (JSON, one a line) at ``levels``; a line that is not
    JSON (a traceback) counts as an error."""
    found = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            level = json.loads(line).get("level")
        except (ValueError, AttributeError):
            level = "error"
        if level in levels:
            found.append(line)
    return found


def loop_stalls(found: dict[str, object]) -> str:
    """The event loop's stalls as ``status`` has them."""
    loop = found.get("loop")
    if not isinstance(loop, dict):
        return "loop stalls ?"
    return f"loop stalls {loop.get('stalls')} (longest {loop.get('longest_ms')} ms)"


def counters(found: dict[str, object], model: Model | None) -> str:
    bus = found.get("bus")
    parts = found.get("components")
    hooks = parts.get("hooks") if isinstance(parts, dict) else None
    bus = bus if isinstance(bus, dict) else {}
    hooks = hooks if isinstance(hooks, dict) else {}
    return (
        f"published {bus.get('published', '?')}, coalesced {bus.get('coalesced', '?')}, "
        f"evaluations {hooks.get('evaluations', '?')}, suppressed {hooks.get('suppressed', '?')}, "
        f"{loop_stalls(found)}"
        + (f"; model requests {model.requests}, {_runs(hooks)}" if model is not None else "")
    )


def _runs(hooks: dict[str, object]) -> str:
    """The LLM agent's runs today and their tokens, as ``status`` has them."""
    agents = hooks.get("agents")
    soak = agents.get("soak") if isinstance(agents, dict) else None
    if not isinstance(soak, dict):
        return "runs ?"
    keys = ("runs_today", "runs_failed", "tokens_in_today", "tokens_out_today", "cost_today")
    shown = ", ".join(f"{k} {soak.get(k)}" for k in keys)
    return shown + (f", last error {soak['last_run_error']}" if soak.get("last_run_error") else "")


def config(tmp: Path, port: int, products: list[str], audit_mb: int, agents: Path) -> Path:
    path = tmp / "config.toml"
    path.write_text(
        f"""[daemon]
state_dir = "{tmp / "state"}"
log_format = "json"

[hooks]
agents_dir = "{agents}"

[audit]
max_total_mb = {audit_mb}

[feeds.coinbase_ws]
enabled = true
url = "ws://127.0.0.1:{port}"
products = {json.dumps(products)}
"""
    )
    return path


def audit_rows(audit: Path) -> tuple[list[dict[str, object]], int]:
    """Every row of the audit (compressed parts too) and the lines that did not
    parse (torn by a kill)."""
    rows: list[dict[str, object]] = []
    torn = 0
    for f in sorted(audit.iterdir()):
        if f.name.endswith(".jsonl.gz"):
            data = gzip.decompress(f.read_bytes())
        elif f.name.endswith(".jsonl"):
            data = f.read_bytes()
        else:
            continue
        for line in data.splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                torn += 1
    return rows, torn


def check_runs(state: Path, model: Model | None, kills: int) -> list[str]:
    """The run check of a soak with restarts (see the module's docstring); prints what
    it counted and returns the problems found."""
    ends: dict[str, list[str]] = {}
    for row in audit_rows(state / "audit")[0]:  # (lines a kill tore are left out)
        if row.get("type") == "run":
            ends.setdefault(str(row["runId"]), []).append(str(row["status"]))
    final = {r: [s for s in st if s != "started"] for r, st in ends.items()}
    interrupted = sum(1 for r, st in final.items() if st == ["failed"])
    problems = [f"run {r} ended {len(st)} times: {st}" for r, st in final.items() if len(st) != 1]
    print(f"runs: {len(ends)}, each ended once: {len(ends) - len(problems)}"
          f" ({sum(st == ['finished'] for st in final.values())} finished,"
          f" {interrupted} failed or interrupted)")  # fmt: skip
    if model is not None:
        db = sqlite3.connect(state / "wake.sqlite3")
        try:
            (counted,) = db.execute("SELECT COALESCE(SUM(tokens_in), 0) FROM wake_runs").fetchone()
        finally:
            db.close()
        served = model.answered * Model.TOKENS_IN
        print(f"tokens in: the model served {served:,}, the run store counted {counted:,}"
              f" (a kill may lose one turn of {Model.TOKENS_IN}: {kills} kills)")  # fmt: skip
        if not served - kills * Model.TOKENS_IN <= counted <= served:
            problems.append(f"tokens counted {counted:,} for {served:,} served, {kills} kills")
    return problems


def slope(samples: list[tuple[float, int]]) -> float:
    """Least-squares growth per minute of (seconds, value) samples."""
    if len(samples) < 2:
        return 0.0
    n = len(samples)
    mx = sum(t for t, _ in samples) / n
    my = sum(v for _, v in samples) / n
    den = sum((t - mx) ** 2 for t, _ in samples) or 1.0
    return 60 * sum((t - mx) * (v - my) for t, v in samples) / den


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--rate", type=float, default=200.0, help="ticker frames a second")
    ap.add_argument("--products", type=int, default=4, choices=range(1, len(PRODUCTS) + 1))
    ap.add_argument("--audit-mb", type=int, default=8)
    ap.add_argument("--every", type=float, default=5.0, help="seconds between samples")
    ap.add_argument("--llm", action="store_true", help="an LLM agent on a loopback model")
    ap.add_argument("--model-delay", type=float, default=0.0, help="--llm: seconds per answer")
    ap.add_argument("--restarts", type=int, default=0, help="stops and starts during the run")
    ap.add_argument("--kill-share", type=float, default=0.5, help="of the stops: SIGKILL")
    ap.add_argument("--seed", type=int, default=1, help="of the stops' moments and kinds")
    args = ap.parse_args()
    if not (args.minutes > 0 and args.rate > 0 and args.every > 0 and args.audit_mb >= 1):
        ap.error("--minutes, --rate and --every must be above 0, --audit-mb at least 1")
    if args.restarts < 0 or args.model_delay < 0 or not 0 <= args.kill_share <= 1:
        ap.error("--restarts and --model-delay must not be negative, --kill-share within 0..1")
    if args.restarts:
        args.audit_mb = 100_000  # every row kept for the run check
    products = PRODUCTS[: args.products]
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        server = Server(products, args.rate)
        thread = threading.Thread(target=anyio.run, args=(server.serve, sock), daemon=True)
        thread.start()
        agents, model = ROOT / "agents", None
        if args.llm:
            agents = tmp / "agents"
            model = start_model(args.model_delay, agents, server.stop)
        cfg = config(tmp, sock.getsockname()[1], products, args.audit_mb, agents)
        log = (tmp / "daemon.log").open("wb")
        command = [sys.executable, "-m", "daemon.cli", "run", "--config", str(cfg)]
        daemon = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        rng = random.Random(args.seed)
        stops = sorted(rng.uniform(0.1, 0.9) * args.minutes * 60 for _ in range(args.restarts))
        kills = 0
        rss: list[tuple[float, int]] = []
        workers: list[tuple[float, int]] = []
        disk: list[tuple[float, int]] = []
        start = time.monotonic()
        end = start + args.minutes * 60
        next_line = start + 60
        try:
            while time.monotonic() < end:
                time.sleep(args.every)
                if daemon.poll() is not None:
                    sys.exit(f"the daemon exited ({daemon.returncode}); see its log")
                if stops and time.monotonic() - start >= stops[0]:
                    stops.pop(0)
                    kill = rng.random() < args.kill_share
                    kills += kill
                    daemon.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
                    code = daemon.wait(timeout=60)
                    if not kill and code:
                        sys.exit(f"the daemon exited {code} at a SIGTERM; see its log")
                    time.sleep(rng.uniform(1.0, 3.0))
                    daemon = subprocess.Popen(
                        command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT
                    )
                t = time.monotonic() - start
                rss.append((t, rss_kib(daemon.pid)))
                workers.append((t, sum(rss_kib(c) for c in children(daemon.pid))))
                disk.append((t, tree_bytes(tmp / "state")))
                if time.monotonic() >= next_line:
                    next_line += 60
                    audit = sorted(p.name for p in (tmp / "state" / "audit").iterdir())
                    print(
                        f"{t / 60:5.1f} min: daemon {rss[-1][1] / 1024:.0f} MiB, workers "
                        f"{workers[-1][1] / 1024:.0f} MiB, state dir {disk[-1][1] / 2**20:.1f} MiB "
                        f"({len(audit)} audit files); sent {server.sent}; "
                        f"{counters(status(tmp / 'state'), model)}",
                        flush=True,
                    )
        finally:
            daemon.send_signal(signal.SIGTERM)
            code = daemon.wait(timeout=60)
            server.stop.set()
            thread.join(timeout=5)
            log.close()
        errors = log_lines(tmp / "daemon.log", "error", "critical")
        stalls = [ln for ln in log_lines(tmp / "daemon.log", "warning") if "loop stalled" in ln]
        if args.restarts:
            problems = check_runs(tmp / "state", model, kills)
            print(f"{args.restarts} restarts ({kills} kills); daemon exit code {code}; "
                  f"{len(errors)} error lines in its log")  # fmt: skip
            for line in errors[:5] + stalls[:5]:
                print("  log:", line[:300])
            print("problems: " + ("; ".join(problems) if problems else "none"))
            sys.exit(1 if problems else 0)
        half = args.minutes * 30
        print(f"\n{server.sent} frames in {args.minutes:g} min ({args.rate:g}/s, {len(products)} "
              f"products), {server.connections} connection(s), closed with {server.close_codes}; "
              f"daemon exit code {code}; "
              f"{len(errors)} error lines in its log")  # fmt: skip
        for name, xs, unit, scale in (
            ("daemon RSS", rss, "KiB", 1),
            ("sandbox workers' RSS", workers, "KiB", 1),
            ("state dir", disk, "KiB", 1024),
        ):
            first = slope([(t, v // scale) for t, v in xs if t < half])
            second = slope([(t, v // scale) for t, v in xs if t >= half])
            print(
                f"{name:22} growth per minute: first half {first:+9.1f} {unit}, "
                f"second half {second:+9.1f} {unit}; at the end {xs[-1][1] // scale:,} {unit}"
            )
        for line in errors[:5] + stalls[:5]:
            print("  log:", line[:300])


if __name__ == "__main__":
    main()
