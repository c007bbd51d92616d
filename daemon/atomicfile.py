"""Whole-file writes a crash cannot leave half done.

The data goes to a temporary file beside the target, is flushed and fsynced, and
the file is renamed over the target: after a kill -9 or a power cut the target
holds the old content or the new, never a prefix. (A marker written in place was
once left empty by a kill, and the next start took it for another file.)
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from pathlib import Path

# A temporary older than this is a kill's leftover, not another writer's file.
STALE_SECONDS = 60.0


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` (OSError if it cannot; the old file then stays)."""
    prefix = f".{path.name}."
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=prefix)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _clean(path.parent, prefix)


def _clean(directory: Path, prefix: str) -> None:
    """Remove the temporaries a kill left mid-write beside the target (a kill skips
    the unlink above): each is a full copy of the file, and a state snapshot is
    written every few seconds for as long as the daemon runs."""
    old = time.time() - STALE_SECONDS
    with contextlib.suppress(OSError), os.scandir(directory) as entries:
        for entry in entries:
            if entry.name.startswith(prefix) and entry.is_file(follow_symlinks=False):
                with contextlib.suppress(OSError):
                    if entry.stat(follow_symlinks=False).st_mtime < old:
                        os.unlink(entry.path)
