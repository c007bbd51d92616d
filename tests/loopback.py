"""Serve an aiohttp application on a free loopback port for the length of a block;
serve JSON POSTs from a thread (for a client in another process or a sync test); read
what a server says to a raw connection until it closes it."""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

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


@contextmanager
def serve_posts(
    reply: Callable[[int], tuple[int, Any]],
) -> Iterator[tuple[str, list[Any]]]:
    """``http://127.0.0.1:<port>`` of a stdlib HTTP server on its own thread, and the JSON
    bodies POSTed to it, in order. ``reply(n)`` (n: the body's index) gives the status
    and the JSON it answers (None: no body); it may block, holding the request (release
    it before the block ends). A client gone meanwhile is not an error."""
    got: list[Any] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            got.append(json.loads(self.rfile.read(int(self.headers["content-length"]))))
            status, body = reply(len(got) - 1)
            data = b"" if body is None else json.dumps(body).encode()
            try:
                self.send_response(status)
                if data:
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except OSError:
                pass  # the client is gone (a daemon killed while it waited)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", got
    finally:
        server.shutdown()
        server.server_close()
