"""The daemon's control socket: ``<state_dir>/control.sock`` answers live.

``status.json`` and the state snapshot are written every
``status_interval_seconds`` (60 by default), so reading them can be a minute
stale. While the daemon runs, ``marketwake status`` asks it over this Unix
socket instead and gets the status as of now; ``copytrade status`` asks for the
leaders' book the same way.

The protocol is one request line and one answer: the client sends ``status\\n``
or ``copytrade\\n`` (the leaders' book, as the state snapshot holds it) and
reads a JSON document until the daemon closes the connection. Anything else gets
``{"error": ...}``. Requests are capped at
64 bytes and 2 seconds, so a stuck or hostile client costs nothing; the
socket is mode 0600 from the moment it exists (the daemon's user only, whatever
the state dir's mode: the service's is 0750, for its group to read).
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final

import anyio
import msgspec
import structlog
from anyio.abc import SocketListener, SocketStream, TaskStatus

log = structlog.get_logger("control")

CONTROL_SOCKET: Final = "control.sock"
MAX_REQUEST: Final = 64
REQUEST_SECONDS: Final = 2.0
MAX_ANSWER: Final = 64 * 1024 * 1024
# sun_path holds 108 bytes on Linux, the terminating NUL included.
MAX_PATH: Final = 107


async def serve_control(
    path: Path,
    answers: Mapping[str, Callable[[], bytes]],
    *,
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve requests on ``path`` until cancelled, each by its ``answers`` entry (the
    request's name: a callable giving the bytes); the file is removed after.

    A path too long for a Unix socket (or a directory we cannot bind in) is
    logged and the daemon runs without it: ``status`` then reads the file."""
    if len(os.fsencode(path)) > MAX_PATH:
        log.warning("control socket path too long; status reads status.json", path=str(path))
        task_status.started()
        return
    try:
        _remove(path)  # a previous run's, left by a crash (we hold the state dir's lock)
        _sweep_staging(path.parent)
        listener = await SocketListener.from_socket(_bind_private(path))
    except OSError as exc:
        log.warning("control socket unavailable; status reads status.json", error=str(exc))
        task_status.started()
        return
    try:
        task_status.started()

        async def handle(conn: SocketStream) -> None:
            async with conn:
                await _answer(conn, answers)

        async with listener:
            await listener.serve(handle)
    finally:
        _remove(path)


def _bind_private(path: Path) -> socket.socket:
    """A socket listening at ``path`` that is the daemon user's only from the moment
    the path exists: bound in a fresh 0700 directory beside it, made 0600, then
    renamed into place. (A chmod after binding at ``path`` leaves a moment when the
    socket has the umask's permissions, and a group member could connect.) The
    staged path is no longer than ``path``, so it fits wherever ``path`` does."""
    private = Path(tempfile.mkdtemp(prefix=".c", dir=path.parent))
    staged = private / "s"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(os.fsencode(staged))
        os.chmod(staged, 0o600)
        sock.listen()
        os.replace(staged, path)
    except BaseException:
        sock.close()
        raise
    finally:
        shutil.rmtree(private, ignore_errors=True)
    sock.setblocking(False)
    return sock


def _sweep_staging(directory: Path) -> None:
    """Remove the staging directories a kill left between :func:`_bind_private`'s
    mkdtemp and its cleanup: ``.c`` and 8 characters, holding nothing but its
    socket ``s`` (an empty directory of that name loses nothing; any other content
    keeps it)."""
    try:
        with os.scandir(directory) as entries:
            staged = [
                Path(e.path)
                for e in entries
                if len(e.name) == 10 and e.name.startswith(".c") and e.is_dir(follow_symlinks=False)
            ]
    except OSError:
        return
    for entry in staged:
        try:
            if all(c.name == "s" and c.is_socket() for c in entry.iterdir()):
                shutil.rmtree(entry)
        except OSError:
            continue


def _remove(path: Path) -> None:
    """Unlink the socket file (a local directory entry: no need for a thread)."""
    path.unlink(missing_ok=True)


async def _answer(conn: SocketStream, answers: Mapping[str, Callable[[], bytes]]) -> None:
    request = b""
    with anyio.move_on_after(REQUEST_SECONDS):
        while b"\n" not in request and len(request) <= MAX_REQUEST:
            try:
                request += await conn.receive(MAX_REQUEST + 1)
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                break
    line = request.split(b"\n", 1)[0].strip()[:MAX_REQUEST].decode("utf-8", "replace")
    give = answers.get(line)
    if give is not None:
        answer = give()
    else:
        known = " or ".join(repr(name) for name in answers)
        answer = msgspec.json.encode({"error": f"unknown request {line!r}; send {known}"})
    try:
        with anyio.fail_after(REQUEST_SECONDS):
            await conn.send(answer)
    except (TimeoutError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        pass  # the client went away: its loss


def ask(path: Path, request: str, timeout: float = 2.0) -> bytes | None:
    """The running daemon's answer to ``request`` (``status``, ``copytrade``), or None
    when nobody answers (no daemon, an old daemon without the socket,
    a timeout). Blocking: for the CLI."""
    if len(os.fsencode(path)) > MAX_PATH or not path.exists():
        return None
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(os.fspath(path))
            sock.sendall(request.encode() + b"\n")
            chunks: list[bytes] = []
            size = 0
            while chunk := sock.recv(1 << 16):
                size += len(chunk)
                if size > MAX_ANSWER:
                    return None
                chunks.append(chunk)
    except OSError:
        return None
    return b"".join(chunks) or None
