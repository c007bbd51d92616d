"""The TCP shell around framing + jsonrpc + the service (anyio).

Each connection reads bytes into a FrameDecoder, answers each complete text
in order, and is closed when it: sends a text over ``max_request_bytes``,
completes no request within ``idle_timeout_seconds`` (measured from the last
completed request, so dribbling one byte at a time does not keep it alive),
takes longer than ``request_read_seconds`` to finish a request it began, or
does not read our responses within ``timeout_ms``. Queries run in worker
threads under ``timeout_ms``. Every call of a batch counts against the rate
limit; a batch over ``max_batch`` and an answer over ``max_response_bytes``
are errors. At ``max_connections`` the longest-idle connection is closed to
make room; only when none is idle does the newcomer get one -32000 line.
Nothing a client sends can raise out of here.
"""

from __future__ import annotations

import hmac
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import anyio
import structlog
from anyio.abc import SocketAttribute, SocketStream, TaskStatus

from daemon.errors import RpcError
from daemon.rag import jsonrpc
from daemon.rag.config import ServerSection
from daemon.rag.framing import OVERSIZED, FrameDecoder
from daemon.rag.limits import RateLimiter
from daemon.rag.service import RagService

log = structlog.get_logger("marketwake.rag.server")
Handler = Callable[[Any], Any]


def methods_for(service: RagService) -> dict[str, Handler]:
    """The RPC methods: the seed's query and a health probe for operators."""
    return {"rag.query_patterns": service.query_patterns, "rag.health": service.health}


class RagServer:
    """Serve ``methods`` (sync callables taking params) as JSON-RPC 2.0 over TCP."""

    def __init__(self, cfg: ServerSection, methods: dict[str, Handler]) -> None:
        self._cfg = cfg
        self._methods = methods
        self._limiter = RateLimiter(cfg.rate_limit_per_second, cfg.rate_limit_burst)
        self._threads = anyio.CapacityLimiter(cfg.worker_threads)
        self._active = 0
        # Sessions waiting for their next request with nothing pending, oldest first:
        # at max_connections the oldest is closed to make room (idle clients cannot
        # lock the others out).
        self._idle: OrderedDict[int, anyio.CancelScope] = OrderedDict()
        self.evicted = 0
        self.port = 0

    async def serve(self, *, task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED) -> None:
        """Listen until cancelled; reports the bound port through ``task_status``."""
        listener = await anyio.create_tcp_listener(
            local_host=self._cfg.host, local_port=self._cfg.port, reuse_port=False
        )
        self.port = int(listener.extra(SocketAttribute.local_port))
        log.info("rag server listening", host=self._cfg.host, port=self.port)
        task_status.started(self.port)
        async with listener:
            await listener.serve(self._connection)

    async def _connection(self, stream: SocketStream) -> None:
        async with stream:
            if self._active >= self._cfg.max_connections and self._idle:
                _, oldest = self._idle.popitem(last=False)
                oldest.cancel()
                self.evicted += 1
            elif self._active >= self._cfg.max_connections:
                data = {"reason": f"max_connections ({self._cfg.max_connections}) reached"}
                line = jsonrpc.error(None, jsonrpc.SERVER_ERROR, "Too many connections", data)
                await self._send(stream, jsonrpc.encode(jsonrpc.Message(False), [line]) or b"")
                return
            self._active += 1
            try:
                await self._session(stream)
            except (
                anyio.EndOfStream,
                anyio.BrokenResourceError,
                anyio.ClosedResourceError,
                OSError,
            ):
                pass
            except Exception:
                log.exception("rag connection failed")
            finally:
                self._active -= 1

    def _peer(self, stream: SocketStream) -> str:
        try:
            return str(stream.extra(SocketAttribute.remote_address)[0])
        except (IndexError, TypeError, LookupError):
            return "?"

    async def _session(self, stream: SocketStream) -> None:
        decoder = FrameDecoder(self._cfg.max_request_bytes)
        peer = self._peer(stream)
        while True:
            frames = await self._next_frames(stream, decoder)
            if not frames:
                return
            for frame in frames:
                if frame == OVERSIZED:
                    await self._send(stream, jsonrpc.oversized(self._cfg.max_request_bytes))
                    return
                reply = await self._answer(frame, peer)
                if reply is not None and not await self._send(stream, reply):
                    return

    async def _next_frames(self, stream: SocketStream, decoder: FrameDecoder) -> list[bytes]:
        """The next complete texts, or [] to close: nothing at all within
        ``idle_timeout_seconds``, or a request begun and not finished within
        ``request_read_seconds`` (an idle or dribbling client holds no slot for long)."""
        frames: list[bytes] = []
        idle = anyio.current_time() + self._cfg.idle_timeout_seconds
        reading: float | None = None
        key = id(stream)
        try:
            while not frames:
                deadline = idle if reading is None else min(idle, reading)
                with anyio.move_on_after(max(0.0, deadline - anyio.current_time())) as scope:
                    if reading is None and not decoder.pending:
                        self._idle[key] = scope  # evictable while nothing is in flight
                    chunk = await stream.receive(65536)
                    self._idle.pop(key, None)
                    frames = decoder.feed(chunk)
                    if not frames and reading is None and decoder.pending:
                        reading = anyio.current_time() + self._cfg.request_read_seconds
                    continue
                return []
        finally:
            self._idle.pop(key, None)
        return frames

    async def _send(self, stream: SocketStream, payload: bytes) -> bool:
        with anyio.move_on_after(self._cfg.timeout_ms / 1000):
            await stream.send(payload)
            return True
        return False

    async def _answer(self, frame: bytes, peer: str) -> bytes | None:
        message = jsonrpc.parse(frame, self._cfg.max_batch)
        responses: list[dict[str, Any] | None] = []
        with anyio.move_on_after(self._cfg.timeout_ms / 1000) as scope:
            for entry in message.entries:
                if not isinstance(entry, jsonrpc.Call):
                    responses.append(entry)
                elif not self._limiter.allow(peer):  # every call of a batch counts
                    data = {"retry_after_ms": self._limiter.retry_after_ms(peer)}
                    err = jsonrpc.error(entry.id, jsonrpc.SERVER_ERROR, "Rate limit exceeded", data)
                    responses.append(None if entry.notification else err)
                else:
                    responses.append(await self._run(entry))
        if scope.cancelled_caught:
            data = {"timeout_ms": self._cfg.timeout_ms}
            done = len(responses)
            for entry in message.entries[done:]:
                if isinstance(entry, jsonrpc.Call) and not entry.notification:
                    responses.append(
                        jsonrpc.error(entry.id, jsonrpc.SERVER_ERROR, "Request timed out", data)
                    )
                elif not isinstance(entry, jsonrpc.Call):
                    responses.append(entry)
        return jsonrpc.encode(message, responses, self._cfg.max_response_bytes)

    def _authorized(self, params: Any) -> bool:
        key = self._cfg.api_key.reveal()
        if not key:
            return True
        given = params.get("api_key") if isinstance(params, dict) else None
        return isinstance(given, str) and hmac.compare_digest(given.encode(), key.encode())

    async def _run(self, call: jsonrpc.Call) -> dict[str, Any] | None:
        response = await self._execute(call)
        return None if call.notification else response

    async def _execute(self, call: jsonrpc.Call) -> dict[str, Any]:
        handler = self._methods.get(call.method)
        if handler is None:
            return jsonrpc.error(call.id, jsonrpc.METHOD_NOT_FOUND, data={"method": call.method})
        if not self._authorized(call.params):
            data = {"reason": "missing or wrong api_key (send it as params.api_key)"}
            return jsonrpc.error(call.id, jsonrpc.SERVER_ERROR, "Unauthorized", data)
        try:
            value = await anyio.to_thread.run_sync(
                handler, call.params, limiter=self._threads, abandon_on_cancel=True
            )
        except RpcError as exc:
            return jsonrpc.error(call.id, exc.code, exc.message, exc.data)
        except Exception as exc:
            log.exception("rag method failed", method=call.method)
            return jsonrpc.error(call.id, jsonrpc.SERVER_ERROR, data={"reason": type(exc).__name__})
        return jsonrpc.result(call.id, value)
