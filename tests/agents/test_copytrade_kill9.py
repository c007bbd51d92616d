"""kill -9 between a leader's signal and the follower's order: after the restarts,
every accepted signal became exactly one follower order."""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from daemon.events import signal_event_id
from daemon.trading.broker import client_order_id
from daemon.trading.paper_store import PaperStore
from tests.feeds.copytrade_client import SECRET, post
from tests.feeds.copytrade_client import signal as leader_signal
from tests.test_kill9 import audit_rows

ROOT = Path(__file__).resolve().parents[2]
KILLS = 6


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_listening(port: int, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the daemon exited"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nothing listening on {port}")


# Daemon starts killed and restarted: on a slow, shared machine past the suite's 60 s.
@pytest.mark.timeout(240)
def test_kill_9_after_each_signal_still_makes_one_order_per_signal(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "agents" / "follower", tmp_path / "agents" / "follower")
    toml = tmp_path / "agents" / "follower" / "agent.toml"
    toml.write_text(toml.read_text().replace("enabled = false", "enabled = true"))
    csv = tmp_path / "price.csv"  # a BTC-USD price for the follower's risk engine
    csv.write_text(
        "open_time_ms,open,high,low,close,volume\n"
        + "".join(f"{1764072000000 + 60000 * i},96500,96500,96500,96500,1\n" for i in range(3))
    )
    port = free_port()
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'[daemon]\nstate_dir = "{tmp_path / "state"}"\nlog_format = "json"\n'
        # Rows reach the file well within a kill's 0-0.4 s, even on a loaded box.
        "[audit]\nflush_interval_seconds = 0.02\n"
        f'[hooks]\nagents_dir = "{tmp_path / "agents"}"\n'
        f'[feeds.replay]\nenabled = true\npath = "{csv}"\nsymbol = "BTC-USD"\ntimeframe = "1m"\n'
        f"[feeds.copytrade_webhook]\nenabled = true\nport = {port}\n"
        f'[feeds.copytrade_webhook.leaders.alice]\nsecret = "{SECRET}"\n'
    )
    cmd = [sys.executable, "-m", "daemon.cli", "run", "--config", str(cfg)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    url = f"http://127.0.0.1:{port}/copytrade/alice"
    rng = random.Random(20261125)
    accepted: list[str] = []
    for n in range(KILLS + 1):
        with subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        ) as proc:
            try:
                wait_listening(port, proc)
                if n < KILLS:  # the last run only finishes what the kills left
                    sid = f"s{n}"
                    body = leader_signal(
                        sid, positionId=f"p{n}", quantity=0.01, price=96500.0, stopLoss=94000.0
                    )
                    status, _ = asyncio.run(post(url, body))
                    assert status == 200
                    accepted.append(sid)
                    time.sleep(rng.uniform(0.0, 0.4))  # somewhere between answer and order
                    proc.send_signal(signal.SIGKILL)
                else:
                    time.sleep(3.0)
                    proc.send_signal(signal.SIGTERM)
            finally:
                if proc.poll() is None and n < KILLS:
                    proc.kill()
                proc.wait(timeout=60)

    # The broker's store is the truth (an order's audit row may be torn off by a kill):
    # one entry order per accepted signal, keyed by the signal, and no other entry.
    store = PaperStore(tmp_path / "state" / "paper.sqlite3")
    entries = Counter(o.client_order_id for o in store.all_orders() if o.role == "entry")
    store.close()
    want = {client_order_id("follower", signal_event_id("alice", sid)) for sid in accepted}
    assert set(entries) == want, "every accepted signal became one follower order"
    assert set(entries.values()) == {1}
    rows = audit_rows(tmp_path / "state")
    evaluated = {r["eventId"] for r in rows if r["type"] == "hook"}
    assert evaluated >= {signal_event_id("alice", sid) for sid in accepted}
    assert len({r["daemonRun"] for r in rows}) > 2, "the kills did cut the runs"
