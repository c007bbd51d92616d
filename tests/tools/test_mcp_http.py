"""The tools over MCP streamable HTTP: in-process with a token, and from a running daemon."""

from __future__ import annotations

import os
import re
import signal
import sys
from pathlib import Path

import aiohttp
import anyio
import httpx2
import pytest
from anyio.abc import ByteReceiveStream
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from daemon.config import McpSection, Secret
from daemon.errors import ConfigError
from daemon.tools import registry
from daemon.tools.mcp_server import bound_port, build_server, serve_http
from tests.coinbase_fake import fake_server
from tests.loopback import until_closed
from tests.tools.test_market_event import SIMPLE, context

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[2]


async def test_http_with_a_bearer_token() -> None:
    section = McpSection(enabled=True, port=0, token=Secret("s3cret-token"))
    async with context() as (fake, ctx), serve_http(build_server(registry(), ctx), section) as http:
        fake.prices["BTC-EUR"] = "59000"
        url = f"http://127.0.0.1:{bound_port(http)}/mcp"
        async with aiohttp.ClientSession() as session:
            async with session.post(url, json={}) as resp:
                assert resp.status == 401
            wrong = {"Authorization": "Bearer nope"}
            async with session.post(url, json={}, headers=wrong) as resp:
                assert resp.status == 401
        auth = httpx2.AsyncClient(headers={"Authorization": "Bearer s3cret-token"})
        with anyio.fail_after(30):
            async with auth, Client(streamable_http_client(url, http_client=auth)) as client:
                names = [t.name for t in (await client.list_tools()).tools]
                assert "wait_for_market_event" in names
                result = await client.call_tool("wait_for_market_event", SIMPLE)
                assert result.structured_content["status"] == "triggered"


async def test_a_body_that_is_no_message_is_an_invalid_request() -> None:
    """JSON that is not a JSON-RPC message: -32600 with id null (the SDK alone said
    -32602 with its validator's whole dump); bad JSON stays the SDK's -32700; a real
    request after them is served."""
    async with (
        context() as (_fake, ctx),
        serve_http(build_server(registry(), ctx), McpSection(port=0)) as http,
    ):
        url = f"http://127.0.0.1:{bound_port(http)}/mcp"
        headers = {"Accept": "application/json, text/event-stream"}
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"}}}  # fmt: skip
        async with aiohttp.ClientSession(headers=headers) as session:
            answers = []
            deep = b"[" * 5000 + b"]" * 5000  # past the JSON parser's depth
            for body in (b'{"hello": 1}', b"[]", b"{not json", deep):
                async with session.post(
                    url, data=body, headers={"Content-Type": "application/json"}
                ) as resp:
                    answers.append((resp.status, (await resp.json())["error"]["code"]))
            async with session.post(url, json=init) as resp:
                served = resp.status
        assert answers == [(400, -32600), (400, -32600), (400, -32700), (400, -32700)]
        assert served == 200


async def test_a_silent_or_trickling_client_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection that sends no request, or only part of its headers, is closed after
    HEADERS_SECONDS (uvicorn alone kept both for good); a request is still served,
    and a connection that got its answer and sends half a next request is closed too;
    a body trickled in is answered 408."""
    from daemon.tools import mcp_server

    monkeypatch.setattr(mcp_server, "HEADERS_SECONDS", 0.5)
    monkeypatch.setattr(mcp_server, "BODY_SECONDS", 0.5)
    async with (
        context() as (_fake, ctx),
        serve_http(build_server(registry(), ctx), McpSection(port=0)) as http,
    ):
        port = bound_port(http)
        silent = await anyio.connect_tcp("127.0.0.1", port)
        half = await anyio.connect_tcp("127.0.0.1", port)
        await half.send(b"POST /mcp HTTP/1.1\r\nHost: x\r\n")
        again = await anyio.connect_tcp("127.0.0.1", port)
        await again.send(b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n")
        with anyio.fail_after(5):
            answer = b""
            while b"\r\n\r\n" not in answer:
                answer += await again.receive()
            assert answer.startswith(b"HTTP/1.1 404 ")
            await again.send(b"GET /nope HTTP/1.1\r\n")  # and then nothing
            for stream in (silent, half, again):
                await until_closed(stream)  # what is left of an answer, then the close
                await stream.aclose()
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"http://127.0.0.1:{port}/mcp", data=b"{}") as resp,
        ):
            assert resp.status == 400  # still serving
        slow = await anyio.connect_tcp("127.0.0.1", port)  # a body trickled in: 408
        await slow.send(b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        with anyio.fail_after(5):
            answer = b""
            while b"\r\n\r\n" not in answer:
                answer += await slow.receive()
        await slow.aclose()
        assert answer.startswith(b"HTTP/1.1 408 ")


async def test_past_max_connections_a_new_one_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    """With MAX_CONNECTIONS open, the next one is closed at once; once one closes,
    requests are served again."""
    from daemon.tools import mcp_server

    monkeypatch.setattr(mcp_server, "MAX_CONNECTIONS", 2)
    async with (
        context() as (_fake, ctx),
        serve_http(build_server(registry(), ctx), McpSection(port=0)) as http,
    ):
        port = bound_port(http)
        held = [await anyio.connect_tcp("127.0.0.1", port) for _ in range(2)]
        await anyio.sleep(0.1)
        extra = await anyio.connect_tcp("127.0.0.1", port)
        answer = await until_closed(extra)  # a busy server's answer, then the end
        assert answer.startswith(b"HTTP/1.1 503 ") and b"Retry-After: 1" in answer
        await extra.aclose()
        await held.pop().aclose()
        await anyio.sleep(0.1)
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"http://127.0.0.1:{port}/mcp", data=b"{}") as resp,
        ):
            assert resp.status == 400  # served
        for stream in held:
            await stream.aclose()


async def test_a_port_in_use_is_a_clear_error() -> None:
    async with (
        context() as (_fake, ctx),
        serve_http(build_server(registry(), ctx), McpSection(port=0)) as http,
    ):
        taken = McpSection(port=bound_port(http))
        with pytest.raises(ConfigError, match="cannot listen"):
            async with serve_http(build_server(registry(), ctx), taken):
                pass


def test_a_public_host_needs_a_token() -> None:
    with pytest.raises(ValueError, match="token"):
        McpSection(enabled=True, host="0.0.0.0")


async def test_the_daemon_serves_the_tools_on_its_own_connection(tmp_path: Path) -> None:
    async with fake_server() as (fake, ws):
        fake.prices["BTC-EUR"] = "59000"
        cfg = tmp_path / "c.toml"
        cfg.write_text(
            f'[daemon]\nstate_dir = "{tmp_path / "state"}"\nlog_format = "json"\n'
            "[hooks]\nenabled = false\n"
            f'[feeds.coinbase_ws]\nenabled = true\nurl = "{ws}"\nproducts = ["ETH-EUR"]\n'
            '[feeds.candles]\nbase_url = "http://127.0.0.1:9"\n'  # product checks fail open
            "[mcp]\nenabled = true\nport = 0\n"
        )
        cmd = [sys.executable, "-m", "daemon.cli", "run", "--config", str(cfg)]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        async with await anyio.open_process(cmd, cwd=ROOT, env=env, stdout=None) as proc:
            try:
                assert proc.stderr is not None
                with anyio.fail_after(30):
                    url = await _served_url(proc.stderr)
                    async with Client(url) as client:
                        result = await client.call_tool("wait_for_market_event", SIMPLE)
                assert result.structured_content["status"] == "triggered"
                # one socket: the ticker feed's products and the tool's on one connection
                assert len(fake.connections) == 1
                tickers = {p for m in fake.received[0] if m["channel"] == "ticker" for p in m["product_ids"]}  # fmt: skip
                assert tickers == {"ETH-EUR", "BTC-EUR"}
                proc.send_signal(signal.SIGTERM)
                with anyio.fail_after(20):
                    async for _ in proc.stderr:
                        pass  # drain until the daemon exits
                    assert await proc.wait() == 0
            finally:
                if proc.returncode is None:
                    proc.kill()


async def _served_url(stderr: ByteReceiveStream) -> str:
    seen = b""
    async for chunk in stderr:
        seen += chunk
        m = re.search(rb'"url": "(http://[^"]+/mcp)"', seen)
        if m:
            return m.group(1).decode()
    raise AssertionError(f"the daemon never logged its MCP url: {seen[-2000:]!r}")
