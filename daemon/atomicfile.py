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
from pathlib import Path


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` (OSError if it cannot; the old file then stays)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
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
