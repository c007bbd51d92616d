"""A cut run's program that outlived the daemon: found by pid and start time, its
process group killed; a pid that is someone else's now is left alone."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from daemon.wake.leftovers import ProcessMark, boot_id, mark, parse_start, start_ticks, stop_group
from tests.test_kill9 import alive

# A real line, its name holding what a naive split trips on.
STAT = (
    b"4242 (a) b (c) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 "
    b"987654 10000000 500 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 17 1 0 0"
)


def sleeper() -> subprocess.Popen[bytes]:
    """A program in its own session that started a child of its own (its group)."""
    code = (
        "import subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        "time.sleep(60)"
    )
    return subprocess.Popen(
        [sys.executable, "-c", code], start_new_session=True, stdout=subprocess.DEVNULL
    )


def group(pgid: int) -> list[int]:
    """The live processes of process group ``pgid`` (from /proc: field 5 of a stat)."""
    pids = []
    for d in Path("/proc").iterdir():
        try:
            stat = (d / "stat").read_bytes()
        except OSError:
            continue  # not a process, or gone meanwhile
        if d.name.isdigit() and int(stat[stat.rfind(b")") + 2 :].split()[2]) == pgid:
            pids.append(int(d.name))
    return [p for p in pids if alive(p)]


def test_the_start_time_reads_past_any_name() -> None:
    assert parse_start(STAT) == 987654
    assert parse_start(b"garbage") == -1 and parse_start(b"1 (x) S 1") == -1


def test_the_group_of_a_program_still_running_is_killed_with_its_children() -> None:
    proc = sleeper()
    try:
        for _ in range(500):  # its child started
            if len(group(proc.pid)) == 2:
                break
            time.sleep(0.01)
        m = mark(proc.pid)
        assert m is not None and m.started == start_ticks(proc.pid) and m.boot == boot_id() != ""

        assert len(group(proc.pid)) == 2
        assert stop_group(m)
        proc.wait(5)
        for _ in range(500):
            if not group(proc.pid):
                break
            time.sleep(0.01)
        assert group(proc.pid) == []
    finally:
        proc.kill()
        proc.wait()


def test_a_pid_that_is_another_process_now_is_left_alone() -> None:
    proc = sleeper()
    try:
        m = mark(proc.pid)
        assert m is not None
        assert not stop_group(m._replace(started=m.started + 1))  # started at another time
        assert not stop_group(m._replace(started=-1))
        assert not stop_group(m._replace(boot="another boot"))  # the machine booted since
        assert not stop_group(m._replace(boot=""))
        assert alive(proc.pid)
    finally:
        import os
        import signal

        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert mark(proc.pid) is None and start_ticks(proc.pid) is None


def test_a_damaged_mark_kills_nothing_of_ours() -> None:
    """A run store someone edited (or a damaged one) cannot make the start kill its
    own process group (pid 0), init's (1), a negative group, or its own."""
    import os

    for pid in (0, 1, -1, -os.getpid(), os.getpgrp()):
        assert not stop_group(ProcessMark(pid, start_ticks(1) or 0, boot_id()))
    assert alive(os.getpid())
