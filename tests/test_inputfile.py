"""Files the operator names are read only if regular: a FIFO or device is an error at
once, never a wait (or /dev/zero read until memory runs out)."""

from __future__ import annotations

import gzip
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from daemon.errors import ReplayError
from daemon.inputfile import open_text, read_input
from feeds.config import ReplaySection
from feeds.replay import ReplayFeed

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path


def test_only_regular_files_within_the_cap(tmp_path: Path, fifo: Path) -> None:
    for path, why in [(fifo, "not a regular file (mode p"), (tmp_path, "(a directory)"),
                      (Path("/dev/zero"), "not a regular file (mode c")]:  # fmt: skip
        with pytest.raises(OSError) as err:
            read_input(path, 100)
        assert why in str(err.value) and str(path) not in str(err.value)
    big = tmp_path / "big"
    big.write_bytes(b"x" * 101)
    with pytest.raises(OSError, match="larger than 100 bytes"):
        read_input(big, 100)
    assert read_input(big, 101) == b"x" * 101
    link = tmp_path / "link"
    link.symlink_to(big)  # an operator's link is fine
    assert read_input(link, 200) == b"x" * 101


def test_text_plain_and_gzipped_close_what_they_open(tmp_path: Path) -> None:
    """(pytest turns an unclosed file's ResourceWarning into an error)"""
    plain, packed = tmp_path / "a.csv", tmp_path / "a.csv.gz"
    plain.write_text("1,2\n3,4\n")
    packed.write_bytes(gzip.compress(b"1,2\n3,4\n"))
    for path in (plain, packed):
        with open_text(path) as fh:
            assert fh.read() == "1,2\n3,4\n"


def _zip(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_the_one_file_of_a_zip_and_what_is_no_such_zip(tmp_path: Path) -> None:
    """A .zip of one file reads as that file (as Binance serves its candles), and
    closing it closes the archive's file; two files, a text named .zip and a damaged
    member are OSErrors saying so, leaving no file open."""
    rows = b"".join(b"%d,2\n" % i for i in range(20_000))
    good = _zip(tmp_path / "a.zip", {"BTCUSDT-5m-2025-01.csv": rows})
    before = _open_fds()
    with open_text(good) as fh:
        assert fh.read() == rows.decode()
    assert _open_fds() == before
    two = _zip(tmp_path / "two.zip", {"a.csv": b"1\n", "b.csv": b"2\n"})
    text = tmp_path / "text.zip"
    text.write_text("1,2\n")
    for path, why in [(two, "must hold one file, this one holds 2 (a.csv, b.csv)"),
                      (text, "not a zip archive")]:  # fmt: skip
        with pytest.raises(OSError, match=re.escape(why)):
            open_text(path)
        assert _open_fds() == before
    for flag, method, why in ((1, 0, "is encrypted"), (0, 9, "compression method")):
        odd = bytearray(_zip(tmp_path / "odd.zip", {"a.csv": b"1\n"}).read_bytes())
        central = odd.find(b"PK\x01\x02")  # flags and method, in both headers
        odd[6] |= flag
        odd[central + 8] |= flag
        if method:
            odd[8] = odd[central + 10] = method  # 9: deflate64, which Python cannot read
        (tmp_path / "odd.zip").write_bytes(bytes(odd))
        with pytest.raises(OSError, match=f"cannot read a.csv: .*{why}"):
            open_text(tmp_path / "odd.zip")
        assert _open_fds() == before
    damaged = tmp_path / "damaged.zip"
    data = bytearray(good.read_bytes())
    data[100:110] = b"\xff" * 10  # inside the compressed member
    damaged.write_bytes(bytes(data))
    with pytest.raises(OSError, match="damaged zip archive"), open_text(damaged) as fh:
        fh.read()
    assert _open_fds() == before


def test_a_damaged_gzip_file_reads_as_an_oserror(tmp_path: Path) -> None:
    """Damaged deflate data (zlib's error, which is no OSError) ended a backtest, or
    a daemon's start on a replay, with a traceback; it is an OSError saying so, as a
    bad CRC or a cut file are, and the replay's error names the file and line."""
    rows = b"".join(b"%d,2\n" % i for i in range(20_000))
    data = bytearray(gzip.compress(rows, mtime=0))
    data[100:110] = b"\xff" * 10  # inside the deflate stream: "invalid block type"
    path = tmp_path / "damaged.csv.gz"
    path.write_bytes(bytes(data))
    before = _open_fds()
    for read in ("read", "readline"):
        with pytest.raises(OSError, match="damaged gzip file"), open_text(path) as fh:
            getattr(fh, read)()
    assert _open_fds() == before
    feed = ReplayFeed(ReplaySection(enabled=True, path=str(path), format="csv", symbol="X"))
    with pytest.raises(ReplayError, match=r"damaged\.csv\.gz:1: cannot read: damaged gzip"):
        list(feed.selected())


def test_a_replay_of_a_fifo_fails_at_once(fifo: Path) -> None:
    feed = ReplayFeed(ReplaySection(enabled=True, path=str(fifo)))
    with pytest.raises(ReplayError, match="not a regular file"):
        list(feed.selected())


def test_commands_refuse_a_fifo_instead_of_waiting(fifo: Path) -> None:
    exe = [sys.executable, "-m", "daemon.cli"]
    for args in (["config", "check", str(fifo)],
                 ["hooks", "test", "agents/example", "--event", str(fifo)],
                 ["hooks", "test", "agents/example", "--recording", str(fifo), "--event-id", "x"],
                 ["rag", "query", "--params", str(fifo)]):  # fmt: skip
        done = subprocess.run(
            [*exe, *args], cwd=ROOT, capture_output=True, text=True, timeout=30, check=False
        )
        assert done.returncode in (1, 2) and "not a regular file" in done.stderr, (args, done)
