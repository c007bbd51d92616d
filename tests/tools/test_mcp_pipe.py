"""The MCP stdio wire: answers written from the event loop, whole, whatever the pipe's pace."""

from __future__ import annotations

import os
import sys
import threading
import time

import anyio

from daemon.tools.mcp_server import _claim_stdout, _PipeOut


async def test_a_line_longer_than_the_pipe_arrives_whole_when_the_host_reads_slowly() -> None:
    """1 MiB through a 64 KiB pipe read in small sips: the writer waits on the loop
    (other tasks run meanwhile) and no byte is lost or reordered."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    line = "".join(chr(ord("a") + i % 26) for i in range(1 << 20)) + "\n"
    got = bytearray()

    def host() -> None:
        while not got.endswith(b"\n"):
            got.extend(os.read(read_fd, 4096))
            time.sleep(0.0005)

    reader = threading.Thread(target=host)
    reader.start()
    ticks = 0

    async def other_task() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await anyio.sleep(0.001)

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(other_task)
            with anyio.fail_after(20):
                assert await _PipeOut(write_fd).write(line) == len(line)
            tg.cancel_scope.cancel()
    finally:
        reader.join(20)
        os.close(read_fd)
        os.close(write_fd)
    assert bytes(got) == line.encode()
    assert ticks > 5, "the loop kept running while the pipe was full"


def test_stray_prints_go_to_stderr_while_serving_and_stdout_comes_back() -> None:
    """While serving, fd 1 is stderr (a library's print cannot corrupt the protocol);
    the wire is a private non-blocking copy; afterwards fd 1 is the wire again."""
    read_fd, write_fd = os.pipe()
    err_read, err_write = os.pipe()
    saved_out, saved_err = os.dup(1), os.dup(2)
    try:
        os.dup2(write_fd, 1)
        os.dup2(err_write, 2)
        with _claim_stdout() as wire:
            assert wire > 2 and not os.get_blocking(wire)
            os.write(1, b"stray\n")  # what print() would do, unbuffered
            os.write(wire, b"protocol\n")
        os.write(1, b"after\n")
        assert os.get_blocking(1), "the blocking mode is restored"
    finally:
        sys.stdout.flush()
        os.dup2(saved_out, 1)
        os.dup2(saved_err, 2)
        for fd in (saved_out, saved_err, write_fd, err_write):
            os.close(fd)
    assert os.read(read_fd, 100) == b"protocol\nafter\n"
    assert os.read(err_read, 100) == b"stray\n"
    os.close(read_fd)
    os.close(err_read)
