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
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, BinaryIO, TextIO


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
    ``.gz``, or the one file of a ``.zip`` (as Binance serves its candles); closing
    it closes the file too."""
    raw = open_input(path)
    if path.name.endswith(".gz"):
        return io.TextIOWrapper(_Gunzip(raw), encoding="utf-8", newline=newline)
    if path.name.endswith(".zip"):
        return io.TextIOWrapper(_unzip(raw), encoding="utf-8", newline=newline)
    return io.TextIOWrapper(raw, encoding="utf-8", newline=newline)


def _unzip(raw: BinaryIO) -> _ZipMember:
    """The one file of the archive ``raw`` (InputFileError if it holds another number,
    or is no zip archive); closing it closes ``raw``."""
    try:
        archive = zipfile.ZipFile(raw)
    except (zipfile.BadZipFile, EOFError, OSError) as exc:
        raw.close()
        raise InputFileError(errno.EINVAL, f"not a zip archive ({exc})") from None
    try:
        files = [m for m in archive.infolist() if not m.is_dir()]
        if len(files) != 1:
            names = ", ".join(m.filename for m in files[:3])
            raise InputFileError(
                errno.EINVAL, f"a .zip must hold one file, this one holds {len(files)} ({names})"
            )
        try:
            member = archive.open(files[0])
        except (RuntimeError, NotImplementedError, zipfile.BadZipFile) as exc:
            # encrypted, or a compression method Python cannot read (deflate64...)
            raise InputFileError(errno.EINVAL, f"cannot read {files[0].filename}: {exc}") from None
        return _ZipMember(member, archive, raw)
    except BaseException:
        archive.close()
        raw.close()
        raise


@contextmanager
def _deflate_errors() -> Iterator[None]:
    try:
        yield
    except zlib.error as exc:
        raise InputFileError(errno.EIO, f"damaged gzip file ({exc})") from None


class _Gunzip(gzip.GzipFile):
    """A gzip reader that owns the file it reads (``GzipFile`` leaves a file object
    it was given open). Damaged deflate data reads as an OSError, as a bad header,
    a bad CRC or a cut file do (zlib's own error is none: it ended a backtest or a
    daemon's start with a traceback)."""

    def __init__(self, raw: BinaryIO) -> None:
        super().__init__(fileobj=raw, mode="rb")
        self._raw = raw

    def read(self, size: int | None = -1) -> bytes:
        with _deflate_errors():
            return super().read(-1 if size is None else size)

    def read1(self, size: int = -1) -> bytes:
        with _deflate_errors():
            return super().read1(size)

    def readline(self, size: int | None = -1) -> bytes:
        with _deflate_errors():
            return super().readline(-1 if size is None else size)

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._raw.close()


class _ZipMember(io.BufferedIOBase):
    """A zip archive's member that closes its archive with it; a damaged member
    (a bad CRC, a cut archive) reads as an OSError, as a damaged gzip file does."""

    def __init__(self, member: IO[bytes], archive: zipfile.ZipFile, raw: BinaryIO) -> None:
        super().__init__()
        self._member = member
        self._archive = archive
        self._raw = raw

    @property
    def name(self) -> str:
        return str(getattr(self._member, "name", ""))

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        try:
            return self._member.read(-1 if size is None else size)
        except (zipfile.BadZipFile, EOFError, zlib.error) as exc:
            raise InputFileError(errno.EIO, f"damaged zip archive ({exc})") from None

    def read1(self, size: int = -1) -> bytes:
        return self.read(size)

    def close(self) -> None:
        try:
            self._member.close()
            self._archive.close()  # not the file it was given:
        finally:
            self._raw.close()
            super().close()
