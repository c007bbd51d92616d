"""Read a workspace file the way a hostile workspace cannot abuse.

Agent workspaces are written by hook authors, not by the operator: a file in
them may be a symlink to a secret, a hard link to another agent's hook, a FIFO
that blocks any reader, or ``/dev/zero``. Every workspace file (agent.toml,
AGENT.md, hook sources) is therefore opened without following links and
without blocking (``O_NOFOLLOW | O_NONBLOCK``), must be a regular file with a
single link, and is read up to a size cap. Refusals name the file and what to
change, and never echo its content. Blocking reads belong off the event loop.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from daemon.errors import WorkspaceFileError

_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def read_regular(path: Path, max_bytes: int, what: str) -> bytes:
    """The bytes of ``path`` if it is a plain regular file of at most ``max_bytes``."""
    try:
        fd = os.open(path, _FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise WorkspaceFileError(
                f"{path}: is a symbolic link; {what} must be a regular file inside the "
                "agent's own directory (copy the file instead of linking it)"
            ) from None
        raise WorkspaceFileError(f"{path}: cannot open: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise WorkspaceFileError(
                f"{path}: is not a regular file (a FIFO, device or directory); "
                f"{what} must be a regular file"
            )
        if st.st_nlink > 1:
            raise WorkspaceFileError(
                f"{path}: has {st.st_nlink} hard links; {what} must be a file of its own "
                "(copy it instead of linking it)"
            )
        if st.st_size > max_bytes:
            raise WorkspaceFileError(
                f"{path}: {st.st_size} bytes is over the {max_bytes}-byte limit for {what}"
            )
        chunks: list[bytes] = []
        left = max_bytes + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        raise WorkspaceFileError(f"{path}: cannot read: {exc.strerror}") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > max_bytes:  # it grew while we read it
        raise WorkspaceFileError(f"{path}: over the {max_bytes}-byte limit for {what}")
    return data


def is_plain_dir(path: Path) -> bool:
    """A directory that is not a symbolic link (checked without following it)."""
    try:
        return stat.S_ISDIR(path.lstat().st_mode)
    except OSError:
        return False
