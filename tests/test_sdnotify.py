"""sd_notify over a datagram socket bound by the test."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from daemon.sdnotify import Notifier


def test_messages_reach_a_bound_socket(tmp_path: Path) -> None:
    """READY, RELOADING (with MONOTONIC_USEC), STOPPING, STATUS and WATCHDOG arrive as sent."""
    path = tmp_path / "n.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        n = Notifier({"NOTIFY_SOCKET": str(path)})
        n.ready("up")
        n.reloading()
        n.stopping()
        n.status("two\nlines")
        n.watchdog()
        got = [sock.recv(1024).decode() for _ in range(5)]
    assert got[0] == "READY=1\nSTATUS=up"
    assert got[1].startswith("RELOADING=1\nMONOTONIC_USEC=")
    assert int(got[1].split("=")[-1]) > 0
    assert got[2:] == ["STOPPING=1", "STATUS=two", "WATCHDOG=1"]


def test_abstract_socket_name() -> None:
    """An '@' address means a Linux abstract socket."""
    name = f"marketwake-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        Notifier({"NOTIFY_SOCKET": "@" + name}).ready()
        assert sock.recv(64) == b"READY=1"


def test_outside_systemd_is_a_no_op() -> None:
    """Without NOTIFY_SOCKET nothing is sent and nothing fails."""
    n = Notifier({})
    assert not n.enabled
    n.ready()
    assert n.watchdog_interval is None


def test_watchdog_interval_is_half_and_respects_pid() -> None:
    """Ping every WATCHDOG_USEC/2, and only when WATCHDOG_PID is ours or unset."""
    assert Notifier({"WATCHDOG_USEC": "30000000"}).watchdog_interval == 15.0
    other = {"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid() + 1)}
    assert Notifier(other).watchdog_interval is None


def test_send_failure_is_ignored(tmp_path: Path) -> None:
    """A dead socket path is logged, not raised."""
    Notifier({"NOTIFY_SOCKET": str(tmp_path / "missing.sock")}).ready()
