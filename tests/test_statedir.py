"""The state dir lock: one holder, released by death, probed by `status`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from daemon.errors import StateDirInUse, StoreError
from daemon.statedir import StateDirLock, holder

HOLD = """
import sys, time
from pathlib import Path
from daemon.statedir import StateDirLock
lock = StateDirLock(Path(sys.argv[1]))
lock.acquire()
print("held", flush=True)
time.sleep(60)
"""


def test_second_lock_is_refused_with_the_holder_pid(tmp_path: Path) -> None:
    with StateDirLock(tmp_path / "s"):
        assert holder(tmp_path / "s") == os.getpid()
        with pytest.raises(StateDirInUse, match=rf"is in use by pid {os.getpid()}"):
            StateDirLock(tmp_path / "s").acquire()
    assert holder(tmp_path / "s") is None
    with StateDirLock(tmp_path / "s"):  # free again after release
        pass


def test_kill_9_frees_the_lock(tmp_path: Path) -> None:
    """A crashed daemon never blocks a restart: the kernel drops the flock."""
    with subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
    ) as proc:
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
            assert holder(tmp_path) == proc.pid
            with pytest.raises(StateDirInUse, match=str(proc.pid)):
                StateDirLock(tmp_path).acquire()
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    assert holder(tmp_path) is None
    with StateDirLock(tmp_path):
        assert holder(tmp_path) == os.getpid()


def test_a_symlinked_lock_file_is_refused(tmp_path: Path) -> None:
    """The lock is opened without following links (it is truncated and written)."""
    target = tmp_path / "precious"
    target.write_text("keep me")
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "lock").symlink_to(target)
    with pytest.raises(Exception, match="cannot open the state dir lock"):
        StateDirLock(tmp_path / "s").acquire()
    assert target.read_text() == "keep me"


def test_a_lock_file_that_is_a_fifo_or_a_directory_is_a_clear_error(tmp_path: Path) -> None:
    """(a FIFO raised OSError from ftruncate: a traceback from `run` and `backtest`)"""
    os.mkfifo(tmp_path / "lock")
    with pytest.raises(StoreError, match="not a regular file"):
        StateDirLock(tmp_path).acquire()
    (tmp_path / "d" / "lock").mkdir(parents=True)
    with pytest.raises(StoreError, match="cannot open the state dir lock"):
        StateDirLock(tmp_path / "d").acquire()
