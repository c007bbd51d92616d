"""Open a JSON-lines file for appending after a crash may have torn its last line.

A process killed in the middle of a write leaves a last line without its
newline. Appending straight after it would glue the next run's first line to
the fragment, and a reader would lose both. Before the first append the tail
is repaired: a fragment is cut off (``torn="truncate"``, for files another
program parses strictly, like a recording the replay reads) or ended with a
newline (``torn="terminate"``, for the audit log: nothing written is ever
removed, and readers skip a line that does not parse).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO, Literal

import structlog

log = structlog.get_logger("files")
_TAIL = 1 << 16  # look this far back for the last newline before giving up


def repair_tail(path: Path, torn: Literal["truncate", "terminate"]) -> int:
    """Make ``path`` end with a newline (or be empty); returns the bytes of the torn
    last line (0 when there was none or the file does not exist)."""
    try:
        fh = path.open("r+b")
    except FileNotFoundError:
        return 0
    with fh:
        size = fh.seek(0, os.SEEK_END)
        if size == 0:
            return 0
        fh.seek(size - 1)
        if fh.read(1) == b"\n":
            return 0
        start = max(0, size - _TAIL)
        fh.seek(start)
        cut = fh.read().rfind(b"\n")
        keep = start + cut + 1 if cut >= 0 else (0 if start == 0 else size)
        fragment = size - keep
        if torn == "truncate" and keep != size:
            fh.truncate(keep)
        else:
            fh.seek(0, os.SEEK_END)
            fh.write(b"\n")
        fh.flush()
        os.fsync(fh.fileno())
    log.warning("torn last line repaired", path=str(path), bytes=fragment, action=torn)
    return fragment


def open_append(
    path: Path, torn: Literal["truncate", "terminate"], *, buffering: int = -1
) -> BinaryIO:
    """``path`` opened for appending whole lines, its torn tail repaired first."""
    repair_tail(path, torn)
    return path.open("ab", buffering=buffering)
