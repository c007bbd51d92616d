"""Loopback fakes of the Anthropic Messages and OpenAI Chat Completions APIs.

Each plays a script: one entry per request, in order. An entry is a response
body (dict), an ``(http status, body)`` pair for an error, a ``web.Response``
sent as is (a page that is not the API's), or a number of seconds to stall
before answering the next entry. Every request body is kept,
so a test can check what the SDK really sent (tool results, tool messages).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
from aiohttp import web

from tests.loopback import serve_app

Script = list[Any]


class FakeModel:
    """The shared script player behind both wire formats."""

    def __init__(self, script: Script) -> None:
        self.script = list(script)
        self.requests: list[dict[str, Any]] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.requests.append(await request.json())
        step = self.script.pop(0) if self.script else (500, {"error": "script ended"})
        if isinstance(step, int | float) and not isinstance(step, bool):
            await anyio.sleep(step)
            step = self.script.pop(0)
        if isinstance(step, web.Response):
            return step
        if isinstance(step, tuple):
            status, body = step
            headers = {"retry-after-ms": "10", "retry-after": "0"} if status == 429 else {}
            return web.json_response(body, status=status, headers=headers)
        return web.json_response(step)


@asynccontextmanager
async def fake_openai(script: Script) -> AsyncIterator[tuple[FakeModel, str]]:
    """``POST /v1/chat/completions``; yields the fake and the SDK's base_url."""
    fake = FakeModel(script)
    app = web.Application()
    app.router.add_post("/v1/chat/completions", fake.handle)
    async with serve_app(app) as url:
        yield fake, f"{url}/v1"


@asynccontextmanager
async def fake_anthropic(script: Script) -> AsyncIterator[tuple[FakeModel, str]]:
    """``POST /v1/messages``; yields the fake and the SDK's base_url."""
    fake = FakeModel(script)
    app = web.Application()
    app.router.add_post("/v1/messages", fake.handle)
    async with serve_app(app) as url:
        yield fake, url


def openai_turn(
    text: str | None = None,
    calls: list[tuple[str, str, dict[str, Any]]] = (),  # type: ignore[assignment]
    usage: tuple[int, int] = (100, 20),
    cached: int = 0,
) -> dict[str, Any]:
    """A Chat Completions response: text and/or tool calls ``(id, name, arguments)``;
    ``cached`` of the prompt tokens were read from OpenAI's prompt cache."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = [
            {"id": i, "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
            for i, n, a in calls
        ]
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1_800_000_000,
        "model": "fake-gpt",
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if calls else "stop",
                "logprobs": None,
            }
        ],
        "usage": {
            "prompt_tokens": usage[0],
            "completion_tokens": usage[1],
            "total_tokens": sum(usage),
            "prompt_tokens_details": {"cached_tokens": cached},
        },
    }


def anthropic_turn(
    text: str | None = None,
    calls: list[tuple[str, str, dict[str, Any]]] = (),  # type: ignore[assignment]
    usage: tuple[int, int] = (100, 20),
    cache: tuple[int, int] = (0, 0),
) -> dict[str, Any]:
    """A Messages response: a text block and/or ``tool_use`` blocks; ``usage`` is
    (uncached input, output) tokens, ``cache`` (written, read) prompt-cache tokens."""
    content: list[dict[str, Any]] = []
    if text is not None:
        content.append({"type": "text", "text": text})
    content += [{"type": "tool_use", "id": i, "name": n, "input": a} for i, n, a in calls]
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "fake-claude",
        "content": content,
        "stop_reason": "tool_use" if calls else "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": usage[0],
            "output_tokens": usage[1],
            "cache_creation_input_tokens": cache[0],
            "cache_read_input_tokens": cache[1],
        },
    }
