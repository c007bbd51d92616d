"""Opening a file the operator named (a config, a replay, a recording, an event).

Links are followed (config management keeps them), but only a regular file is
read: the open never blocks (``O_NONBLOCK``), so a FIFO or a device named by
mistake is an error at once instead of a command, or a daemon, that waits
forever or reads ``/dev/zero`` until memory runs out. Files the agents'
authors write go through the stricter :mod:`hooks_runtime.safe_read`.
"""

from __future__ import annotations

import errno
import gzip
import io
import os
import stat
from pathlib import Path
from typing import BinaryIO, TextIO


class InputFileError(OSError):
    """Not a regular file (a directory, FIFO, socket, device), or too large; says
    only that (``strerror``): callers name the file."""

    def __str__(self) -> str:
        return str(self.strerror)


def open_input(path: Path) -> BinaryIO:
    """``path`` opened for binary reading, if it is a regular file (OSError if not)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a directory" if stat.S_ISDIR(mode) else f"mode {stat.filemode(mode)}"
            raise InputFileError(errno.EINVAL, f"not a regular file ({kind})")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_input(path: Path, max_bytes: int) -> bytes:
    """The bytes of the regular file ``path``; OSError past ``max_bytes``."""
    with open_input(path) as fh:
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise InputFileError(errno.EFBIG, f"larger than {max_bytes} bytes")
    return data


def open_text(path: Path, *, newline: str | None = None) -> TextIO:
    """The regular file ``path`` as UTF-8 text, decompressed if its name ends in
    ``.gz`` (closing it closes the file too)."""
    raw = open_input(path)
    if path.name.endswith(".gz"):
        return io.TextIOWrapper(_Gunzip(raw), encoding="utf-8", newline=newline)
    return io.TextIOWrapper(raw, encoding="utf-8", newline=newline)


class _Gunzip(gzip.GzipFile):
    """A gzip reader that owns the file it reads (``GzipFile`` leaves a file object
    it was given open)."""

    def __init__(self, raw: BinaryIO) -> None:
        super().__init__(fileobj=raw, mode="rb")
        self._raw = raw

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._raw.close()
