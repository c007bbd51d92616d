"""The CLI end to end, as a subprocess: config errors, run/reload/stop under sd_notify, demo."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import structlog

from daemon.events import decode
from daemon.logs import configure
from feeds.synthetic import generate_candles

EXE = [sys.executable, "-m", "daemon.cli"]
ROOT = Path(__file__).resolve().parent.parent


def mw(*args: str, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*EXE, *args], capture_output=True, text=True, timeout=60, cwd=ROOT, check=False, **kw
    )  # type: ignore[call-overload]


def test_help_lists_commands() -> None:
    """--help names every top-level command."""
    out = mw("--help").stdout
    for cmd in ("run", "status", "config", "demo", "hooks", "audit", "rag"):
        assert cmd in out


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
    assert '"event": "config reloaded"' in stderr


def test_demo_runs_offline(tmp_path: Path) -> None:
    """`marketwake demo` replays synthetic candles and prints a summary."""
    res = mw("demo", "--dir", str(tmp_path), "--candles", "120", "--speed", "0", "--quiet")
    assert res.returncode == 0, res.stderr
    assert "SYNTHETIC" in res.stdout and "summary" in res.stdout
    assert "market.candle.closed         120" in res.stdout
    assert len((tmp_path / "recording.jsonl").read_bytes().splitlines()) == 120


def test_status_after_a_run(tmp_path: Path) -> None:
    """`marketwake status` reads the last status.json: not running, bus counters, feeds."""
    assert mw("demo", "--dir", str(tmp_path), "--candles", "30", "--speed", "0", "--quiet")
    res = mw("status", "--state-dir", str(tmp_path / "state"))
    assert res.returncode == 0, res.stderr
    assert "daemon: not running" in res.stdout
    assert "bus: published 30" in res.stdout
    assert "feed replay: finished" in res.stdout
    missing = mw("status", "--state-dir", str(tmp_path / "nothing"))
    assert missing.returncode == 1 and "has the daemon run?" in missing.stderr
