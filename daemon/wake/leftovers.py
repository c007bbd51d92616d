"""A command run's program that outlived the daemon: known by its process, stopped at
the next start.

The command runner starts each program in its own session, so its process group
is the program and everything it started. A stop kills that group, but a kill -9
of the daemon cannot: started by hand (not under the systemd unit, which stops
the whole control group), the program goes on. The run store keeps the program's
pid and its start time (``/proc/<pid>/stat``, in clock ticks since boot), and the
next start kills what is left of the group before a re-run could overlap it.

The start time and the boot guard against a reused pid: a live process with that
pid that started at another time, or any process after a reboot, is someone
else's, and nothing is killed. A group whose
leader has exited may still hold members: while it does, Linux gives its id to
no new process, so the leader's pid still names it.
"""

from __future__ import annotations

import os
import signal
from typing import NamedTuple


class ProcessMark(NamedTuple):
    """A process as the run store keeps it: its pid, when it started, in which boot."""

    pid: int
    started: int  # clock ticks after boot (field 22 of /proc/<pid>/stat)
    boot: str = ""  # /proc/sys/kernel/random/boot_id ("" unknown: matches no boot)


def boot_id() -> str:
    """This boot's id ("" if it does not read)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            return f.read(64).decode("ascii", "replace").strip()
    except OSError:
        return ""


def start_ticks(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks after boot; None: no such process (or no
    /proc); -1: a stat that does not read (no process is known by it)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return parse_start(f.read())
    except OSError:
        return None


def parse_start(stat: bytes) -> int:
    """The start time in a ``/proc/<pid>/stat`` line (-1 if it does not read)."""
    # The name (field 2) is in parentheses and may hold anything: fields after the last ")".
    fields = stat[stat.rfind(b")") + 2 :].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return -1


def mark(pid: int) -> ProcessMark | None:
    """``pid`` as the store keeps it; None if it is already gone (or unknowable)."""
    started, boot = start_ticks(pid), boot_id()
    if started is None or started < 0 or not boot:
        return None
    return ProcessMark(pid, started, boot)


def stop_group(m: ProcessMark) -> bool:
    """Kill what is left of the process group ``m`` led; True if any was left."""
    if m.pid <= 1 or m.pid == os.getpgrp():
        return False  # a damaged store: killpg(0) or (1) would hit the daemon or init
    if not m.boot or m.boot != boot_id():
        return False  # the machine booted since: no process of that run is left
    now = start_ticks(m.pid)
    if now is not None and now != m.started:
        return False  # the pid is another process's now (or unknowable): not ours
    try:
        os.killpg(m.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return False
    return True
