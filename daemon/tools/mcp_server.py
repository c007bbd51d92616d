"""The tool registry over MCP, with the official SDK's low-level server.

Each tool is listed with its generated input schema; a call answers the tool's
response as ``structuredContent`` plus the same JSON as text (hosts that only
read text see everything), with ``isError`` set for a :class:`ToolError`.
The SDK runs each call in its own task and cancels it on
``notifications/cancelled`` or a dropped client: a waiting tool returns at once
and its ``with`` blocks release what it held (pool subscriptions).
"""

from __future__ import annotations

from typing import Any

import mcp_types as types
import msgspec
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from daemon import __version__
from daemon.tools.base import Registry, render
from daemon.tools.context import ToolContext

INSTRUCTIONS = """\
marketwake's market tools. Prefer wait_for_market_event over sleeping: it returns \
as soon as your conditions hold (or after at most 55 s with the latest tickers)."""


def build_server(registry: Registry[ToolContext], ctx: ToolContext) -> Server[Any]:
    """An MCP server exposing every tool of ``registry`` against ``ctx``."""
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
        result = await registry.call(ctx, params.name, params.arguments)
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


async def serve_stdio(server: Server[Any]) -> None:
    """Serve one host over this process's stdin/stdout until it closes them."""
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())
