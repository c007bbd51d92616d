"""The TCP server on loopback: framing, batches, limits, auth, hostile clients."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import msgspec
import pytest
from anyio.abc import SocketStream

from daemon.rag.config import ServerSection
from daemon.rag.server import RagServer, methods_for
from daemon.rag.service import RagService
from daemon.secret import Secret
from tests.rag.conftest import Collection, params_from

FAST = {
    "host": "127.0.0.1",
    "port": 0,
    "max_connections": 4,
    "max_request_bytes": 8192,
    "timeout_ms": 1000,
    "idle_timeout_seconds": 0.3,
    "rate_limit_per_second": 0.0,
}


@asynccontextmanager
async def running(methods: dict[str, Callable[[Any], Any]], **overrides: Any) -> AsyncIterator[int]:
    """A server on an ephemeral loopback port for the duration of the block."""
    server = RagServer(ServerSection(**{**FAST, **overrides}), methods)
    async with anyio.create_task_group() as tg:
        port = await tg.start(server.serve)
        try:
            yield port
        finally:
            for client in _OPEN:
                await client.aclose()
            _OPEN.clear()
            tg.cancel_scope.cancel()


_OPEN: list[Client] = []


class Client:
    """A raw TCP client reading newline-delimited responses (closed with the server)."""

    def __init__(self, stream: SocketStream) -> None:
        self.stream = stream
        self.buf = b""

    @classmethod
    async def connect(cls, port: int) -> Client:
        client = cls(await anyio.connect_tcp("127.0.0.1", port))
        _OPEN.append(client)
        return client

    async def send(self, data: bytes) -> None:
        await self.stream.send(data)

    async def line(self, wait: float = 3.0) -> Any:
        """The next response (decoded), or None at EOF."""
        with anyio.fail_after(wait):
            while b"\n" not in self.buf:
                try:
                    self.buf += await self.stream.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    return None
        text, self.buf = self.buf.split(b"\n", 1)
        return json.loads(text)

    async def call(self, method: str, params: Any = None, id_: Any = 1) -> Any:
        req: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "id": id_}
        if params is not None:
            req["params"] = params
        await self.send(msgspec.json.encode(req) + b"\n")
        return await self.line()

    async def aclose(self) -> None:
        await self.stream.aclose()


def _params(col: Collection) -> dict[str, Any]:
    pts = col.points()
    point = pts[pts["complete"]][600]
    return params_from(point, int(pts["t_ms"][-1]), min_similarity=0.5, top_k=8)


def _stable(result: dict[str, Any]) -> dict[str, Any]:
    meta = {
        k: v
        for k, v in result["metadata"].items()
        if not k.endswith("_ms") and k != "embedding_cache_hit"
    }
    return {**result, "metadata": meta}


async def test_pretty_printed_request_matches_in_process(collection: Collection) -> None:
    """The seed's multi-line nc request is answered with exactly the in-process result."""
    svc = RagService(collection.cfg, collection.store)
    params = _params(collection)
    local = svc.query_patterns(params)
    async with running(methods_for(svc)) as port:
        client = await Client.connect(port)
        body = {"jsonrpc": "2.0", "id": 1, "method": "rag.query_patterns", "params": params}
        await client.send(json.dumps(body, indent=2).encode() + b"\n")
        reply = await client.line()
        await client.aclose()
    assert reply["id"] == 1 and len(reply["result"]["matches"]) == 8
    assert _stable(reply["result"]) == _stable(json.loads(json.dumps(local)))


async def test_notification_batch_gets_no_reply(collection: Collection) -> None:
    """An all-notification batch and a lone notification are silent; the next reply is the request's."""
    svc = RagService(collection.cfg, collection.store)
    async with running(methods_for(svc)) as port:
        client = await Client.connect(port)
        await client.send(
            b'[{"jsonrpc":"2.0","method":"rag.health"},{"jsonrpc":"2.0","method":"nope"}]\n'
        )
        await client.send(b'{"jsonrpc":"2.0","method":"rag.query_patterns","params":{}}\n')
        reply = await client.call("rag.health", id_=7)
        await client.aclose()
    assert reply["id"] == 7 and reply["result"]["status"] == "ok"


async def test_batch_over_the_wire(collection: Collection) -> None:
    """A mixed batch comes back as one array line with per-member results and errors."""
    svc = RagService(collection.cfg, collection.store)
    async with running(methods_for(svc)) as port:
        client = await Client.connect(port)
        await client.send(
            b'[{"jsonrpc":"2.0","method":"rag.health","id":"a"},'
            b'{"jsonrpc":"2.0","method":"rag.nope","id":"b"},'
            b'{"jsonrpc":"2.0","method":"rag.query_patterns","params":{"symbol":"x"},"id":"c"},'
            b"5]\n"
        )
        reply = await client.line()
        await client.aclose()
    assert [r["id"] for r in reply] == ["a", "b", "c", None]
    assert reply[0]["result"]["points"] == collection.store.count()
    assert reply[1]["error"] == {
        "code": -32601,
        "message": "Method not found",
        "data": {"method": "rag.nope"},
    }
    assert reply[2]["error"]["code"] == -32602 and reply[2]["error"]["data"]["field"] == "symbol"
    assert reply[3]["error"]["code"] == -32600


async def test_garbage_keeps_connection_open(collection: Collection) -> None:
    """Malformed JSON and invalid UTF-8 get -32700 and the same connection keeps working."""
    svc = RagService(collection.cfg, collection.store)
    async with running(methods_for(svc)) as port:
        client = await Client.connect(port)
        await client.send(b'{"jsonrpc": "2.0", "method": ]\n')
        first = await client.line()
        await client.send(b'"\xff\xfe\x80"\n')
        second = await client.line()
        third = await client.call("rag.health")
        await client.aclose()
    assert first["error"]["code"] == second["error"]["code"] == -32700
    assert third["result"]["status"] == "ok"


async def test_oversized_request_is_refused_and_closed(collection: Collection) -> None:
    """A text beyond max_request_bytes gets -32600 and the connection is closed."""
    svc = RagService(collection.cfg, collection.store)
    async with running(methods_for(svc)) as port:
        client = await Client.connect(port)
        await client.send(b'{"jsonrpc":"2.0","method":"m","params":["' + b"x" * 9000)
        reply = await client.line()
        assert reply["error"]["code"] == -32600 and "8192" in reply["error"]["data"]["reason"]
        assert await client.line() is None
        other = await Client.connect(port)
        assert (await other.call("rag.health"))["result"]["status"] == "ok"
        await other.aclose()


async def test_slow_loris_is_cut_while_others_are_served(collection: Collection) -> None:
    """A client dribbling one request byte by byte is closed after the idle timeout."""
    svc = RagService(collection.cfg, collection.store)
    async with running(methods_for(svc)) as port:
        slow = await Client.connect(port)
        started = time.monotonic()
        closed_after: list[float] = []

        async def dribble() -> None:
            try:
                for b in b'{"jsonrpc":"2.0","method":"rag.health","id":1,"params":{}}' * 10:
                    await slow.send(bytes([b]))
                    await anyio.sleep(0.02)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                pass

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(dribble)
                fast = await Client.connect(port)
                assert (await fast.call("rag.health"))["result"]["status"] == "ok"
                await fast.aclose()
                assert await slow.line(wait=3) is None
                closed_after.append(time.monotonic() - started)
                tg.cancel_scope.cancel()
        finally:
            await slow.aclose()
        assert closed_after[0] < 2.0


async def test_idle_connection_is_closed(collection: Collection) -> None:
    """A connection that sends nothing is closed after idle_timeout_seconds."""
    svc = RagService(collection.cfg, collection.store)
    async with running(methods_for(svc)) as port:
        client = await Client.connect(port)
        assert await client.line(wait=2) is None


async def test_connection_flood(collection: Collection) -> None:
    """At max_connections the longest-idle connection is closed to make room, so idle
    sockets cannot lock clients out; only when every connection is mid-request does a
    newcomer get one -32000 line and EOF. Churn leaves the server usable."""
    svc = RagService(collection.cfg, collection.store)
    async with running(methods_for(svc), idle_timeout_seconds=5.0) as port:
        held = [await Client.connect(port) for _ in range(4)]
        for c in held:  # all four accepted, each now idle between requests
            assert (await c.call("rag.health"))["result"]["status"] == "ok"
        newcomer = await Client.connect(port)
        assert (await newcomer.call("rag.health"))["result"]["status"] == "ok"
        assert await held[0].line() is None  # the oldest idle one was closed
        busy = [newcomer, *held[1:]]
        for c in busy:  # each begins a request and holds it open
            await c.send(b'{"jsonrpc": "2.0", ')
        await anyio.sleep(0.1)
        extra = await Client.connect(port)
        refused = await extra.line()
        assert refused["error"]["message"] == "Too many connections"
        assert await extra.line() is None
        for c in busy:
            await c.aclose()
        for _ in range(30):  # churn: connect and drop without a word
            c = await Client.connect(port)
            await c.aclose()
        again = await Client.connect(port)
        assert (await again.call("rag.health"))["result"]["status"] == "ok"


async def test_a_started_request_must_finish_quickly(collection: Collection) -> None:
    """Idle between requests is allowed for idle_timeout_seconds; a request begun
    must be complete within request_read_seconds, dribbled or not."""
    svc = RagService(collection.cfg, collection.store)
    async with running(
        methods_for(svc), idle_timeout_seconds=5.0, request_read_seconds=0.3
    ) as port:
        client = await Client.connect(port)
        await anyio.sleep(0.5)  # idle, under the idle timeout: still open
        assert (await client.call("rag.health"))["result"]["status"] == "ok"
        started = time.monotonic()
        await client.send(b'{"jsonrpc": "2.0", "meth')
        assert await client.line(wait=3) is None
        assert time.monotonic() - started < 1.5


async def test_batches_are_capped_and_every_call_is_rate_limited(
    collection: Collection,
) -> None:
    """A batch counts one token per call (a big batch cannot pass as one message);
    a batch longer than max_batch is one -32600 error and runs nothing."""
    svc = RagService(collection.cfg, collection.store)
    calls = [{"jsonrpc": "2.0", "method": "rag.health", "id": i} for i in range(5)]
    async with running(
        methods_for(svc), rate_limit_per_second=0.001, rate_limit_burst=3, max_batch=10
    ) as port:
        client = await Client.connect(port)
        await client.send(msgspec.json.encode(calls) + b"\n")
        replies = await client.line()
        await client.send(msgspec.json.encode(calls * 3) + b"\n")
        too_long = await client.line()
    assert ["result" in r for r in replies] == [True, True, True, False, False]
    assert replies[3]["error"]["message"] == "Rate limit exceeded"
    assert too_long["error"]["code"] == -32600
    assert "a batch of 15 members exceeds max_batch (10)" in too_long["error"]["data"]["reason"]


async def test_an_oversized_answer_is_an_error_not_a_truncation(collection: Collection) -> None:
    svc = RagService(collection.cfg, collection.store)
    params = {**_params(collection), "query_config": {"lookback_days": 365, "top_k": 50,
                                                      "min_similarity": 0.0}}  # fmt: skip
    async with running(methods_for(svc), max_response_bytes=4096) as port:
        client = await Client.connect(port)
        big = await client.call("rag.query_patterns", params, id_=7)
        small = await client.call("rag.health", id_=8)
    assert big["id"] == 7 and big["error"]["message"] == "Response too large"
    assert "exceeds max_response_bytes (4096)" in big["error"]["data"]["reason"]
    assert small["result"]["status"] == "ok"


async def test_api_key_required_when_configured(collection: Collection) -> None:
    """With rag.server.api_key set, params.api_key must match; without it, no key is needed."""
    svc = RagService(collection.cfg, collection.store)
    params = _params(collection)
    async with running(methods_for(svc), api_key=Secret("s3cret")) as port:
        client = await Client.connect(port)
        missing = await client.call("rag.query_patterns", params)
        wrong = await client.call("rag.query_patterns", {**params, "api_key": "nope"})
        ok = await client.call("rag.query_patterns", {**params, "api_key": "s3cret"})
        await client.aclose()
    assert missing["error"]["message"] == wrong["error"]["message"] == "Unauthorized"
    assert missing["error"]["code"] == -32000
    assert len(ok["result"]["matches"]) == 8
    async with running(methods_for(svc)) as port:
        client = await Client.connect(port)
        assert "result" in await client.call("rag.query_patterns", params)
        await client.aclose()


async def test_rate_limit_per_client(collection: Collection) -> None:
    """Past the burst, requests get -32000 Rate limit exceeded with retry_after_ms."""
    svc = RagService(collection.cfg, collection.store)
    async with running(methods_for(svc), rate_limit_per_second=0.5, rate_limit_burst=2) as port:
        client = await Client.connect(port)
        replies = [await client.call("rag.health", id_=i) for i in range(3)]
        await client.aclose()
    assert "result" in replies[0] and "result" in replies[1]
    err = replies[2]["error"]
    assert err["message"] == "Rate limit exceeded" and err["data"]["retry_after_ms"] > 0
    assert replies[2]["id"] == 2


async def test_request_timeout(collection: Collection) -> None:
    """A call overrunning timeout_ms gets -32000 Request timed out; the connection stays usable."""
    release = threading.Event()
    svc = RagService(collection.cfg, collection.store)
    methods = {**methods_for(svc), "slow": lambda _p: release.wait(5)}
    try:
        async with running(methods, timeout_ms=200) as port:
            client = await Client.connect(port)
            late = await client.call("slow", id_=3)
            after = await client.call("rag.health", id_=4)
            await client.aclose()
    finally:
        release.set()
    assert late["id"] == 3 and late["error"]["message"] == "Request timed out"
    assert after["result"]["status"] == "ok"


@pytest.mark.parametrize("code", [-32001, -32002, -32602])
async def test_service_errors_reach_the_wire(collection: Collection, code: int) -> None:
    """Service RpcErrors keep their code and data over TCP."""
    svc = RagService(collection.cfg, collection.store)
    params = _params(collection)
    if code == -32001:
        params["query_config"].update(min_similarity=0.9999, lookback_days=1)
        params["timestamp"] = int(collection.points()["t_ms"][700])
    elif code == -32002:
        params["symbol"] = "DOGEUSDT"
    else:
        params["current_state"]["rsi_7"] = -1
    async with running(methods_for(svc)) as port:
        client = await Client.connect(port)
        reply = await client.call("rag.query_patterns", params)
        await client.aclose()
    assert reply["error"]["code"] == code
    assert reply["error"]["data"]


async def test_spec_multiline_batch_example_is_answered_at_once(collection: Collection) -> None:
    """The spec's invalid batch, sent as printed over several lines, gets its -32700 while
    the connection stays open (no waiting for bytes that could never fix it)."""
    from tests.rag.test_protocol import SPEC_BATCH

    svc = RagService(collection.cfg, collection.store)
    async with running(methods_for(svc), idle_timeout_seconds=30) as port:
        client = await Client.connect(port)
        await client.send(SPEC_BATCH)
        err = await client.line(wait=1.0)
        ok = await client.call("rag.health", id_=3)
        await client.aclose()
    assert err == {
        "jsonrpc": "2.0",
        "error": {"code": -32700, "message": "Parse error"},
        "id": None,
    }
    assert ok["result"]["status"] == "ok"
