"""Serve an aiohttp application on a free loopback port for the length of a block;
read what a server says to a raw connection until it closes it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from aiohttp import web
from anyio.abc import ByteReceiveStream


async def until_closed(stream: ByteReceiveStream, seconds: float = 5.0) -> bytes:
    """Everything ``stream`` receives until the server closes it (a reset counts as a
    close); fails when the server has not closed it within ``seconds``."""
    got = b""
    with anyio.fail_after(seconds):
        try:
            while True:
                got += await stream.receive()
        except (anyio.EndOfStream, anyio.BrokenResourceError):
            return got


@asynccontextmanager
async def serve_app(app: web.Application) -> AsyncIterator[str]:
    """``http://127.0.0.1:<port>`` of ``app``; stopped when the block ends. A handler
    whose client has gone is cancelled (a stalled answer nobody waits for does not
    hold the end of the block)."""
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
