"""The tool registry over MCP, with the official SDK's low-level server.

Each tool is listed with its generated input schema; a call answers the tool's
response as ``structuredContent`` plus the same JSON as text (hosts that only
read text see everything), with ``isError`` set for a :class:`ToolError`.
The SDK runs each call in its own task and cancels it on
``notifications/cancelled`` or a dropped client: a waiting tool returns at once
and its ``with`` blocks release what it held (pool subscriptions).

With ``agent`` set (``[mcp] agent``), the trading tools act for that agent of
the daemon, each call under a trace id of its own.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hmac
import json
import os
import secrets
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, MutableMapping
from contextlib import asynccontextmanager, contextmanager
from functools import partial
from typing import Any, Self, cast

import anyio
import mcp_types as types
import msgspec
import pydantic
import structlog
import uvicorn
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from uvicorn.protocols.http.h11_impl import H11Protocol

from daemon import __version__
from daemon.config import McpSection
from daemon.errors import ConfigError
from daemon.tools.base import Registry, render
from daemon.tools.context import ToolContext
from feeds.http import BUSY_RESPONSE

log = structlog.get_logger("mcp")
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

INSTRUCTIONS = """\
marketwake's market tools. Prefer wait_for_market_event over sleeping: it returns \
as soon as your conditions hold (or after at most 55 s with the latest tickers)."""


def call_context(ctx: ToolContext, agent: str) -> ToolContext:
    """The context of one MCP call: on event time, as of the replay's market time
    (the named agent's, when there is one)."""
    if not agent:
        return ctx.as_of_now()
    # MCP requests carry no session (the protocol is stateless): a signal is the same
    # signal when its levels are, within a UTC day ("run" mcp-<day>): the market's
    # day on event time (the agent's clock), else today's.
    view = ctx.agent_view(agent) if ctx.agent_view is not None else None
    at_ms = view.now_ms if view is not None else ctx.as_of_now().market_ms
    day = time.gmtime(at_ms / 1000 if at_ms else time.time())
    run = time.strftime("mcp-%Y-%m-%d", day)
    call = ctx.agent_call(agent, run) if ctx.agent_call is not None else None
    if call is None:
        return dataclasses.replace(ctx.as_of_now(), agent=None, acting_for=agent)
    call = dataclasses.replace(call, trace_id=f"mcp-{secrets.token_hex(6)}")
    return dataclasses.replace(ctx.for_agent(call), acting_for=agent)


def build_server(registry: Registry[ToolContext], ctx: ToolContext, agent: str = "") -> Server[Any]:
    """An MCP server exposing every tool of ``registry`` against ``ctx``, the trading
    tools acting for ``agent`` (none: they answer ``unavailable``)."""
    listed = [
        types.Tool(
            name=tool.name,
            title=tool.title,
            description=tool.description,
            input_schema=tool.input_schema(),
        )
        for tool in registry
    ]

    async def list_tools(
        _rctx: Any, _params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=listed)

    async def call_tool(_rctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        result = await registry.call(call_context(ctx, agent), params.name, params.arguments)
        data, is_error = render(result)
        return types.CallToolResult(
            content=[types.TextContent(text=msgspec.json.encode(data).decode())],
            structured_content=data,
            is_error=is_error,
        )

    return Server(
        "marketwake",
        version=__version__,
        instructions=INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


class _PipeOut:
    """The wire side of stdout, written from the event loop.

    The SDK's default writes each message and flushes it through a worker
    thread (two thread hand-offs per answer); a non-blocking write of the line
    is one system call, and waits on the loop only when the host reads slowly."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    async def write(self, text: str) -> int:
        data = memoryview(text.encode())
        while data:
            try:
                data = data[os.write(self.fd, data) :]
            except BlockingIOError:
                await anyio.wait_writable(self.fd)
        return len(text)

    async def flush(self) -> None:
        """Nothing is buffered."""


@contextmanager
def _claim_stdout() -> Iterator[int]:
    """The wire (a private duplicate of fd 1, non-blocking) while fd 1 points at
    stderr, so stray prints of libraries never corrupt the protocol; restored after."""
    wire = fcntl.fcntl(1, fcntl.F_DUPFD_CLOEXEC, 3)
    os.dup2(2, 1)
    blocking = os.get_blocking(wire)
    os.set_blocking(wire, False)
    try:
        yield wire
    finally:
        os.set_blocking(wire, blocking)  # the description may be a terminal's
        os.dup2(wire, 1)
        os.close(wire)


async def serve_stdio(server: Server[Any]) -> None:
    """Serve one host over this process's stdin/stdout until it closes them."""
    with _claim_stdout() as wire:
        out = cast("anyio.AsyncFile[str]", _PipeOut(wire))
        async with stdio_server(stdout=out) as (read, write):
            inbox = _Answering(read, write)
            await server.run(inbox, write, server.create_initialization_options())


class _Answering:
    """The host's messages off the stdio wire; a line that is none is answered on the
    spot with JSON-RPC 2.0's error (-32700 for text that is not JSON, -32600 for JSON
    that is not a message; ``id`` null, as the request's cannot be known), where the
    SDK would only log it and leave the host waiting."""

    def __init__(self, inner: Any, write: Any) -> None:
        self._inner, self._write = inner, write

    @property
    def last_context(self) -> Any:  # the SDK reads the sender's context from its stream
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> Any:
        while True:
            item = await self._inner.receive()
            if not isinstance(item, Exception):
                return item
            await self._write.send(SessionMessage(_unreadable(item)))

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise StopAsyncIteration from None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def answer_non_messages(app: ASGIApp, limit: int) -> ASGIApp:
    """``app`` (the SDK's streamable HTTP app), with a POST whose body is JSON but no
    JSON-RPC message answered ``-32600 Invalid Request`` (id null) here: the SDK
    answers it ``-32602`` with its validator's whole dump. Bad JSON and bodies over
    ``limit`` go to the SDK untouched (it answers -32700 / 413 itself). A body that
    takes over ``BODY_SECONDS`` to arrive is answered 408."""

    async def checked(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await app(scope, receive, send)
            return
        held: list[MutableMapping[str, Any]] = []
        body = b""
        with anyio.move_on_after(BODY_SECONDS) as late:
            while len(body) <= limit:
                message = await receive()
                held.append(message)
                if message["type"] != "http.request":
                    break
                body += message.get("body", b"")
                if not message.get("more_body", False):
                    if _not_a_message(body):
                        await _send_json(send, 400, _invalid_request())
                        return
                    break
        if late.cancelled_caught:
            text = f'{{"error": "request body not received within {BODY_SECONDS:g} s"}}'
            headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
            await send({"type": "http.response.start", "status": 408, "headers": headers})
            await send({"type": "http.response.body", "body": text.encode()})
            return
        pending = iter(held)

        async def replay() -> MutableMapping[str, Any]:
            return next(pending, None) or await receive()

        await app(scope, replay, send)

    return checked


def _not_a_message(body: bytes) -> bool:
    """Whether ``body`` is JSON (else the SDK's -32700) but no JSON-RPC message."""
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):  # nested past the parser's depth: not ours to say
        return False
    try:
        types.jsonrpc_message_adapter.validate_python(parsed, by_name=False)
    except pydantic.ValidationError:
        return True
    return False


def _invalid_request() -> types.JSONRPCError:
    detail = "not a JSON-RPC 2.0 request, notification or response"
    error = types.ErrorData(code=types.INVALID_REQUEST, message="Invalid Request", data=detail)
    return types.JSONRPCError(jsonrpc="2.0", id=None, error=error)


async def _send_json(send: Send, status: int, reply: types.JSONRPCError) -> None:
    body = reply.model_dump_json(by_alias=True, exclude_unset=True).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _unreadable(exc: Exception) -> types.JSONRPCError:
    """The error reply to a line the SDK could not read as a JSON-RPC message."""
    errors = exc.errors() if isinstance(exc, pydantic.ValidationError) else []
    bad_json = [e["msg"] for e in errors if e["type"] == "json_invalid"]
    if not bad_json:
        log.warning("mcp line not understood", code=types.INVALID_REQUEST)
        return _invalid_request()
    log.warning("mcp line not understood", code=types.PARSE_ERROR, detail=bad_json[0])
    error = types.ErrorData(code=types.PARSE_ERROR, message="Parse error", data=bad_json[0][:200])
    return types.JSONRPCError(jsonrpc="2.0", id=None, error=error)


def require_bearer(app: ASGIApp, token: str) -> ASGIApp:
    """``app`` behind ``Authorization: Bearer <token>`` (compared in constant time)."""
    expected = f"Bearer {token}".encode()

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            given = dict(scope.get("headers", [])).get(b"authorization", b"")
            if not hmac.compare_digest(given, expected):
                body = b'{"error": "missing or wrong bearer token"}'
                headers = [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]
                await send({"type": "http.response.start", "status": 401, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
        await app(scope, receive, send)

    return guarded


# Seconds a connection may take to send a request's headers, from its start or its last
# answer. A request being served (a long-poll, an event stream) is never cut.
HEADERS_SECONDS = 10.0
BODY_SECONDS = 10.0  # for a POST's body, once its headers are in
# Connections open at once; past it a new one is closed as soon as it is made (a flood
# costs the MCP server, never the daemon's file descriptors).
MAX_CONNECTIONS = 128


class _H11(H11Protocol):
    """uvicorn's h11 protocol, closing a connection whose request headers are not in
    within ``HEADERS_SECONDS``: uvicorn itself waits for a first request forever, and
    drops its keep-alive timer at the first byte of the next one, so a client that
    says nothing, or trickles its headers, held a socket for good."""

    _headers_by: Any = None

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        if len(self.connections) > MAX_CONNECTIONS:
            transport.write(BUSY_RESPONSE)
            transport.close()
            return
        self._arm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._headers_by is not None:
            self._headers_by.cancel()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._headers_by is not None:
            self._headers_by.cancel()
        self._headers_by = self.loop.call_later(HEADERS_SECONDS, self._headers_late)

    def _headers_late(self) -> None:
        self._headers_by = None
        waiting = self.cycle is None or self.cycle.response_complete
        if waiting and not self.transport.is_closing():
            self.transport.close()


class _Uvicorn(uvicorn.Server):
    """uvicorn without its own signal handlers: the daemon owns SIGTERM and SIGHUP."""

    @contextmanager
    def capture_signals(self) -> Any:
        yield


@asynccontextmanager
async def serve_http(server: Server[Any], section: McpSection) -> AsyncIterator[_Uvicorn]:
    """Serve ``server`` at ``http://host:port/mcp`` while the block runs."""
    app: ASGIApp = server.streamable_http_app(
        host=section.host, max_request_body_size=section.max_request_bytes
    )
    app = answer_non_messages(app, section.max_request_bytes)
    if section.token:
        app = require_bearer(app, section.token.reveal())
    config = uvicorn.Config(
        app,
        host=section.host,
        port=section.port,
        log_config=None,
        access_log=False,
        lifespan="on",
        http=_H11,
    )
    http = _Uvicorn(config)
    try:  # bound here: uvicorn would sys.exit() on a port in use
        sock = socket.create_server((section.host, section.port), reuse_port=False)
    except OSError as exc:
        raise ConfigError(
            f"mcp: cannot listen on {section.host}:{section.port}: {exc.strerror}"
        ) from None
    with sock:
        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(http.serve, sockets=[sock]))
            with anyio.fail_after(10):
                while not http.started:  # noqa: ASYNC110 - uvicorn offers only a flag
                    await anyio.sleep(0.02)
            log.info("mcp serving", url=f"http://{section.host}:{bound_port(http)}/mcp")
            try:
                yield http
            finally:
                http.should_exit = True


def bound_port(http: uvicorn.Server) -> int:
    """The port actually bound (``port = 0`` picks a free one)."""
    for srv in http.servers:
        for sock in srv.sockets:
            port: int = sock.getsockname()[1]
            return port
    return 0
