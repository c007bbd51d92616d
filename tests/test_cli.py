"""The CLI end to end, as a subprocess: config errors, run/reload/stop under sd_notify, demo."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from daemon.events import decode
from daemon.logs import configure
from feeds.synthetic import generate_candles

EXE = [sys.executable, "-m", "daemon.cli"]
ROOT = Path(__file__).resolve().parent.parent
HOOK = ROOT / "agents" / "example" / "hooks" / "wake_two_green.py"


def mw(*args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    done: subprocess.CompletedProcess[str] = subprocess.run(
        [*EXE, *args], capture_output=True, text=True, timeout=60, cwd=ROOT, check=False, **kw
    )
    return done


def test_help_lists_commands() -> None:
    """--help names every top-level command."""
    out = mw("--help").stdout
    for cmd in ("run", "status", "config", "demo", "hooks", "audit", "rag", "agent", "copytrade"):
        assert cmd in out


@pytest.mark.parametrize("args", [["status", "--help"], ["why", "--help"], ["audit", "tail", "-h"]])
def test_operator_commands_load_only_what_they_use(args: list[str]) -> None:
    """A command imports its own module only: `status` or `why` in a terminal does not
    pay for the LLM runner, its tools and their HTTP stack (~0.3 s each start)."""
    probe = (
        "import sys\n"
        "from daemon.cli.main import main\n"
        f"sys.argv = ['marketwake', *{args!r}]\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "heavy = [m for m in ('aiohttp', 'daemon.tools', 'daemon.llm.runner') "
        "if m in sys.modules]\n"
        "print('heavy:', heavy)\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    assert "heavy: []" in res.stdout, res.stdout


def test_every_command_loads() -> None:
    """Each listed command imports and is a click command with help."""
    from click.testing import CliRunner

    from daemon.cli.main import COMMANDS, cli

    for name in COMMANDS:
        res = CliRunner().invoke(cli, [name, "--help"])
        assert res.exit_code == 0 and "Usage:" in res.output, (name, res.output)


def test_help_lists_the_commands_as_their_own_help_would() -> None:
    """`--help` lists the commands from summaries kept beside their names (importing
    every command took over a second): the list is what click makes of each
    command's own help, at any terminal width."""
    import click

    from daemon.cli.main import cli

    for width in (60, 80, 120, 200):
        ctx = click.Context(cli, terminal_width=width, max_content_width=width)
        lazy, real = ctx.make_formatter(), ctx.make_formatter()
        cli.format_commands(ctx, lazy)
        click.Group.format_commands(cli, ctx, real)  # imports every command
        assert lazy.getvalue() == real.getvalue(), width


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["audit", "tail", "-n", "-3"], "--lines"),
        (["copytrade", "status", "--last", "-1"], "--last"),
        (["rag", "query", "--port", "99999"], "--port"),
        (["rag", "query", "--port", "-1"], "--port"),
        (["rag", "serve", "--port", "0"], "--port"),
        (["hooks", "test", str(HOOK), "--timeout-ms", "-5"], "--timeout-ms"),
        (["demo", "--candles", "5"], "--candles"),
        (["demo", "--speed", "-3"], "--speed"),
        (["rag", "ingest", "--from-exchange", "--symbol", "BTCUSDT", "--days", "-3"], "--days"),
        # a range lets nan through (it compares false) and, unbounded, inf: a NaN hook
        # budget stopped every worker, a NaN baseline was a traceback
        (["hooks", "test", str(HOOK), "--timeout-ms", "nan"], "--timeout-ms"),
        (["demo", "--speed", "nan"], "--speed"),
        (["audit", "tail", "--poll", "inf"], "--poll"),
        (["rag", "ingest", "--from-exchange", "--symbol", "BTCUSDT", "--days", "inf"], "--days"),
    ],
)
def test_out_of_range_numbers_are_refused_naming_the_option(args: list[str], option: str) -> None:
    """A negative count or an impossible port is a usage error (exit 2) that names the
    option, not an empty answer or a connection error."""
    from click.testing import CliRunner

    from daemon.cli.main import cli

    res = CliRunner().invoke(cli, args, input="{}")
    assert res.exit_code == 2 and option in res.output, res.output


def test_bad_config_exits_2_naming_the_key(tmp_path: Path) -> None:
    """`config check` and `run` reject a typo with the key path, before starting anything."""
    bad = tmp_path / "bad.toml"
    bad.write_text("[feeds.candles]\nenabeld = true\n")
    for args in (("config", "check", str(bad)), ("run", "--config", str(bad))):
        res = mw(*args)
        assert res.returncode == 2
        assert "feeds.candles: unknown key 'enabeld'" in res.stderr


def test_config_check_ok() -> None:
    """The shipped config passes `config check`."""
    res = mw("config", "check", "config.toml")
    assert res.returncode == 0, res.stderr
    assert "coinbase_ws, candles" in res.stdout


def test_log_redaction_hides_secret_values() -> None:
    """Secret-looking keys never reach the rendered log line."""
    buf = io.StringIO()
    configure("json", "info", stream=buf)
    structlog.get_logger("t").info("connect", api_key="hunter2", url="ws://x")
    structlog.reset_defaults()
    line = json.loads(buf.getvalue())
    assert line["api_key"] == "***" and line["url"] == "ws://x"


@contextlib.contextmanager
def _notify_socket(tmp_path: Path) -> Iterator[tuple[socket.socket, dict[str, str]]]:
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        yield sock, {**os.environ, "NOTIFY_SOCKET": str(path)}


def _spawn(args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*EXE, *args], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )


def _recv_until(sock: socket.socket, want: str, timeout: float = 20) -> list[str]:
    got: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            got.append(sock.recv(4096).decode())
        except TimeoutError:
            break
        if any(want in g for g in got):
            return got
    raise AssertionError(f"{want!r} not received; got {got}")


def test_run_reload_and_graceful_stop(tmp_path: Path) -> None:
    """READY once up; SIGHUP gives RELOADING then READY; SIGTERM drains, records, exits 0."""
    csv = tmp_path / "c.csv"
    generate_candles(csv, seed=1, n=5000, timeframe="1m")
    rec = tmp_path / "rec.jsonl"
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'[daemon]\nstate_dir = "{tmp_path / "state"}"\nlog_format = "json"\n'
        f'[feeds.replay]\nenabled = true\npath = "{csv}"\nsymbol = "BTC-USD"\n'
        'timeframe = "1m"\nspeed = 6000.0\n'
    )
    sock_path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(sock_path))
        env = {**os.environ, "NOTIFY_SOCKET": str(sock_path)}
        proc = subprocess.Popen(
            [*EXE, "run", "--config", str(cfg), "--record", str(rec)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            _recv_until(sock, "READY=1")
            live = mw("status", "--state-dir", str(tmp_path / "state"))
            assert f"daemon: running (pid {proc.pid}, status as of now)" in live.stdout, live.stderr
            # A second daemon on the same state dir is refused, and leaves no trace.
            second = mw("run", "--config", str(cfg))
            assert second.returncode == 2
            assert f"state dir {tmp_path / 'state'} is in use by pid {proc.pid}" in second.stderr
            again = mw("status", "--state-dir", str(tmp_path / "state"))
            assert f"daemon: running (pid {proc.pid}," in again.stdout
            proc.send_signal(signal.SIGHUP)
            got = _recv_until(sock, "READY=1")
            assert any(g.startswith("RELOADING=1") for g in got)
            proc.send_signal(signal.SIGTERM)
            _recv_until(sock, "STOPPING=1")
            assert proc.wait(timeout=20) == 0
        finally:
            proc.kill()
            stderr = proc.communicate()[1].decode()
    events = [decode(line) for line in rec.read_bytes().splitlines()]
    assert 0 < len(events) < 5000 * 2  # stopped early; reload restarts the replay
    status = json.loads((tmp_path / "state" / "status.json").read_text())
    assert status["running"] is False
    assert status["bus"]["published"] == len(events)
    assert "config reloaded; feeds restarted" in stderr


def test_demo_runs_offline(tmp_path: Path) -> None:
    """`marketwake demo` replays synthetic candles and prints a summary."""
    res = mw("demo", "--dir", str(tmp_path), "--candles", "120", "--speed", "0", "--quiet")
    assert res.returncode == 0, res.stderr
    assert "SYNTHETIC" in res.stdout and "summary" in res.stdout
    assert re.search(r"^  market\.candle\.closed +120$", res.stdout, re.MULTILINE), res.stdout
    assert "(seed 7) as fast as possible;" in " ".join(res.stdout.split())  # not "at 0x"
    recorded = [decode(line) for line in (tmp_path / "recording.jsonl").read_bytes().splitlines()]
    assert sum(e.topic == "market.candle.closed" for e in recorded) == 120
    # the paper broker's account events are on the bus (and in the recording) too
    assert all(e.topic.startswith(("market.", "account.")) for e in recorded)


def test_demo_without_agents_says_how_to_name_them(tmp_path: Path) -> None:
    args = ["--dir", str(tmp_path / "d"), "--candles", "20", "--speed", "0", "--quiet"]
    res = mw("demo", *args, "--agents", str(tmp_path / "none"))
    assert res.returncode == 0, res.stderr
    said = " ".join(res.stdout.split())
    assert "running without hooks (--agents DIR names one" in said, res.stdout
    # the two read-back sections say why they are empty, not just their titles
    assert "none: no agent traded" in said and "none: no hook was evaluated" in said, said


def test_demo_refuses_a_dir_it_did_not_make(tmp_path: Path) -> None:
    """Each demo replaces state/ in --dir: --dir . beside a live daemon's state is
    refused, not emptied."""
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "paper.sqlite3").write_bytes(b"live")
    res = mw("demo", "--dir", str(tmp_path), "--candles", "20", "--speed", "0", "--quiet")
    assert res.returncode == 2 and "did not write (state)" in res.stderr, res.stderr
    assert (tmp_path / "state" / "paper.sqlite3").read_bytes() == b"live"


@pytest.mark.parametrize("speed", ["2400", "0"])
def test_demo_copytrade_shows_a_follower_at_half_the_leaders_size(
    tmp_path: Path, speed: str
) -> None:
    """`demo --copytrade`: a leader agent trades the synthetic data, the shipped follower
    mirrors it; the two accounts side by side, the follower at half size and PnL. Also
    as fast as possible (speed 0): each candle's fills, signals and copies are handled
    before the next candle, so the copies are as on a paced replay."""
    res = mw(
        "demo", "--dir", str(tmp_path), "--candles", "240", "--speed", speed, "--quiet",
        "--copytrade",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    rows = {
        line.split()[0]: line.split()[-2:]
        for line in res.stdout.splitlines()
        if line.strip().startswith(("fills ", "bought ", "realized "))
    }
    leader_fills, follower_fills = (int(n) for n in rows["fills"])
    assert leader_fills >= 2 and follower_fills == leader_fills
    bought = [float(x) for x in rows["bought"]]
    assert bought[1] == bought[0] / 2
    pnl = [float(x.replace(",", "")) for x in rows["realized"]]
    assert abs(pnl[1] - pnl[0] / 2) < 0.02 * abs(pnl[0]) + 0.01
    assert "copytrade.signal.opened" in res.stdout and "risk rejected" not in res.stdout
    # The state dir alone is enough for `copytrade status`: the follower is the demo's
    # (./agents ships it disabled), and the leader agent's signals are listed.
    shown = mw("copytrade", "status", "--state-dir", str(tmp_path / "state"), "--json")
    assert shown.returncode == 0, shown.stderr
    status = json.loads(shown.stdout)
    assert status["positions"] and status["lastSignals"]
    for position in status["positions"]:
        assert position["followers"]["follower"]["quantity"] == position["quantity"] / 2


def test_demo_streams_decisions_and_its_commands_work_when_pasted(tmp_path: Path) -> None:
    """The default demo shows WAKEs, the crash ALERT and runs as they happen, explains
    how the WAKE decisions became runs, and each next-step command it prints runs
    as printed in a shell (the binary may not be on PATH)."""
    res = mw("demo", "--dir", str(tmp_path), "--speed", "0")
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert " example wake_two_green WAKE Two consecutive green candles" in out
    assert " example wake_crash_alert ALERT BTC-USD " in out
    assert " example run example-" in out and " finished in " in out
    assert "168 WAKE decisions -> 103 agent runs:" in out
    assert "65 suppressed: [wake] max_runs_per_hour was used up" in out
    # the trading result, as status shows it, before the commands to try next
    account = out.index("  account example (agent example) as of 2024-01-01 12:00:00: realized ")
    assert account < out.index("tail it:")
    commands = [
        line.split(":", 1)[1].strip()
        for line in out.splitlines()
        if line.strip().startswith(("tail it:", "status:", "ask why:"))
    ]
    assert len(commands) == 3
    for command in commands:
        ran = subprocess.run(
            command, shell=True, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
        )
        assert ran.returncode == 0, (command, ran.stderr)
        assert ran.stdout.strip(), command


def test_status_after_a_run(tmp_path: Path) -> None:
    """`marketwake status` reads the last status.json: not running, bus counters, feeds."""
    assert mw("demo", "--dir", str(tmp_path), "--candles", "30", "--speed", "0", "--quiet")
    res = mw("status", "--state-dir", str(tmp_path / "state"))
    assert res.returncode == 0, res.stderr
    assert "daemon: not running" in res.stdout
    assert "bus: published " in res.stdout
    assert "feed replay: finished" in res.stdout
    assert "hooks: 90 evaluations" in res.stdout and "agent example: 3 hooks" in res.stdout
    missing = mw("status", "--state-dir", str(tmp_path / "nothing"))
    assert missing.returncode == 1 and "has the daemon run?" in missing.stderr


def _replay_config(tmp_path: Path, path: Path, speed: float = 0.0) -> Path:
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'[daemon]\nstate_dir = "{tmp_path / "state"}"\nlog_format = "json"\n'
        f"[hooks]\nenabled = false\n"
        f'[feeds.replay]\nenabled = true\npath = "{path}"\nsymbol = "BTC-USD"\n'
        f'timeframe = "1m"\nspeed = {speed}\n'
    )
    return cfg


def test_missing_replay_file_fails_fast_with_one_line(tmp_path: Path) -> None:
    """A feed that cannot start stops the daemon before READY with a one-line error."""
    res = mw("run", "--config", str(_replay_config(tmp_path, tmp_path / "nope.csv")))
    assert res.returncode == 2, res.stderr
    assert "error:" in res.stderr and "nope.csv" in res.stderr
    assert "Traceback" not in res.stderr


def test_feed_failing_mid_run_is_contained_and_reported(tmp_path: Path) -> None:
    """A replay that hits a broken line after starting is marked failed; the events before
    it were processed and recorded; the exit status says a feed failed."""
    csv = tmp_path / "c.csv"
    generate_candles(csv, seed=1, n=50, timeframe="1m")
    lines = csv.read_text().splitlines()
    csv.write_text("\n".join([*lines[:31], "garbage,row", *lines[31:]]) + "\n")
    rec = tmp_path / "rec.jsonl"
    res = mw("run", "--config", str(_replay_config(tmp_path, csv)), "--record", str(rec))
    assert res.returncode == 1
    assert "feed(s) failed: replay" in res.stderr
    assert len(rec.read_bytes().splitlines()) == 30
    status = mw("status", "--state-dir", str(tmp_path / "state"))
    assert "feed replay: FAILED" in status.stdout


def test_bad_reload_restores_config(tmp_path: Path) -> None:
    """SIGHUP with a config whose feed cannot start restores the old feeds (READY follows)."""
    csv = tmp_path / "c.csv"
    generate_candles(csv, seed=1, n=5000, timeframe="1m")
    cfg = _replay_config(tmp_path, csv, speed=3000.0)
    with _notify_socket(tmp_path) as (sock, env):
        proc = _spawn(["run", "--config", str(cfg)], env)
        try:
            _recv_until(sock, "READY=1")
            cfg.write_text(cfg.read_text().replace(str(csv), str(tmp_path / "gone.csv")))
            proc.send_signal(signal.SIGHUP)
            _recv_until(sock, "READY=1")
            assert proc.poll() is None, "still running on the old config"
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=20) == 0
        finally:
            proc.kill()
            stderr = proc.communicate()[1].decode()
    assert "restarting the previous config" in stderr


SLOW_HOOK = """
def evaluate(event, state):
    x = 0
    for i in range(20000):
        x += i
    return {"decision": "IGNORE", "reason": "slow " + str(x)}
"""


def test_stop_drains_every_queued_event_even_on_a_second_term(tmp_path: Path) -> None:
    """After SIGTERM every event already on the bus (in the slow agent's queue or,
    past its 64 events, in its backlog on disk: the replay goes on at the pace of
    the quick agent beside it) is evaluated and audited; a second SIGTERM during
    that drain is ignored; exit 0."""
    hooks = tmp_path / "agents" / "slow" / "hooks"
    hooks.mkdir(parents=True)
    (hooks / "wake_slow.py").write_text(SLOW_HOOK)
    quick = tmp_path / "agents" / "quick" / "hooks"
    quick.mkdir(parents=True)
    (quick / "wake_quick.py").write_text(
        'def evaluate(event, state):\n    return {"decision": "IGNORE", "reason": "quick"}\n'
    )
    csv = tmp_path / "c.csv"
    generate_candles(csv, seed=1, n=20_000, timeframe="1m")
    cfg = _replay_config(tmp_path, csv, speed=120_000)  # 2,000 candles a second
    text = cfg.read_text().replace("[hooks]\nenabled = false\n", "")
    # a stop timeout no loaded box reaches: this test is about what the drain covers
    text = text.replace("[daemon]\n", "[daemon]\nstop_timeout_seconds = 60.0\n")
    cfg.write_text(
        text + f'[bus]\nqueue_size = 64\n[hooks]\nagents_dir = "{tmp_path / "agents"}"\n'
    )
    rec = tmp_path / "rec.jsonl"
    with _notify_socket(tmp_path) as (sock, env):
        proc = _spawn(["run", "--config", str(cfg), "--record", str(rec)], env)
        try:
            _recv_until(sock, "READY=1")
            time.sleep(0.5)
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=90) == 0
        finally:
            proc.kill()
            stderr = proc.communicate()[1].decode()
    recorded = [decode(line) for line in rec.read_bytes().splitlines()]
    audited = []
    for f in (tmp_path / "state" / "audit").glob("audit-*.jsonl"):
        audited += [json.loads(x) for x in f.read_text().splitlines()]
    hook_ids = [r["eventId"] for r in audited if r["type"] == "hook" and r["agentId"] == "slow"]
    assert 64 < len(recorded) < 20_000  # stopped by the signal, not by the file's end
    assert hook_ids == [e.event_id for e in recorded]
    assert "signal ignored: already stopping" in stderr
    lines = [json.loads(x) for x in stderr.splitlines() if x.startswith("{")]
    (stop,) = [x for x in lines if x["event"] == "signal received; draining"]
    assert stop["on_disk"] > 0, stop  # at the signal the agent lagged past its queue,
    assert (tmp_path / "state" / "backlog" / "slow.jsonl").stat().st_size == 0  # drained


def test_sigterm_during_a_lagging_replay_stops_within_10_seconds(tmp_path: Path) -> None:
    """A replay far ahead of a slow agent (thousands of events queued): SIGTERM ends the
    process within 10 s (in fact the 3 s drain and little else); what the agent did
    not finish is re-delivered at the restart."""
    hooks = tmp_path / "agents" / "slow" / "hooks"
    hooks.mkdir(parents=True)
    (hooks / "wake_slow.py").write_text(
        SLOW_HOOK.replace("range(20000)", "range(200000)")  # ~10 ms a candle
    )
    csv = tmp_path / "c.csv"
    generate_candles(csv, seed=1, n=20_000, timeframe="1m")
    cfg = _replay_config(tmp_path, csv)
    text = cfg.read_text().replace("[hooks]\nenabled = false\n", "")
    cfg.write_text(
        text.replace("[daemon]\n", "[daemon]\nstop_timeout_seconds = 3.0\n")
        + f'[hooks]\nagents_dir = "{tmp_path / "agents"}"\n'
    )
    with _notify_socket(tmp_path) as (sock, env):
        proc = _spawn(["run", "--config", str(cfg)], env)
        try:
            _recv_until(sock, "READY=1")
            time.sleep(1.0)  # the agent falls behind: the bus queue fills
            proc.send_signal(signal.SIGTERM)
            sent = time.monotonic()
            assert proc.wait(timeout=10) == 0
            took = time.monotonic() - sent
        finally:
            proc.kill()
            stderr = proc.communicate()[1].decode()
    # the drain's 3 s and little else: a feed held back by the agent stops at its next
    # event (it went on for up to 256 more, each waiting ~10 ms on the agent: 5-8 s)
    assert took < 6
    assert "drain cut" in stderr
    # the cut agent task never meets a store already closed under it
    assert "event handling failed" not in stderr and "Traceback" not in stderr
    status = json.loads((tmp_path / "state" / "status.json").read_text())
    assert status["running"] is False


def test_a_deliberate_error_does_not_hide_what_failed_beside_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A task group failing with a bug (or a full disk's OSError) and a store error
    printed only the store error: the cause is now shown too, whole."""
    from daemon.cli import main as entry
    from daemon.errors import StoreError

    def fails(**_: object) -> None:
        raise ExceptionGroup("stop", [OSError(28, "No space left on device"), StoreError("lost")])

    monkeypatch.setattr(entry.cli, "main", fails)
    with pytest.raises(SystemExit) as ended:
        entry.main()
    err = capsys.readouterr().err
    assert ended.value.code == StoreError("x").exit_code
    assert "OSError: [Errno 28] No space left on device" in err and err.endswith("error: lost\n")


@pytest.mark.parametrize("bad", ["fifo", "link", "garbage"])
def test_a_status_file_that_is_not_one_neither_hangs_nor_crashes_a_reader(
    tmp_path: Path, bad: str
) -> None:
    """status.json as a FIFO hung `status` and `copytrade status` (which now reads it
    for the agents dir) on open; a link or garbage is refused by name, and
    copytrade status goes on with the config's agents."""
    from click.testing import CliRunner

    from daemon.cli.main import cli

    state = tmp_path / "state"
    state.mkdir()
    path = state / "status.json"
    if bad == "fifo":
        os.mkfifo(path)
    elif bad == "link":
        (tmp_path / "elsewhere.json").write_text("{}")
        path.symlink_to(tmp_path / "elsewhere.json")
    else:
        path.write_bytes(b"\xff{not json")
    shown = CliRunner().invoke(cli, ["status", "--state-dir", str(state)])
    assert shown.exit_code == 1 and str(path) in shown.output, shown.output
    mirrored = CliRunner().invoke(cli, ["copytrade", "status", "--state-dir", str(state)])
    assert mirrored.exit_code == 0 and "LEADERS" in mirrored.output, mirrored.output
