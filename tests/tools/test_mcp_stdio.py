"""``marketwake mcp`` as a host runs it: a subprocess on stdio, driven by the SDK's client."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests.coinbase_fake import fake_server
from tests.tools.test_market_event import SIMPLE, fake_rest, ticker_sent, unsubscribed

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[2]


def _server(cfg: Path) -> StdioServerParameters:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    args = ["-m", "daemon.cli", "mcp", "--config", str(cfg)]
    return StdioServerParameters(command=sys.executable, args=args, cwd=ROOT, env=env)


def _config(tmp_path: Path, ws: str, rest: str) -> Path:
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'[daemon]\nstate_dir = "{tmp_path / "state"}"\nlog_format = "json"\n'
        f'[feeds.coinbase_ws]\nurl = "{ws}"\nbackoff_initial_seconds = 0.05\n'
        f'[feeds.candles]\nbase_url = "{rest}"\n'
    )
    return cfg


async def test_tools_over_stdio_with_the_sdk_client(tmp_path: Path) -> None:
    async with fake_server() as (fake, ws), fake_rest({"BTC-EUR"}) as rest:
        fake.prices["BTC-EUR"] = "59000"
        with anyio.fail_after(60):
            async with Client(_server(_config(tmp_path, ws, rest))) as client:
                tools = await client.list_tools()
                listed = {t.name: t for t in tools.tools}
                assert "wait_for_market_event" in listed
                assert listed["wait_for_market_event"].input_schema["type"] == "object"

                # the snapshot after subscribing meets "price lt 60000" at once
                result = await client.call_tool("wait_for_market_event", SIMPLE)
                assert not result.is_error
                data = result.structured_content
                assert data["status"] == "triggered"
                assert data["triggeredConditions"][0]["actualValue"] == 59000.0
                assert json.loads(result.content[0].text) == data  # type: ignore[union-attr]

                bad = await client.call_tool("wait_for_market_event", {**SIMPLE, "timeout": 99})
                assert bad.is_error
                assert bad.structured_content["problems"][0]["path"] == "timeout"

                unknown = await client.call_tool(
                    "wait_for_market_event",
                    {"subscriptions": [{"productId": "NOPE-USD", "conditions": SIMPLE["subscriptions"][0]["conditions"]}]},
                )  # fmt: skip
                assert unknown.is_error and "NOPE-USD" in unknown.structured_content["message"]


async def test_cancelling_a_wait_over_stdio_releases_the_subscription(tmp_path: Path) -> None:
    async with fake_server() as (fake, ws), fake_rest({"ETH-EUR"}) as rest:
        args = {"subscriptions": [{"productId": "ETH-EUR", "conditions": [{"field": "price", "operator": "gt", "value": 1e9}]}]}  # fmt: skip
        with anyio.fail_after(60):
            async with Client(_server(_config(tmp_path, ws, rest))) as client:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(client.call_tool, "wait_for_market_event", args)
                    await fake.wait_for(ticker_sent(fake, "ETH-EUR"))
                    tg.cancel_scope.cancel()  # the client sends notifications/cancelled
                await fake.wait_for(unsubscribed(fake, "ETH-EUR"))
                again = await client.call_tool("wait_for_market_event", {**args, "timeout": 1})
                assert again.structured_content["status"] == "timeout"


async def test_a_line_that_is_not_a_message_is_answered_and_the_next_served(
    tmp_path: Path,
) -> None:
    """JSON-RPC 2.0 on the stdio wire: bad JSON gets -32700, JSON that is no message
    -32600 (id null both), where the SDK alone left the host waiting; the session
    goes on."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[daemon]\nstate_dir = "{tmp_path / "state"}"\nlog_format = "json"\n')
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"}}}  # fmt: skip
    lines = [json.dumps(init).encode(), b"{not json", b"\xff\xfe", b'{"hello": 1}',
             b'{"jsonrpc": "2.0", "id": 2, "method": "tools/list"}']  # fmt: skip
    cmd = [sys.executable, "-m", "daemon.cli", "mcp", "--config", str(cfg)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    answers: list[dict[str, object]] = []
    with anyio.fail_after(30):
        async with await anyio.open_process(cmd, cwd=ROOT, env=env) as proc:
            assert proc.stdin is not None and proc.stdout is not None
            await proc.stdin.send(b"\n".join(lines) + b"\n")
            buffered = b""
            while not any(a.get("id") == 2 for a in answers):
                buffered += await proc.stdout.receive()
                *done, buffered = buffered.split(b"\n")
                answers += [json.loads(line) for line in done if line.strip()]
            await proc.stdin.aclose()
    errors = [(a["id"], a["error"]["code"]) for a in answers if "error" in a]  # type: ignore[index]
    assert errors == [(None, -32700), (None, -32700), (None, -32600)]
    assert [a["id"] for a in answers if "result" in a] == [1, 2]
