"""The control socket's file: private from the moment it exists, and a place it
cannot be made is logged, not fatal."""

from __future__ import annotations

import os
import stat
import tempfile
import threading
from pathlib import Path

import anyio
import pytest

from daemon.control import CONTROL_SOCKET, ask, serve_control


async def test_the_socket_exists_only_as_the_daemon_users() -> None:
    """Watched from a thread from before the start: the first time the path exists it
    is a socket of mode 0600 (it was 0755 or 0775, the umask's, for a moment when the
    mode was set after binding at the path), and nothing is left beside it."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / CONTROL_SOCKET
        seen: list[int] = []
        done = threading.Event()

        def watch() -> None:
            while not seen and not done.is_set():
                try:
                    seen.append(os.stat(path).st_mode)
                except FileNotFoundError:
                    continue

        async with anyio.create_task_group() as tg:
            tg.start_soon(anyio.to_thread.run_sync, watch)
            await anyio.sleep(0.01)
            try:
                await tg.start(serve_control, path, {"status": lambda: b'{"ok": 1}'})
                answer = await anyio.to_thread.run_sync(ask, path, "status")
                assert answer == b'{"ok": 1}'
                assert sorted(os.listdir(d)) == [CONTROL_SOCKET]
                with anyio.fail_after(10):  # (a loaded machine may not have run it yet)
                    while not seen:  # noqa: ASYNC110 (a thread fills it)
                        await anyio.sleep(0.001)
            finally:
                done.set()
                tg.cancel_scope.cancel()
        assert stat.S_ISSOCK(seen[0]) and stat.S_IMODE(seen[0]) == 0o600
        assert not path.exists()


async def test_a_place_it_cannot_bind_in_is_logged_and_the_daemon_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A state dir path through a file (root or not: no permission bits involved)."""
    (tmp_path / "file").write_text("")
    async with anyio.create_task_group() as tg:
        await tg.start(serve_control, tmp_path / "file" / CONTROL_SOCKET, {})
        tg.cancel_scope.cancel()
    assert "control socket unavailable" in capsys.readouterr().out
    assert sorted(os.listdir(tmp_path)) == ["file"]


async def test_a_path_too_long_for_a_socket_is_logged_and_the_daemon_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    async with anyio.create_task_group() as tg:
        await tg.start(serve_control, deep / CONTROL_SOCKET, {})
        tg.cancel_scope.cancel()
    assert "control socket path too long" in capsys.readouterr().out
    assert os.listdir(deep) == []


async def test_staging_left_by_a_kill_is_swept_and_nothing_else(tmp_path: Path) -> None:
    """A kill between the staging directory's creation and its removal leaves it (empty,
    or holding its socket); the next start removes it, and only it."""
    import socket

    empty, held = tmp_path / ".cabcdefgh", tmp_path / ".c12345678"
    empty.mkdir()
    held.mkdir()
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(held / "s"))
    mine = [
        tmp_path / ".cache0000",
        tmp_path / ".cxyzxyzxy",
        tmp_path / ".c",
        tmp_path / ".clink0000",
    ]
    mine[0].mkdir()
    (mine[0] / "s").write_text("not a socket")
    mine[1].write_text("a file")
    mine[2].mkdir()
    elsewhere = tmp_path.parent / f"{tmp_path.name}-elsewhere"  # a link is not followed
    elsewhere.mkdir()
    mine[3].symlink_to(elsewhere, target_is_directory=True)
    async with anyio.create_task_group() as tg:
        await tg.start(serve_control, tmp_path / CONTROL_SOCKET, {})
        tg.cancel_scope.cancel()
    assert sorted(os.listdir(tmp_path)) == sorted(p.name for p in mine)
    assert elsewhere.is_dir()
