"""The worker pool end to end: deadlines and respawn, isolation between evaluations and
agents, process hygiene, hardening layers, backoff and pause, recycling, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anyio
import pytest
from click.testing import CliRunner, Result

from daemon.cli.main import cli
from daemon.errors import SandboxUnavailable
from hooks_runtime import (
    HookBreaker,
    HookSpec,
    SandboxConfig,
    WorkerPool,
    open_worker_pool,
    spec_from_source,
)
from hooks_runtime.decisions import Ignore, Wake
from hooks_runtime.process import WORKER_ENV, WorkerProcess, worker_sys_path
from hooks_runtime.protocol import Batch, HookCall, Ready, encode_state
from tests.sandbox.conftest import SECRET_VALUE, TEST_CONFIG, Sentinels
from tests.sandbox.test_hostile import CANARY, EVENT, STATE

LOOP = spec_from_source("wake_loop", "wake", "def evaluate(e, s):\n    while True:\n        pass\n")
FAIL = spec_from_source("wake_fail", "wake", "def evaluate(e, s):\n    return 1 / 0\n")


def _ok(hook_id: str, reason: str = "ok") -> HookSpec:
    src = f'def evaluate(e, s):\n    return {{"decision": "IGNORE", "reason": "{reason}"}}\n'
    return spec_from_source(hook_id, "wake", src)


def _read(path: str) -> str:
    return Path(path).read_bytes().decode()


async def _eventually(cond: Callable[[], bool]) -> bool:
    """Poll ``cond`` for up to 5 s: reaping happens in a thread we cannot await."""
    for _ in range(500):
        if cond():
            return True
        await anyio.sleep(0.01)
    return False


async def test_timeout_blames_only_the_overrunning_hook(pool: WorkerPool) -> None:
    """The looping hook gets `timeout`; hooks before and after it still get decisions,
    the after ones on a fresh worker, and the killed worker is reaped."""
    a, b = _ok("wake_a"), _ok("wake_b")
    await pool.compile("t1", [a, LOOP, b])  # warm: sources compiled
    old = pool.worker_pids()["t1"]
    t0 = time.monotonic()
    results = await pool.evaluate("t1", [a, LOOP, b], EVENT, STATE)
    elapsed = time.monotonic() - t0
    assert [r.error_kind for r in results] == [None, "timeout", None]
    assert results[2].decision == Ignore(reason="ok")
    assert pool.worker_pids()["t1"] != old
    assert await _eventually(lambda: not os.path.exists(f"/proc/{old}"))
    budget = TEST_CONFIG.timeout_ms / 1000
    assert budget <= elapsed < budget + 1.0


async def test_other_agents_are_served_while_one_hangs(pool: WorkerPool) -> None:
    """Agents have their own workers: a bystander's evaluations finish during a hang."""
    done: list[float] = []

    async def bystander() -> None:
        for _ in range(10):
            r = await pool.evaluate("calm", [CANARY], EVENT, STATE)
            assert r[0].ok
        done.append(time.monotonic())

    await pool.evaluate("calm", [CANARY], EVENT, STATE)  # both workers up
    await pool.compile("hung", [LOOP])
    t0 = time.monotonic()
    async with anyio.create_task_group() as tg:
        tg.start_soon(pool.evaluate, "hung", [LOOP], EVENT, STATE)
        tg.start_soon(bystander)
    assert done and done[0] - t0 < TEST_CONFIG.timeout_ms / 1000


async def test_worker_process_hygiene(pool: WorkerPool, sentinels: Sentinels) -> None:
    """Minimal env (no secret), own session, deleted cwd, only IPC fds, limits and
    no_new_privs visible from outside in /proc."""
    await pool.evaluate("hyg", [CANARY], EVENT, STATE)
    pid = pool.worker_pids()["hyg"]
    try:
        environ = _read(f"/proc/{pid}/environ")
    except PermissionError:
        pytest.skip("cannot read another process's environ here")
    assert sorted(environ.strip("\0").split("\0")) == sorted(
        f"{k}={v}" for k, v in WORKER_ENV.items()
    )
    assert SECRET_VALUE not in environ
    assert os.getpgid(pid) == pid and os.getsid(pid) == pid
    assert os.readlink(f"/proc/{pid}/cwd").endswith("(deleted)")
    assert pool.ready is not None and pool.ready.fds == [0, 1, 2, 3, 4, 5]
    status = _read(f"/proc/{pid}/status")
    assert "NoNewPrivs:\t1" in status and "Threads:\t1\n" in status
    if "seccomp" in pool.ready.active:
        assert "Seccomp:\t2" in status
    limits = _read(f"/proc/{pid}/limits")
    assert f"Max address space         {TEST_CONFIG.memory_mb * 1024 * 1024}" in limits
    assert "Max file size             0" in limits and "Max processes             0" in limits


def _children() -> dict[int, str]:
    """pid -> state letter of every child of this process."""
    out = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid():
            out[int(stat.parent.name)] = fields[0]
    return out


async def test_process_tree_matches_pool(pool: WorkerPool) -> None:
    """After kills and respawns, our only children are the live workers and spares."""
    await pool.compile("tree", [LOOP])
    await pool.evaluate("tree", [LOOP], EVENT, STATE)

    def expected() -> set[int]:
        # Read each time: the killed worker's replacement may still be spawning a spare.
        return set(pool.worker_pids().values()) | set(pool.spare_pids())

    await _eventually(lambda: set(_children()) == expected())
    kids = _children()
    assert set(kids) == expected() and "Z" not in kids.values()


async def test_a_pool_closed_by_a_cancellation_reaps_its_workers() -> None:
    """Cancelled from outside (the daemon's stop, a failing sibling task), the pool still
    waits for every worker it killed: none is left a zombie (the reaping task was
    cancelled before it waited)."""
    pids: list[int] = []
    with anyio.CancelScope() as scope:
        async with open_worker_pool(SandboxConfig()) as pool:
            await pool.evaluate("z", [CANARY], EVENT, STATE)
            pids += [*pool.worker_pids().values(), *pool.spare_pids()]
            scope.cancel()
            await anyio.sleep_forever()
    assert pids and [p for p in pids if _present(p)] == []


def _present(pid: int) -> bool:
    """Whether ``pid`` is a process still (running, or a zombie nobody waited for)."""
    return os.path.exists(f"/proc/{pid}")


async def test_layers_report(pool_layers: Ready) -> None:
    """Report which hardening layers are active on this machine (printed with -s/-rA)."""
    print(f"\nsandbox layers active: {pool_layers.active}; missing: {pool_layers.missing}")
    assert {"fds", "rlimits", "no_new_privs"} <= set(pool_layers.active)


@pytest.fixture(scope="module")
async def pool_layers(pool: WorkerPool) -> Ready:
    """The READY report of the shared pool."""
    assert pool.ready is not None
    return pool.ready


async def test_cancelled_evaluation_does_not_poison_the_agent(pool: WorkerPool) -> None:
    """Cancelling a caller mid-batch kills that worker; the agent's next batch is clean."""
    await pool.evaluate("cx", [CANARY], EVENT, STATE)
    old = pool.worker_pids()["cx"]
    with anyio.move_on_after(0.05):
        await pool.evaluate("cx", [LOOP, CANARY], EVENT, STATE)
    results = await pool.evaluate("cx", [CANARY], EVENT, STATE)
    assert results[0].ok and pool.worker_pids()["cx"] != old
    assert await _eventually(lambda: not os.path.exists(f"/proc/{old}"))


async def test_missing_required_layer_refuses_to_run() -> None:
    """A sandbox that would claim a layer it lacks refuses to start instead."""
    cfg = SandboxConfig(seccomp=False, require_layers=["rlimits", "seccomp"])
    with pytest.raises(SandboxUnavailable, match="seccomp: disabled by config"):
        async with open_worker_pool(cfg):
            pass


async def test_failing_hook_backs_off_then_pauses(pool: WorkerPool) -> None:
    """Consecutive failures back off, then pause; skipped hooks do not run; resume lifts it."""
    now = [100.0]
    pool.breaker = HookBreaker(1.0, 60.0, 3, clock=lambda: now[0])
    kinds = []
    for _ in range(3):
        kinds.append((await pool.evaluate("bo", [FAIL, CANARY], EVENT, STATE))[0].error_kind)
        kinds.append((await pool.evaluate("bo", [FAIL, CANARY], EVENT, STATE))[0].error_kind)
        now[0] += 10
    assert kinds == ["runtime", "backoff", "runtime", "backoff", "runtime", "paused"]
    now[0] += 1e6
    paused = await pool.evaluate("bo", [FAIL, CANARY], EVENT, STATE)
    assert paused[0].error_kind == "paused" and "hooks resume" in (paused[0].error or "")
    assert paused[1].ok
    assert pool.resume("bo", "wake_fail")
    assert (await pool.evaluate("bo", [FAIL], EVENT, STATE))[0].error_kind == "runtime"


async def test_globals_do_not_carry_over(pool: WorkerPool) -> None:
    """Module globals are rebuilt for every evaluation: the counter never passes 1."""
    src = (
        "SEEN = []\nCOUNT = 0\n"
        "def evaluate(e, s):\n    global COUNT\n    COUNT += 1\n    SEEN.append(1)\n"
        '    return {"decision": "IGNORE", "reason": str(COUNT + len(SEEN))}\n'
    )
    hook = spec_from_source("wake_counter", "wake", src)
    reasons = [(await pool.evaluate("g", [hook, hook], EVENT, STATE)) for _ in range(3)]
    assert {r.decision.reason for rs in reasons for r in rs if r.decision} == {"2"}


async def test_same_revision_same_event_same_decision(pool: WorkerPool) -> None:
    """`random` is seeded from (revision, eventId): replays decide exactly like live runs."""
    src = (
        "import random\ndef evaluate(e, s):\n"
        '    return {"decision": "IGNORE", "reason": str(random.random())}\n'
    )
    hook = spec_from_source("wake_rand", "wake", src)
    first = await pool.evaluate("r1", [hook], EVENT, STATE)
    again = await pool.evaluate("r2", [hook], EVENT, STATE)
    other = await pool.evaluate("r1", [hook], {**EVENT, "eventId": "other"}, STATE)
    assert first[0].decision == again[0].decision != other[0].decision


async def test_new_revision_that_fails_compile_leaves_old_one_usable(pool: WorkerPool) -> None:
    """compile() reports a bad revision per hook; the previous revision still evaluates."""
    good = _ok("wake_rev", "v1")
    bad = spec_from_source("wake_rev", "wake", "def evaluate(e, s)\n")
    other = _ok("wake_other")
    checked = await pool.compile("rev", [bad, other])
    assert [r.error_kind for r in checked] == ["compile", None]
    results = await pool.evaluate("rev", [good, other], EVENT, STATE)
    assert results[0].decision == Ignore(reason="v1") and results[1].ok


async def test_memory_error_and_recycling_replace_the_worker() -> None:
    """A MemoryError retires the worker after the batch; so does the evaluation count."""
    cfg = SandboxConfig(timeout_ms=500, recycle_after=3)
    hog = spec_from_source("wake_hog", "wake", "def evaluate(e, s):\n    x = [0] * 10**9\n")
    async with open_worker_pool(cfg) as p:
        await p.evaluate("m", [hog], EVENT, STATE)
        assert "m" not in p.worker_pids()
        r = await p.evaluate("m", [CANARY], EVENT, STATE)
        pid = p.worker_pids()["m"]
        assert r[0].ok
        await p.evaluate("m", [CANARY, CANARY], EVENT, STATE)  # 3rd evaluation: recycled
        assert "m" not in p.worker_pids()
        await p.evaluate("m", [CANARY], EVENT, STATE)
        assert p.worker_pids()["m"] != pid


async def test_rss_threshold_recycles_the_worker() -> None:
    """A worker whose RSS exceeds recycle_rss_mb is replaced (checked every 64 batches)."""
    async with open_worker_pool(SandboxConfig(recycle_rss_mb=1)) as p:
        await p.evaluate("rss", [CANARY], EVENT, STATE)
        pid = p.worker_pids()["rss"]
        for _ in range(63):
            assert p.worker_pids()["rss"] == pid
            await p.evaluate("rss", [CANARY], EVENT, STATE)
        assert "rss" not in p.worker_pids()


LAYER_PROBE = r"""
import json, os, socket, sys, threading
sys.path[:0] = json.loads(sys.argv[1])
from hooks_runtime import hardening
from hooks_runtime.config import SandboxConfig
sentinel, port = sys.argv[2], int(sys.argv[3])
active, missing = hardening.harden(SandboxConfig(), os.getppid())
out = {"active": active}
def attempt(name, fn):
    try:
        fn()
        out[name] = "allowed"
    except BaseException as e:
        out[name] = type(e).__name__
attempt("socket", lambda: socket.create_connection(("127.0.0.1", port), timeout=2))
attempt("fork", lambda: os._exit(0) if os.fork() == 0 else None)
attempt("exec", lambda: os.execv("/bin/sh", ["sh", "-c", "touch " + sentinel]))
attempt("write_file", lambda: open(sentinel, "w").write("x"))
attempt("read_passwd", lambda: open("/etc/passwd").read())
attempt("read_environ", lambda: open("/proc/self/environ").read())
attempt("kill_parent", lambda: os.kill(os.getppid(), 0))
attempt("big_alloc", lambda: bytearray(1 << 30))
t = threading.Thread(target=lambda: None)
attempt("thread", lambda: (t.start(), t.join()))
print(json.dumps(out))
"""


def test_os_layers_stop_escape_primitives(sentinels: Sentinels) -> None:
    """If RestrictedPython were bypassed, the OS layers still refuse sockets, fork, exec,
    file reads/writes, signals to others and big allocations (each per active layer)."""
    args = [json.dumps(worker_sys_path()), str(sentinels.file), str(sentinels.port)]
    proc = subprocess.run(
        [sys.executable, "-I", "-S", "-c", LAYER_PROBE, *args],
        capture_output=True,
        env=WORKER_ENV,
        timeout=30,
        check=True,
    )
    out = json.loads(proc.stdout)
    print(f"\nOS layer probe: {out}")
    assert out["big_alloc"] == "MemoryError"
    if "seccomp" in out["active"]:
        for name in ("socket", "fork", "exec", "kill_parent"):
            assert out[name] == "PermissionError", name
        assert out["thread"] == "allowed"
    if "landlock" in out["active"]:
        for name in ("write_file", "read_passwd", "read_environ"):
            assert out[name] == "PermissionError", name
    sentinels.check([])


def invoke(args: list[str]) -> Result:
    """The CLI in a fresh thread: this module's async tests keep anyio's test runner
    alive, and with sniffio installed (the model SDKs need it) the CLI's own
    ``anyio.run`` would think it already runs inside asyncio on this thread."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(CliRunner().invoke, cli, args).result()


@pytest.mark.parametrize(
    ("event", "hook", "decision"),
    [
        ("candle", "wake_two_green", "WAKE"),
        ("doji", "autotrade_doji_reversal", "TRADE_INTENT"),
        ("crash", "wake_crash_alert", "ALERT"),
        ("slide", "wake_crash_alert", "ALERT"),
    ],
)
def test_cli_runs_the_example_agent(tmp_path: Path, event: str, hook: str, decision: str) -> None:
    """`marketwake hooks test agents/example` evaluates every example hook in one worker."""
    green = [{"open": 1.0, "high": 2.2, "low": 0.9, "close": 2.0, "closeTime": "t1"}] * 2
    doji = [
        {"open": 2.0, "high": 2.1, "low": 0.9, "close": 1.0, "closeTime": "t1"},
        {"open": 1.0, "high": 1.5, "low": 0.5, "close": 1.05, "closeTime": "t2"},
    ]
    red = {"open": 100.0, "high": 100.0, "low": 98.0, "close": 99.0, "closeTime": "t"}
    slide = [red] * 9 + [{"open": 95.0, "high": 95.0, "low": 89.0, "close": 90.0, "closeTime": "t"}]
    base = {"eventId": "e", "ts": "2026-01-01T00:05:00.000Z", "source": "t", "symbol": "BTC-USD"}
    events = {
        "candle": ({**base, "topic": "market.candle.closed", "timeframe": "5m", "payload": {}}, green),
        "doji": ({**base, "topic": "market.candle.closed", "timeframe": "5m", "payload": {}}, doji),
        "crash": ({**base, "topic": "market.price.tick", "payload": {"percentChange24h": -12.5}}, []),
        "slide": ({**base, "topic": "market.candle.closed", "timeframe": "5m", "payload": {}}, slide),
    }  # fmt: skip
    ev, candles = events[event]
    (tmp_path / "e.json").write_text(json.dumps(ev))
    (tmp_path / "s.json").write_text(json.dumps({"candles": {"BTC-USD": {"5m": candles}}}))
    agent = Path(__file__).parents[2] / "agents" / "example"
    args = ["hooks", "test", str(agent), "--event", str(tmp_path / "e.json")]
    res = invoke([*args, "--state", str(tmp_path / "s.json")])
    assert res.exit_code == 0, res.output
    lines = [json.loads(ln) for ln in res.stdout.splitlines()]
    assert len(lines) == 3
    by_hook = {ln["hook"]: ln for ln in lines}
    assert by_hook[hook]["decision"]["decision"] == decision
    others = [ln["decision"]["decision"] for h, ln in by_hook.items() if h != hook]
    assert others == ["IGNORE", "IGNORE"]
    if event == "doji":  # sized in quote currency: 250 of it at any price
        intent = by_hook[hook]["decision"]["intent"]
        assert 249.99 < intent["volume"] * intent["openPrice"] <= 250.0
    if event == "slide":
        assert by_hook[hook]["decision"]["reason"] == (
            "BTC-USD 10.00% below its high of the last 10 candles"
        )


def test_cli_fails_on_a_bad_hook(tmp_path: Path) -> None:
    """A hook that raises is printed as a recorded error and the exit code is 1."""
    hook = tmp_path / "wake_bad.py"
    hook.write_text("def evaluate(event, state):\n    return event['nope']\n")
    (tmp_path / "e.json").write_text(json.dumps(EVENT))
    res = invoke(["hooks", "test", str(hook), "--event", str(tmp_path / "e.json")])
    assert res.exit_code == 1
    line = json.loads(res.stdout.splitlines()[0])
    assert line["error_kind"] == "runtime" and "KeyError" in line["error"]


async def test_failed_spawns_back_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """When workers cannot start, evaluate raises SandboxUnavailable without a spawn storm."""
    calls = []

    async def broken(cfg: SandboxConfig) -> object:
        calls.append(cfg)
        raise SandboxUnavailable("worker failed to start: simulated")

    async with open_worker_pool(SandboxConfig(spare_workers=0)) as p:
        assert (await p.evaluate("a", [CANARY], EVENT, STATE))[0].ok  # the first worker
        monkeypatch.setattr(WorkerProcess, "start", broken)
        for _ in range(3):
            with pytest.raises(SandboxUnavailable, match="simulated"):
                await p.evaluate("b", [CANARY], EVENT, STATE)
        assert len(calls) == 1
        assert (await p.evaluate("a", [CANARY], EVENT, STATE))[0].ok  # others unaffected


FD_PROBE = r"""
import json, os, sys
sys.path[:0] = json.loads(sys.argv[1])
from hooks_runtime import hardening
ipc_in, ipc_out, bell = hardening.isolate_fds(0)
os.write(1, b"LEAK1")
os.write(2, b"LEAK2")
print("LEAK3")
sys.stdout.flush()
os.write(ipc_out, json.dumps([ipc_in, ipc_out, bell, hardening.open_fds()]).encode())
"""


def test_stdout_writes_never_reach_the_ipc_channel() -> None:
    """After fd isolation, fd 1/2 and print() go to /dev/null; only the IPC fd reaches us."""
    proc = subprocess.run(
        [sys.executable, "-I", "-S", "-c", FD_PROBE, json.dumps(worker_sys_path())],
        capture_output=True,
        stdin=subprocess.DEVNULL,
        env=WORKER_ENV,
        timeout=30,
        check=True,
    )
    assert b"LEAK" not in proc.stdout + proc.stderr
    ipc_in, ipc_out, bell, fds = json.loads(proc.stdout)
    assert {ipc_in, ipc_out, bell} <= set(fds) and min(ipc_in, ipc_out, bell) > 2


LEGIT = spec_from_source(
    "wake_legit",
    "wake",
    """
import datetime
import math
import random
import statistics
from decimal import ROUND_HALF_UP, Decimal, localcontext


def sma(values, n):
    window = list(values)[-n:]
    return sum(window) / len(window)


def evaluate(event, state):
    closes = [c["close"] for c in state["candles"]["BTC-USD"]["5m"]]
    ts = datetime.datetime.strptime(event["ts"][:19], "%Y-%m-%dT%H:%M:%S")
    later = ts.replace(tzinfo=datetime.UTC) + datetime.timedelta(minutes=5)
    with localcontext(prec=6):
        price = Decimal(str(event["payload"]["price"])) * Decimal("1.1")
    sizes = {}
    sizes["a"] = 1
    total = 0
    for i, c in enumerate(closes):
        total += c * (i + 1)
    a, (b, c) = 1, (2, 3)
    data = {
        "sma": sma(closes, 2),
        "stdev": round(statistics.pstdev(closes), 6),
        "median": statistics.median(closes),
        "later": later.isoformat(),
        "price": str(price.quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)),
        "sqrt": math.sqrt(16),
        "rand": 0 <= random.random() < 1,
        "sorted": sorted(closes, reverse=True),
        "zip": [list(p) for p in zip(closes, closes)],
        "fmt": f"{total:.1f}|{'%05.1f' % 3.14159}|{a + b + c}",
        "upper": "é".upper() + "x".encode("utf-16").hex()[:4],
        "keys": sorted(dict(state["candles"]["BTC-USD"]["5m"][0])),
    }
    print("computed", len(data))
    return {"decision": "WAKE", "reason": "ok", "data": data, "cooldownSeconds": 1.5}
""",
)


async def test_legitimate_hooks_have_a_useful_standard_surface(pool: WorkerPool) -> None:
    """Under every layer, the allowed stdlib surface works (strptime, statistics, decimal,
    f-strings, unpacking, codecs) and the decision comes back intact."""
    r = (await pool.evaluate("legit", [LEGIT], EVENT, STATE))[0]
    assert r.ok, r
    assert r.decision is not None and r.output == "computed 12\n"
    assert r.decision.data == {
        "sma": 100.0,
        "stdev": 1.0,
        "median": 100.0,
        "later": "2026-01-01T00:10:01+00:00",
        "price": "110.55",
        "sqrt": 4.0,
        "rand": True,
        "sorted": [101.0, 99.0],
        "zip": [[99.0, 99.0], [101.0, 101.0]],
        "fmt": "301.0|003.1|6",
        "upper": "Éfffe",
        "keys": ["close", "closeTime", "open"],
    }


async def test_pre_encoded_state_is_accepted(pool: WorkerPool) -> None:
    """A state encoded once per event (for many agents) gives the same decisions."""
    from hooks_runtime import encode_state

    raw = encode_state(STATE)
    for agent in ("enc1", "enc2"):
        r = await pool.evaluate(agent, [CANARY], EVENT, raw)
        assert r[0].decision == Wake(reason="pristine")


DAEMON_PROBE = r"""
import sys, anyio
from hooks_runtime import open_worker_pool, spec_from_source

async def main():
    hook = spec_from_source("wake_x", "wake", "def evaluate(e, s):\n    return 1\n")
    async with open_worker_pool() as pool:
        await pool.evaluate("a", [hook], {"eventId": "e"}, {})
        pids = [*pool.worker_pids().values(), *pool.spare_pids()]
        print(" ".join(map(str, pids)), flush=True)
        await anyio.sleep(60)

anyio.run(main)
"""


async def test_workers_die_with_the_daemon() -> None:
    """PR_SET_PDEATHSIG: SIGKILL the daemon and its workers go too (no orphans)."""
    root = str(Path(__file__).parents[2])
    async with await anyio.open_process(
        [sys.executable, "-c", DAEMON_PROBE], cwd=root, env={**os.environ, "PYTHONPATH": root}
    ) as proc:
        assert proc.stdout is not None
        line = b""
        with anyio.fail_after(20):
            async for chunk in proc.stdout:
                line += chunk
                if line.endswith(b"\n"):
                    break
        pids = [int(p) for p in line.split()]
        assert len(pids) >= 1
        proc.kill()
        await proc.wait()
    assert await _eventually(lambda: not any(_alive(p) for p in pids))


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for init to reap it counts as dead)."""
    try:
        return _read(f"/proc/{pid}/stat").rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


async def test_worker_that_died_while_idle_blames_no_hook(pool: WorkerPool) -> None:
    """A worker killed from outside between events is replaced; no hook gets the blame."""
    import signal

    await pool.evaluate("idle", [CANARY], EVENT, STATE)
    pid = pool.worker_pids()["idle"]
    os.kill(pid, signal.SIGKILL)
    assert await _eventually(lambda: not _alive(pid))
    results = await pool.evaluate("idle", [CANARY, CANARY], EVENT, STATE)
    assert all(r.ok for r in results), results
    assert pool.worker_pids()["idle"] != pid


async def test_oversized_request_is_refused_before_sending() -> None:
    """A state larger than max_frame_bytes is the caller's error, not a hook failure."""
    from daemon.errors import HookError

    small = SandboxConfig(max_frame_bytes=10_000, max_agent_source_bytes=5_000)
    async with open_worker_pool(small) as p:
        with pytest.raises(HookError, match="exceeds max_frame_bytes"):
            await p.evaluate("big", [CANARY], EVENT, {"blob": "x" * 20_000})
        assert (await p.evaluate("big", [CANARY], EVENT, STATE))[0].ok
        assert p.breaker.failures(("big", "wake_canary")) == 0


async def test_a_value_the_protocol_cannot_carry_is_refused_before_sending(
    pool: WorkerPool,
) -> None:
    """An integer beyond 64 bits (a hand-made recording's payload) is the caller's error,
    not a hook failure, and the worker serves the next event (found by fuzzing: an
    OverflowError out of the agent's event handling)."""
    from daemon.errors import HookRequestUnsendable

    huge = {**EVENT, "payload": {"volume": 10**40}}
    with pytest.raises(HookRequestUnsendable, match="cannot be sent to the sandbox"):
        await pool.evaluate("huge", [CANARY], huge, STATE)
    assert (await pool.evaluate("huge", [CANARY], EVENT, STATE))[0].ok
    assert pool.breaker.failures(("huge", "wake_canary")) == 0


async def test_sources_that_do_not_fit_one_frame_with_the_event_are_sent_first() -> None:
    """A fresh worker needs every source; with a big state the whole would exceed the
    frame. The sources go ahead in compile-only requests that fit, then the event:
    every hook is evaluated, nothing is refused as too large."""
    cfg = SandboxConfig(max_frame_bytes=100_000, max_agent_source_bytes=90_000)
    body = "def evaluate(e, s):\n    return {'decision': 'IGNORE', 'reason': 'ok'}\n"
    pad = "# " + "x" * 20_000 + "\n"
    hooks = [spec_from_source(f"wake_big{i}", "wake", pad + body) for i in range(4)]
    state = {"blob": "y" * 40_000}  # with the 80 kB of sources: over one frame
    async with open_worker_pool(cfg) as p:
        results = await p.evaluate("big", hooks, EVENT, state)
        assert [r.error_kind for r in results] == [None] * 4, results
        again = await p.evaluate("big", hooks, EVENT, state)  # warm: no sources sent
        assert all(r.ok for r in again)


async def test_worker_command_is_isolated_python(pool: WorkerPool) -> None:
    """-I -S -B with the int_max_str_digits limit; only the needed paths are passed in."""
    from hooks_runtime.process import worker_command

    cmd = worker_command(9)
    assert cmd[:7] == [sys.executable, "-I", "-S", "-B", "-X", "int_max_str_digits=4300", "-c"]
    assert cmd[8] == "9" and all(map(os.path.isdir, cmd[9:]))
    assert pool.ready is not None and pool.ready.python == sys.version.split()[0]


async def test_polling_hands_each_result_over_as_the_worker_writes_it() -> None:
    """While the parent polls, it gets each hook's result as soon as the worker writes
    it, so it checks one result while the worker runs the next hook: the fast hook's
    result is handed over a slow hook's runtime before the slow one's."""
    fast = _ok("wake_fast")
    slow = spec_from_source(
        "wake_slow",
        "wake",
        "def evaluate(e, s):\n    n = 0\n    for i in range(2000000):\n        n += i\n"
        '    return {"decision": "IGNORE", "reason": str(n)}\n',
    )
    worker = await WorkerProcess.start(TEST_CONFIG)
    seen: list[tuple[int, float]] = []
    try:
        calls = [HookCall(h.hook_id, h.revision, h.kind, h.source) for h in (fast, slow)]
        await worker.send(worker.encoder.encode(Batch(1, EVENT, encode_state(STATE), calls)))
        results, failure, _, _ = await worker.collect(
            1,
            [5.0, 5.0],
            time.monotonic(),
            spin=5.0,
            alone=lambda: True,
            on_result=lambda r: seen.append((r.index, time.monotonic())),
        )
    finally:
        worker.kill()
        worker.proc.wait()
    assert failure is None and [r.error_kind for r in results] == ["", ""]
    assert [i for i, _ in seen] == [0, 1]
    slow_s = results[1].runtime_us / 1e6
    assert slow_s > 0.05  # long enough that a stall of the test itself cannot hide it
    assert seen[1][1] - seen[0][1] > slow_s / 2


@pytest.mark.parametrize("spin_us", [0, 2000])
async def test_polling_and_sleeping_give_the_same_outcomes(spin_us: int) -> None:
    """With polling off, or long enough to outlast a slow hook, results and blame are the same."""
    slow = spec_from_source(
        "wake_slow",
        "wake",
        "def evaluate(e, s):\n    n = 0\n    for i in range(100000):\n        n += i\n"
        '    return {"decision": "IGNORE", "reason": str(n)}\n',
    )
    cfg = SandboxConfig(timeout_ms=400, compile_timeout_ms=2000, spin_us=spin_us)
    async with open_worker_pool(cfg) as p:
        await p.compile("s", [CANARY, slow, LOOP])
        for _ in range(10):  # a lone streak, so polling kicks in when enabled
            assert (await p.evaluate("s", [CANARY], EVENT, STATE))[0].ok
        results = await p.evaluate("s", [CANARY, slow, LOOP, CANARY], EVENT, STATE)
    kinds = [r.error_kind for r in results]
    assert kinds == [None, None, "timeout", None]
    assert results[1].decision == Ignore(reason=str(sum(range(100000))))


async def test_worker_that_stops_reading_is_replaced(pool: WorkerPool) -> None:
    """A worker that no longer reads (SIGSTOP) cannot wedge the daemon's send: it is
    killed and the batch goes to a fresh worker, no hook blamed."""
    import signal

    await pool.evaluate("stop", [CANARY], EVENT, STATE)
    pid = pool.worker_pids()["stop"]
    os.kill(pid, signal.SIGSTOP)
    big = {**STATE, "blob": "x" * 300_000}  # larger than the pipe buffer
    results = await pool.evaluate("stop", [CANARY], EVENT, big)
    assert results[0].ok and pool.worker_pids()["stop"] != pid
    assert await _eventually(lambda: not _alive(pid))


def test_cli_judges_hooks_as_the_daemon_does(tmp_path: Path) -> None:
    """`hooks test` compiles first, then evaluates under the daemon's deadline: a hook
    the daemon would time out fails here too (its compile time is reported on its
    own); a malformed intent is refused naming the key; a syntax error is a compile
    error; exit 1."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "wake_slow.py").write_text(
        "def evaluate(event, state):\n"
        "    n = 0\n"
        "    for i in range(50000000):\n"
        "        n += i\n"
        "    return {'decision': 'IGNORE', 'reason': 'late'}\n"
    )
    (hooks / "autotrade_bad.py").write_text(
        "def evaluate(event, state):\n"
        "    intent = {'action': 'BUY', 'side': 'long', 'volume': -1, 'symbol': 'BTC-USD'}\n"
        "    return {'decision': 'TRADE_INTENT', 'reason': 'x', 'intent': intent}\n"
    )
    (hooks / "wake_broken.py").write_text("def evaluate(event, state)\n    return None\n")
    event = {"eventId": "e", "ts": "2026-01-01T00:00:00.000Z", "source": "t",
             "topic": "market.candle.closed", "payload": {}}  # fmt: skip
    (tmp_path / "e.json").write_text(json.dumps(event))
    res = invoke(["hooks", "test", str(tmp_path), "--event", str(tmp_path / "e.json")])
    assert res.exit_code == 1, res.output
    by_hook = {ln["hook"]: ln for ln in map(json.loads, res.stdout.splitlines())}
    assert by_hook["wake_broken"]["error_kind"] == "compile"
    slow = by_hook["wake_slow"]
    assert slow["error_kind"] == "timeout" and slow["runtime_ms"] == 250.0
    assert 0 < slow["compile_ms"] < 250
    bad = by_hook["autotrade_bad"]
    assert bad["error_kind"] == "invalid_result" and "$.intent.action" in bad["error"]


@pytest.mark.parametrize(
    ("sample", "decisions"),
    [
        ("candle_closed", {"wake_two_green": "WAKE", "wake_crash_alert": "IGNORE"}),
        ("price_tick", {"wake_crash_alert": "ALERT", "wake_two_green": "IGNORE"}),
    ],
)
def test_the_example_agent_ships_a_sample_per_event_kind(
    sample: str, decisions: dict[str, str]
) -> None:
    samples = Path(__file__).parents[2] / "agents" / "example" / "samples"
    agent = samples.parent
    res = invoke(["hooks", "test", str(agent), "--event", str(samples / f"{sample}.event.json"),
                  "--state", str(samples / f"{sample}.state.json")])  # fmt: skip
    assert res.exit_code == 0, res.output
    got = {
        ln["hook"]: ln["decision"]["decision"] for ln in map(json.loads, res.stdout.splitlines())
    }
    assert {h: got[h] for h in decisions} == decisions


def test_a_recorded_event_is_replayed_with_the_state_it_had(tmp_path: Path) -> None:
    """--recording/--event-id rebuilds the candles and indicators the hook saw (the
    state cache fed every event up to it); --from-audit does it from the daemon's
    own recording and prints what the live hooks decided."""
    import msgspec

    from daemon.cli.hooks import replay_state
    from daemon.events import MARKET_CANDLE_CLOSED, Candle, FeedEvent, iso_ms
    from feeds.config import ReplaySection

    def bar(i: int, close: float) -> FeedEvent:
        t = 1_767_225_600_000 + i * 60_000
        c = Candle(open=100.0, high=max(100.0, close) + 1, low=min(100.0, close) - 1,
                   close=close, volume=1.0, open_time_ms=t, close_time_ms=t + 60_000)  # fmt: skip
        return FeedEvent(event_id=f"t:{i}", ts=iso_ms(t + 60_000), source="t",
                         topic=MARKET_CANDLE_CLOSED, symbol="BTC-USD", timeframe="1m",
                         payload=c.payload())  # fmt: skip

    closes = [99.0] * 8 + [101.0, 102.0] + [99.0] * 5  # the 2nd green bar is event t:9
    rec = tmp_path / "rec.jsonl"
    rec.write_bytes(b"".join(msgspec.json.encode(bar(i, c)) + b"\n" for i, c in enumerate(closes)))
    event, state = replay_state([ReplaySection(path=str(rec))], "t:9", 50)
    assert event.event_id == "t:9"
    series = state["candles"]["BTC-USD"]["1m"]
    assert [c["close"] for c in series] == closes[:10]  # nothing after the event
    assert state["indicators"]["BTC-USD"]["1m"]["count"] == 10
    assert (state["positions"], state["orders"], state["lastOutputs"]) == ({}, [], {})  # no trades
    agent = Path(__file__).parents[2] / "agents" / "example"
    res = invoke(["hooks", "test", str(agent), "--recording", str(rec), "--event-id", "t:9"])
    assert res.exit_code == 0, res.output
    got = {
        ln["hook"]: ln["decision"]["decision"] for ln in map(json.loads, res.stdout.splitlines())
    }
    assert got["wake_two_green"] == "WAKE"
    missing = invoke(["hooks", "test", str(agent), "--recording", str(rec), "--event-id", "nope"])
    assert missing.exit_code == 2 and "no event with id 'nope'" in missing.output
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n')
    unrecorded = invoke(["hooks", "test", str(agent), "--from-audit", "t:9", "--config", str(cfg)])
    assert unrecorded.exit_code == 2 and "[daemon] record is empty" in unrecorded.output
    from daemon.audit.writer import AuditWriter
    from tests.audit.factory import hook

    w = AuditWriter(tmp_path / "state" / "audit")
    w.write(hook(agent_id="example", event_id="t:9", decision="WAKE", reason="live reason"))
    w.close()
    cfg.write_text(f'[daemon]\nstate_dir = "{tmp_path / "state"}"\nrecord = "{rec}"\n')
    audited = invoke(["hooks", "test", str(agent), "--from-audit", "t:9", "--config", str(cfg)])
    assert audited.exit_code == 0, audited.output
    assert "live: example/wake_two_green decided WAKE: live reason" in audited.stderr
    # the recorder moved its first part aside (record_max_mb): the green bar before t:9
    # is only in rec.jsonl.1, and two green bars are still found
    lines = rec.read_bytes().splitlines(keepends=True)
    (tmp_path / "rec.jsonl.1").write_bytes(b"".join(lines[:9]))
    rec.write_bytes(b"".join(lines[9:]))
    split = invoke(["hooks", "test", str(agent), "--from-audit", "t:9", "--config", str(cfg)])
    assert split.exit_code == 0, split.output
    decided = {
        ln["hook"]: ln["decision"]["decision"] for ln in map(json.loads, split.stdout.splitlines())
    }
    assert decided["wake_two_green"] == "WAKE"
    assert '"decision": "WAKE"' in audited.stdout


CHAIN = """
def evaluate(event, state):
    # Closures, not module names: the worker empties a hook's globals once
    # evaluate returns, and this cleanup runs after that.
    from decimal import localcontext

    def holder():
        with localcontext(prec=2):
            yield 1

    def chain(depth):
        try:
            yield 1
        finally:
            if depth == 0:
                g = chain(1)  # cleanup that leaves new cyclic garbage behind
                next(g)
                box = [g]
                box.append(box)
                h = holder()  # and a decimal context entered, not left
                next(h)
            else:
                while True:
                    pass

    g = chain(0)
    next(g)
    box = [g]
    box.append(box)
    return {"decision": "IGNORE", "reason": "trap set"}
"""

THIRD = (
    "from decimal import Decimal\n"
    "def evaluate(event, state):\n"
    "    return {'decision': 'IGNORE', 'reason': str(Decimal(1) / Decimal(3))}\n"
)


async def test_no_hook_code_runs_outside_its_own_window(pool: WorkerPool) -> None:
    """A generator's cleanup that makes new cyclic garbage (whose cleanup spins) is
    collected until none is left within the hook's own window: the trap's hook is
    the one that times out, the next hooks get their decisions, and a later hook
    computes with a fresh decimal context (28 digits, not the trap's 2)."""
    trap = spec_from_source("wake_trap", "wake", CHAIN)
    innocent = _ok("wake_innocent")
    third = spec_from_source("wake_third", "wake", THIRD)
    results = await pool.evaluate("chain", [trap, innocent, third], EVENT, STATE)
    assert [r.error_kind for r in results] == ["timeout", None, None], results
    assert results[2].decision == Ignore(reason="0.3333333333333333333333333333")


LEFTOVER = """
def spin():
    while True:
        pass

def later():
    try:
        yield 1
    finally:
        spin()  # a module name: gone by the time this cleanup runs

def evaluate(event, state):
    g = later()
    next(g)
    box = [g]
    box.append(box)
    return {"decision": "IGNORE", "reason": "left a cleanup behind"}
"""


async def test_a_leftover_cleanup_finds_the_hooks_globals_emptied(pool: WorkerPool) -> None:
    """Once evaluate returns, the hook's globals are emptied: a cleanup collected
    afterwards cannot reach the hook's module names (here, its spinning helper)."""
    hook = spec_from_source("wake_leftover", "wake", LEFTOVER)
    results = await pool.evaluate("leftover", [hook, _ok("wake_next")], EVENT, STATE)
    assert [r.error_kind for r in results] == [None, None], results
    assert results[0].decision == Ignore(reason="left a cleanup behind")


async def test_a_fresh_worker_is_sent_the_state_again(
    pool: WorkerPool, sent_batches: list[Batch]
) -> None:
    """The state a killed worker held is not assumed held by its replacement: the
    hooks re-run after a timeout get the whole state again."""
    reader = spec_from_source(
        "wake_reader",
        "wake",
        'def evaluate(e, s):\n    return {"decision": "IGNORE", "reason": s["tag"]}\n',
    )
    state = encode_state({"tag": "held"})
    first = await pool.evaluate("refill", [reader], EVENT, state)
    results = await pool.evaluate("refill", [LOOP, reader], EVENT, state)
    assert first[0].decision == Ignore(reason="held")
    assert [r.error_kind for r in results] == ["timeout", None]
    assert results[1].decision == Ignore(reason="held")
    assert [b.same_state for b in sent_batches] == [False, True, False]
    assert [len(b.hooks) for b in sent_batches] == [1, 2, 1]


HELD = """
def hold():
    try:
        yield 1
    finally:
        while True:  # locals only: runs even once the globals are gone
            pass

KEPT = hold()
next(KEPT)

def evaluate(event, state):
    return {"decision": "IGNORE", "reason": "holds a generator in a global"}
"""


async def test_a_cleanup_run_by_emptying_the_globals_is_that_hooks_timeout(
    pool: WorkerPool,
) -> None:
    """Emptying a hook's globals frees what they held, and a cleanup that then spins
    runs in that hook's window: it is the one that times out, the next hook is fine."""
    held = spec_from_source("wake_held", "wake", HELD)
    await pool.compile("held", [held])
    results = await pool.evaluate("held", [held, _ok("wake_after")], EVENT, STATE)
    assert [r.error_kind for r in results] == ["timeout", None], results
    assert results[1].decision == Ignore(reason="ok")


def test_a_moment_of_csv_candles_is_replayed_with_the_state_it_had(tmp_path: Path) -> None:
    """--recording takes CSV candles too (FILE=SYMBOL:TIMEFRAME), and --at a time
    picks the first candle closing at or after it: the hooks see the state a replay
    would have given them then (50 candles, indicators over all before)."""
    from feeds.synthetic import generate_candles

    data = tmp_path / "c.csv"
    generate_candles(data, seed=2, n=300, timeframe="5m")
    counting = tmp_path / "agent" / "hooks"
    counting.mkdir(parents=True)
    (counting / "wake_count.py").write_text(
        "def evaluate(event, state):\n"
        "    held = state['candles']['ETHUSDT']['5m']\n"
        "    count = state['indicators']['ETHUSDT']['5m']['count']\n"
        "    return {'decision': 'IGNORE', 'reason': event['ts'] + ' ' + str(len(held))\n"
        "            + ' ' + str(count)}\n"
    )
    spec = f"{data}=ETHUSDT:5m"
    res = invoke(["hooks", "test", str(counting.parent), "--recording", spec,
                  "--at", "2024-01-01T10:02"])  # fmt: skip
    assert res.exit_code == 0, res.output
    (line,) = map(json.loads, res.stdout.splitlines())
    # 10:05 is the first close at or after 10:02: the 121st candle
    assert line["decision"]["reason"] == "2024-01-01T10:05:00.000Z 50 121"
    assert "event replay:ETHUSDT:5m:1704103500000 (market.candle.closed) at 2024-01-01T10:05" in (
        res.stderr
    )
    by_id = invoke(["hooks", "test", str(counting.parent), "--recording", spec,
                    "--event-id", "replay:ETHUSDT:5m:1704103500000"])  # fmt: skip
    assert by_id.exit_code == 0 and json.loads(by_id.stdout)["decision"] == line["decision"]
    both = invoke(["hooks", "test", str(counting.parent), "--recording", spec,
                   "--at", "2024-01-01", "--event-id", "x"])  # fmt: skip
    assert both.exit_code == 2 and "--event-id or --at (one of them)" in both.output
    late = invoke(
        ["hooks", "test", str(counting.parent), "--recording", spec, "--at", "2030-01-01"]
    )
    assert late.exit_code == 2 and "no event at or after 2030-01-01T00:00:00.000Z" in late.output


def test_several_csv_files_are_merged_by_time_as_a_backtest_merges_them(tmp_path: Path) -> None:
    """--recording repeats: a hook reading 5m and 1h candles of one symbol gets both
    series, merged by time, as in a backtest (a 5m close at a full hour comes before
    that hour's close, as the files are given)."""
    from feeds.synthetic import generate_candles

    fine, coarse = tmp_path / "5m.csv", tmp_path / "1h.csv"
    generate_candles(fine, seed=2, n=300, timeframe="5m")
    generate_candles(coarse, seed=3, n=30, timeframe="1h")
    hooks = tmp_path / "agent" / "hooks"
    hooks.mkdir(parents=True)
    (hooks / "wake_both.py").write_text(
        "def evaluate(event, state):\n"
        "    held = state['candles']['ETHUSDT']\n"
        "    last = {tf: held[tf][-1]['closeTime'][11:16] for tf in sorted(held)}\n"
        "    return {'decision': 'IGNORE', 'reason': event['timeframe'] + ' ' + str(last)}\n"
    )
    specs = ["--recording", f"{fine}=ETHUSDT:5m", "--recording", f"{coarse}=ETHUSDT:1h"]
    res = invoke(["hooks", "test", str(hooks.parent), *specs, "--at", "2024-01-01T10:00"])
    assert res.exit_code == 0, res.output
    reason = json.loads(res.stdout)["decision"]["reason"]
    assert reason == "5m {'1h': '09:00', '5m': '10:00'}", reason
    later = invoke(["hooks", "test", str(hooks.parent), *specs,
                    "--event-id", "replay:ETHUSDT:1h:1704103200000"])  # fmt: skip
    assert json.loads(later.stdout)["decision"]["reason"] == "1h {'1h': '10:00', '5m': '10:00'}"
