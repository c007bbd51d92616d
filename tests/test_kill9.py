"""kill -9 at random moments during a replay: every close evaluated once (never stopped by
its own dedupe claim), no order twice."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from feeds.synthetic import generate_candles
from tests.loopback import serve_posts

ROOT = Path(__file__).resolve().parent.parent
N = 5000
KILLS = 12  # half of them once the daemon is ready (in the replay itself)
WAKE = """
def evaluate(event, state):
    return {"decision": "WAKE", "reason": "w", "dedupeKey": "k:" + event["eventId"]}
"""
TRADE = """
def evaluate(event, state):
    c = event["payload"]["close"]
    if int(event["payload"]["closeTimeMs"] / 60000) % 10:
        return {"decision": "IGNORE", "reason": "not now"}
    return {"decision": "TRADE_INTENT", "reason": "buy", "dedupeKey": "t:" + event["eventId"],
            "intent": {"action": "PLACE_MARKET_ORDER", "symbol": event["symbol"], "side": "buy",
                       "volume": 0.001, "stopLoss": c * 0.5}}
"""


HOOKS = ("wake_every", "autotrade_tenth")


def event_ids(csv: Path) -> list[str]:
    rows = csv.read_text().splitlines()[1:]
    return [f"replay:BTC-USD:1m:{int(r.split(',')[0]) + 60_000}" for r in rows]


def audit_rows(state: Path) -> list[dict[str, Any]]:
    rows = []
    for f in sorted((state / "audit").glob("audit-*.jsonl")):
        for line in f.read_bytes().splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                pass  # a line torn by the kill
    return rows


def _errors(logs: Path) -> list[str]:
    """Warning and error lines of the killed runs: what to look at when a close is lost."""
    out = []
    for f in sorted(logs.glob("*.log")):
        for line in f.read_text(errors="replace").splitlines():
            if '"level": "error"' in line or '"level": "warning"' in line or "Traceback" in line:
                out.append(f"{f.name}: {line[:300]}")
    return out[:20]


def alive(pid: int) -> bool:
    """``pid`` runs (a zombie, killed and not reaped yet, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :][:1] not in (b"Z", b"X")


def wait_ready(log: Path, proc: subprocess.Popen[bytes], limit: float = 30.0) -> None:
    """Until the daemon's log says it is ready (its feeds are publishing)."""
    deadline = time.monotonic() + limit
    while b'"daemon ready"' not in log.read_bytes():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_bytes()[-2000:]
        time.sleep(0.02)


# A dozen daemon starts: on a slow, shared machine well past the suite's 60 s.
@pytest.mark.timeout(240)
def test_kill_9_at_12_random_moments_evaluates_every_close_once(tmp_path: Path) -> None:
    csv = tmp_path / "c.csv"
    generate_candles(csv, seed=9, n=N, timeframe="1m")
    hooks = tmp_path / "agents" / "a" / "hooks"
    hooks.mkdir(parents=True)
    (hooks / "wake_every.py").write_text(WAKE)
    (hooks / "autotrade_tenth.py").write_text(TRADE)
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'[daemon]\nstate_dir = "{tmp_path / "state"}"\nlog_format = "json"\n'
        f'[hooks]\nagents_dir = "{tmp_path / "agents"}"\n'
        f'[feeds.replay]\nenabled = true\npath = "{csv}"\nsymbol = "BTC-USD"\n'
        'timeframe = "1m"\nspeed = 0\n'  # flat out: a few seconds in all
    )
    rng = random.Random(20261124)
    cmd = [sys.executable, "-m", "daemon.cli", "run", "--config", str(cfg)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    logs = tmp_path / "logs"
    logs.mkdir()
    for n in range(KILLS):
        with (
            (logs / f"run-{n:02}.log").open("wb") as err,
            subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err) as proc,
        ):
            if n % 2:  # every other kill lands in the replay itself, however slow the start
                wait_ready(logs / f"run-{n:02}.log", proc)
            time.sleep(rng.uniform(0.2, 1.2))
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]

    rows = audit_rows(tmp_path / "state")
    evaluated = Counter((r["eventId"], r["hookId"]) for r in rows if r["type"] == "hook")
    missing = [(e, h) for e in event_ids(csv) for h in HOOKS if (e, h) not in evaluated]
    assert not missing, f"no close missing: {missing[:5]}; {_errors(logs)}"
    assert len(evaluated) == 2 * N
    assert set(evaluated.values()) == {1}, [k for k, n in evaluated.items() if n > 1][:5]
    # Every key is the event's own: a row suppressed by dedupe is an event evaluated
    # again after a kill that took its first rows, and stopped by its own first claim
    # (the audit then denies a wake that ran, an order that was placed).
    own = [(r["eventId"], r["hookId"]) for r in rows if r.get("suppressedBy") == "dedupe"]
    assert not own, f"{len(own)} decisions suppressed by their own claim: {own[:3]}"
    placed = Counter(
        r["clientOrderId"] for r in rows if r["type"] == "order" and r["role"] == "entry"
        and r["status"] == "OPEN"
    )  # fmt: skip
    assert placed and set(placed.values()) == {1}, "no order placed twice"
    assert len({r["daemonRun"] for r in rows}) > 2, "the kills did cut the replay"


def first_close_daemon(
    tmp_path: Path, decision: str, agent_toml: str = "", daemon: str = "", hooks: str = ""
) -> tuple[list[str], str]:
    """A daemon config replaying 20 generated 1m candles (speed 0) to one agent whose
    hook decides ``decision`` on the first close only: the command that runs it, and
    that close's event id. ``daemon`` / ``hooks``: more lines for those sections."""
    csv = tmp_path / "c.csv"
    generate_candles(csv, seed=3, n=20, timeframe="1m")
    first = event_ids(csv)[0]
    agent = tmp_path / "agents" / "a"
    (agent / "hooks").mkdir(parents=True)
    (agent / "hooks" / "wake_first.py").write_text(
        "def evaluate(event, state):\n"
        f"    if event['eventId'] != {first!r}:\n"
        "        return {'decision': 'IGNORE', 'reason': 'later'}\n"
        f"    return {{'decision': {decision!r}, 'reason': 'the first close'}}\n"
    )
    (agent / "agent.toml").write_text(agent_toml)
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'[daemon]\nstate_dir = "{tmp_path / "state"}"\nlog_format = "json"\n{daemon}'
        f'[hooks]\nagents_dir = "{tmp_path / "agents"}"\n{hooks}'
        f'[feeds.replay]\nenabled = true\npath = "{csv}"\nsymbol = "BTC-USD"\n'
        'timeframe = "1m"\nspeed = 0\n'
    )
    return [sys.executable, "-m", "daemon.cli", "run", "--config", str(cfg)], first


def kill_once(cmd: list[str], ready: Callable[[], bool]) -> None:
    """Start the daemon and SIGKILL it once ``ready()`` (within 60 s; it must not exit
    first)."""
    with subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL) as proc:  # fmt: skip
        deadline = time.monotonic() + 60
        while not ready():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait()


RUNNER = """
import json, os, sys, time
ctx = json.load(sys.stdin)
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "runs.txt"), "a") as out:
    ids = ",".join(r["eventId"] for r in ctx["reasons"])
    out.write(f"{os.getpid()} {ctx['runId']} {ids}\\n")
if os.path.exists(os.path.join(here, "hang")):
    time.sleep(60)
"""


@pytest.mark.timeout(120)
def test_a_wake_run_a_kill_cut_runs_again_once_at_the_next_start(tmp_path: Path) -> None:
    """``rerun_interrupted_within_seconds``: the daemon is killed while its command runner
    works on a wake; the next start closes that run as interrupted, naming its event,
    and runs the same wake once more (the runner gets the same event), then finishes
    the replay. Nothing is run a third time. The cut run's program, which outlived the
    kill (started by hand, not under the unit), is killed by the restart."""
    script = tmp_path / "runner.py"
    script.write_text(RUNNER)
    cmd, first = first_close_daemon(
        tmp_path,
        "WAKE",
        "[wake]\ndebounce_seconds = 0\ncooldown_after_run_seconds = 0\n"
        "rerun_interrupted_within_seconds = 3600\n"
        f'[wake.runner]\nkind = "command"\ncommand = ["{sys.executable}", "{script}"]\n',
    )
    runs, hang = tmp_path / "runs.txt", tmp_path / "hang"
    hang.touch()
    pids: list[int] = []
    try:
        # the run is in flight (its runner hangs)
        kill_once(cmd, lambda: runs.exists() and runs.read_text().endswith("\n"))
        pids.append(int(runs.read_text().split()[0]))
        assert alive(pids[0])  # the kill left it running (it sleeps for 60 s)
        hang.unlink()
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        assert not alive(pids[0])
        again = subprocess.run(cmd, cwd=ROOT, capture_output=True, timeout=60, check=False)
        assert again.returncode == 0, again.stderr[-2000:]
        lines = [line.split() for line in runs.read_text().splitlines()]
        pids += [int(line[0]) for line in lines[1:]]
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert [ids for *_, ids in lines] == [first, first], lines
    cut_id, rerun_id = lines[0][1], lines[1][1]
    rows = [r for r in audit_rows(tmp_path / "state") if r["type"] == "run"]
    ends = {r["runId"]: r for r in rows if r["status"] != "started"}
    assert ends[cut_id]["status"] == "failed" and ends[cut_id]["eventIds"] == [first]
    assert (
        f"its wakes run again as {rerun_id}; its program (pid {pids[0]})" in (ends[cut_id]["error"])
    )
    assert ends[cut_id]["error"].endswith("was still running: killed")
    assert ends[rerun_id]["status"] == "finished"
    assert set(ends) == {cut_id, rerun_id}


def test_an_alert_a_kill_cut_mid_post_is_posted_after_the_restart(tmp_path: Path) -> None:
    """A wall-clock replay raises one ALERT; the daemon is killed while the webhook holds
    its POST unanswered. The next start posts it again, marked redelivered, and the
    event is not evaluated again."""
    import threading

    answer = threading.Event()  # set: the webhook answers; clear: it holds each POST

    def reply(_: int) -> tuple[int, None]:
        answer.wait(30)
        return 204, None

    with serve_posts(reply) as (url, got):
        try:
            cmd, first = first_close_daemon(
                tmp_path,
                "ALERT",
                daemon='clock = "wall"\n',
                hooks=f'alert_webhook = "{url}/hook"\n',
            )
            kill_once(cmd, lambda: bool(got))  # the POST is in flight
            answer.set()
            done = subprocess.run(cmd, cwd=ROOT, capture_output=True, timeout=60, check=False)
            assert done.returncode == 0, done.stderr[-2000:]
        finally:
            answer.set()
    assert [(g["eventId"], g["redelivered"]) for g in got] == [(first, False), (first, True)]
    alerts = [r for r in audit_rows(tmp_path / "state") if r.get("decision") == "ALERT"]
    assert len(alerts) == 1


def test_what_an_llm_run_a_kill_cut_had_spent_is_counted_after_the_restart(
    tmp_path: Path,
) -> None:
    """A real daemon's LLM run makes its first model call (a tool call, 500 tokens in and
    30 out) against an OpenAI-shaped server on loopback, which then holds the second
    call: the daemon is killed there. The next start closes the run saying what it had
    used, and the day's cost in `status` counts it (it was lost: a daemon killed in
    every run never reached max_cost_per_day)."""
    import threading

    from daemon.status import read_status
    from tests.llm.fakes import openai_turn

    release = threading.Event()

    def reply(n: int) -> tuple[int, dict[str, Any]]:
        if n == 0:
            return 200, openai_turn(calls=[("c1", "get_positions", {})], usage=(500, 30))
        release.wait(30)  # the daemon is killed meanwhile
        return 200, openai_turn("Done.", usage=(100, 10))

    with serve_posts(reply) as (url, calls):
        try:
            cmd, first = first_close_daemon(
                tmp_path,
                "WAKE",
                "[wake]\ndebounce_seconds = 0\nmax_cost_per_day = 1.0\n"
                f'[wake.runner]\nkind = "llm"\nprovider = "openai"\nmodel = "fake-gpt"\n'
                f'base_url = "{url}/v1"\nprice_input_per_mtok = 2.0\nprice_output_per_mtok = 10.0\n',
            )
            kill_once(cmd, lambda: len(calls) >= 2)  # the run's second model call is in flight
            release.set()
            done = subprocess.run(cmd, cwd=ROOT, capture_output=True, timeout=60, check=False)
            assert done.returncode == 0, done.stderr[-2000:]
        finally:
            release.set()
    cost = round((500 * 2.0 + 30 * 10.0) / 1e6, 6)
    (cut,) = [
        r for r in audit_rows(tmp_path / "state") if r["type"] == "run" and r["status"] == "failed"
    ]
    assert cut["eventIds"] == [first]
    assert cut["error"].endswith(
        f"it had used 500 tokens in and 30 out (cost {cost:g}), counted in max_cost_per_day"
    )
    agent = read_status(tmp_path / "state").hooks.agents["a"]  # type: ignore[union-attr]
    assert (agent.cost_today, agent.tokens_in_today, agent.tokens_out_today) == (cost, 500, 30)
