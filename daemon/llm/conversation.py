"""One model conversation with tools, behind one small interface per provider.

A :class:`Conversation` keeps the provider's own message list and turns it
into neutral :class:`Turn` values: the text, the tool calls, why the model
stopped and the tokens it used. The runner never sees a provider's wire shape:

* ``anthropic`` -- the official SDK's Messages API: ``tool_use`` blocks in the
  assistant's content, answered by ``tool_result`` blocks in a user message;
* ``openai`` -- the official SDK's Chat Completions: ``tool_calls`` on the
  assistant message, answered by ``role: tool`` messages (the same code talks
  to Ollama, vLLM, LM Studio, OpenRouter through ``base_url``).

The SDKs retry 429 and 5xx themselves (with backoff, honouring Retry-After);
the runner bounds the whole run with its deadline.

Importing an SDK takes ~0.9 s (openai) to ~1.8 s (anthropic) of CPU on a small
machine. Done where a first run opens its conversation, on the event loop, it
stopped the whole daemon that long (feeds, hooks, every other agent) at the
first wake after each start; so it is done in a thread: :func:`warm` as the
agent loads, and :func:`open_conversation` waits for it off the loop.
"""

from __future__ import annotations

import functools
import importlib
import json
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import anyio.to_thread
import msgspec

from daemon.errors import ModelAnswerError
from daemon.wake.policy import RunnerConfig


class ToolSpec(msgspec.Struct, frozen=True):
    """A tool as the model sees it: name, description, JSON Schema of its input."""

    name: str
    description: str
    input_schema: dict[str, Any]


class ToolCall(msgspec.Struct, frozen=True):
    """One call the model asked for; ``arguments`` is None when they were not JSON."""

    id: str
    name: str
    arguments: dict[str, Any] | None


class ToolOutcome(msgspec.Struct, frozen=True):
    """The answer to one call, as JSON text for the model."""

    call_id: str
    content: str
    is_error: bool


class Turn(msgspec.Struct, frozen=True):
    """One model response."""

    text: str
    tool_calls: list[ToolCall]
    stop_reason: str
    # Every input token of the request, cached or not; of them, those written to and
    # read from the provider's prompt cache (priced apart: docs/llm.md).
    tokens_in: int
    tokens_out: int
    cache_write: int = 0
    cache_read: int = 0


class Conversation(Protocol):
    """A running conversation: ask for the next turn, answer its tool calls."""

    provider: str

    async def turn(self) -> Turn:
        """Send the conversation so far; return the model's next turn (and keep it)."""
        ...

    def answer(self, outcomes: list[ToolOutcome]) -> None:
        """Add the results of the last turn's tool calls."""
        ...

    async def close(self) -> None:
        """Release the HTTP client."""
        ...


EPHEMERAL: dict[str, str] = {"type": "ephemeral"}  # Anthropic's 5-minute prompt cache


@functools.cache
def tls_context() -> ssl.SSLContext:
    """One TLS context for every conversation's HTTP client. Each SDK client builds
    its own otherwise, loading the CA bundle (~20 ms of CPU a run: a third of a
    backtest with ``--run-llm`` against a local model)."""
    import httpx

    return httpx.create_ssl_context()


def _arguments(raw: Any) -> dict[str, Any] | None:
    """Tool arguments as a dict: already one (Anthropic) or JSON text (OpenAI)."""
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        try:
            value = json.loads(raw or "{}")
        except ValueError:
            return None
        return value if isinstance(value, dict) else None
    return None


class AnthropicConversation:
    """The Messages API with tool use."""

    provider = "anthropic"

    def __init__(self, cfg: RunnerConfig, system: str, user: str, tools: list[ToolSpec]) -> None:
        from anthropic import AsyncAnthropic, DefaultAsyncHttpxClient

        self._client = AsyncAnthropic(
            api_key=cfg.api_key.reveal() or "none",
            base_url=cfg.base_url or None,
            timeout=cfg.deadline_seconds,
            max_retries=2,
            http_client=DefaultAsyncHttpxClient(verify=tls_context()),
        )
        self._cfg = cfg
        self._tools = [
            {"name": t.name, "description": t.description, "input_schema": t.input_schema}
            for t in tools
        ]
        self._system: list[dict[str, Any]] = [{"type": "text", "text": system}]
        self._messages: list[dict[str, Any]] = [
            {"role": "user", "content": [{"type": "text", "text": user}]}
        ]
        self._marked: dict[str, Any] | None = None
        if cfg.prompt_cache:
            self._system[0]["cache_control"] = EPHEMERAL  # the tools and the system prompt

    async def turn(self) -> Turn:
        kwargs: dict[str, Any] = {}
        if self._tools:
            kwargs["tools"] = self._tools
        if self._cfg.prompt_cache and self._tools:  # no tools: one turn, nothing to re-read
            self._mark_newest()
        msg = await self._client.messages.create(
            model=self._cfg.model,
            max_tokens=self._cfg.max_tokens,
            system=self._system,  # type: ignore[arg-type]
            messages=self._messages,  # type: ignore[arg-type]
            **kwargs,
        )
        if isinstance(msg, str):  # the SDK hands on a body that was not JSON as is
            raise _not_a_reply(msg)
        with _reading("the Anthropic Messages API"):
            return self._read(msg)

    def _read(self, msg: Any) -> Turn:
        """The turn in ``msg`` (the SDK builds it without checking the types)."""
        blocks: list[dict[str, Any]] = []
        texts: list[str] = []
        calls: list[ToolCall] = []
        for block in msg.content:
            if block.type == "text":
                texts.append(_text(block.text))
                blocks.append({"type": "text", "text": block.text})
            elif block.type == "tool_use":
                calls.append(ToolCall(block.id, block.name, _arguments(block.input)))
                blocks.append(
                    {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}
                )
        self._messages.append({"role": "assistant", "content": blocks})
        usage = msg.usage
        written = _count(usage.cache_creation_input_tokens)
        read = _count(usage.cache_read_input_tokens)
        return Turn(
            text="\n".join(texts),
            tool_calls=calls,
            stop_reason=str(msg.stop_reason or ""),
            tokens_in=_count(usage.input_tokens) + written + read,
            tokens_out=_count(usage.output_tokens),
            cache_write=written,
            cache_read=read,
        )

    def _mark_newest(self) -> None:
        """One moving cache breakpoint on the newest block, so each turn of the tool
        loop reads everything before it from the cache (2 of the 4 allowed, with the
        system prompt's)."""
        newest = self._messages[-1]["content"][-1]
        if self._marked is not None and self._marked is not newest:
            self._marked.pop("cache_control", None)
        newest["cache_control"] = EPHEMERAL
        self._marked = newest

    def answer(self, outcomes: list[ToolOutcome]) -> None:
        self._messages.append(
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": o.call_id,
                        "content": o.content,
                        "is_error": o.is_error,
                    }
                    for o in outcomes
                ],
            }
        )

    async def close(self) -> None:
        await self._client.close()


class OpenAIConversation:
    """Chat Completions with function tools (OpenAI and compatible servers)."""

    provider = "openai"

    def __init__(self, cfg: RunnerConfig, system: str, user: str, tools: list[ToolSpec]) -> None:
        from openai import AsyncOpenAI, DefaultAsyncHttpxClient

        self._client = AsyncOpenAI(
            api_key=cfg.api_key.reveal() or "none",
            base_url=cfg.base_url or None,
            timeout=cfg.deadline_seconds,
            max_retries=2,
            http_client=DefaultAsyncHttpxClient(verify=tls_context()),
        )
        self._cfg = cfg
        self._tools = [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.input_schema,
                },
            }
            for t in tools
        ]
        self._messages: list[dict[str, Any]] = [
            {"role": "system", "content": system},
            {"role": "user", "content": user},
        ]

    async def turn(self) -> Turn:
        kwargs: dict[str, Any] = {}
        if self._tools:
            kwargs["tools"] = self._tools
        resp = await self._client.chat.completions.create(
            model=self._cfg.model,
            messages=self._messages,  # type: ignore[arg-type]
            max_tokens=self._cfg.max_tokens,
            **kwargs,
        )
        if isinstance(resp, str):  # the SDK hands on a body that was not JSON as is
            raise _not_a_reply(resp)
        with _reading("the OpenAI Chat Completions API"):
            return self._read(resp)

    def _read(self, resp: Any) -> Turn:
        """The turn in ``resp`` (the SDK builds it without checking the types)."""
        choice = resp.choices[0]
        message = choice.message
        calls: list[ToolCall] = []
        wire_calls: list[dict[str, Any]] = []
        for call in message.tool_calls or []:
            fn = getattr(call, "function", None)
            if fn is None:  # a custom (non-function) tool call: not ours
                continue
            calls.append(ToolCall(call.id, fn.name, _arguments(fn.arguments)))
            wire_calls.append(
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": fn.name, "arguments": fn.arguments},
                }
            )
        content = _text(message.content) if message.content is not None else None
        assistant: dict[str, Any] = {"role": "assistant", "content": content}
        if wire_calls:
            assistant["tool_calls"] = wire_calls
        self._messages.append(assistant)
        usage = resp.usage
        details = usage.prompt_tokens_details if usage else None
        return Turn(
            text=content or "",
            tool_calls=calls,
            stop_reason=str(choice.finish_reason or ""),
            tokens_in=_count(usage.prompt_tokens) if usage else 0,
            tokens_out=_count(usage.completion_tokens) if usage else 0,
            # OpenAI caches long prefixes by itself and says how much it read.
            cache_read=_count(details.cached_tokens) if details else 0,
        )

    def answer(self, outcomes: list[ToolOutcome]) -> None:
        for o in outcomes:
            self._messages.append({"role": "tool", "tool_call_id": o.call_id, "content": o.content})

    async def close(self) -> None:
        await self._client.close()


#: The providers, each the name of the SDK its conversation imports.
SDKS = frozenset({"anthropic", "openai"})
_warming: set[str] = set()  # providers a warm() thread was started for
_ready: set[str] = set()  # providers whose SDK is loaded (see _load)


def _load(provider: str) -> None:
    """Import ``provider``'s SDK, build the TLS context, and build a client once:
    that loads what a first request would otherwise import on the loop (the HTTP/1.1
    and HTTP/2 transports, the API resources: ~70 ms of CPU, a 336 ms stall under
    load in a soak). The client is never used."""
    sdk = importlib.import_module(provider)
    http = sdk.DefaultAsyncHttpxClient(verify=tls_context())
    if provider == "anthropic":
        _ = sdk.AsyncAnthropic(api_key="warm-up", http_client=http).messages
    else:
        _ = sdk.AsyncOpenAI(api_key="warm-up", http_client=http).chat.completions


def _load_quietly(provider: str) -> None:
    try:
        _load(provider)
    except Exception:  # noqa: BLE001, S110 - the run's own import reports it
        pass


def warm(provider: str) -> None:
    """Start loading ``provider``'s SDK in a thread of its own (once), so that the
    agent's first run finds it loaded."""
    if provider not in SDKS or provider in _warming or provider in _ready:
        return
    _warming.add(provider)
    threading.Thread(
        target=_load_quietly, args=(provider,), name=f"import {provider}", daemon=True
    ).start()


async def sdk_ready(provider: str) -> None:
    """Have ``provider``'s SDK loaded without holding the event loop: in a worker
    thread, which waits on the import lock while :func:`warm`'s import runs.
    Raises what the import raises (an SDK missing)."""
    if provider not in SDKS or provider in _ready:
        return
    await anyio.to_thread.run_sync(_load, provider)
    _ready.add(provider)


async def open_conversation(
    cfg: RunnerConfig, system: str, user: str, tools: list[ToolSpec]
) -> Conversation:
    """The conversation for ``cfg.provider``, its SDK loaded off the event loop."""
    await sdk_ready(str(cfg.provider))
    if cfg.provider == "anthropic":
        return AnthropicConversation(cfg, system, user, tools)
    if cfg.provider == "openai":
        return OpenAIConversation(cfg, system, user, tools)
    raise ValueError(f"unknown LLM provider {cfg.provider!r}")


@contextmanager
def _reading(api: str) -> Iterator[None]:
    """Reading a model's answer: one whose fields are not where or what ``api`` puts
    them (a proxy, a server that only looks compatible) is a ModelAnswerError naming
    what was off, not the AttributeError it would be."""
    try:
        yield
    except (AttributeError, TypeError, ValueError, KeyError, IndexError) as exc:
        raise ModelAnswerError(
            f"the model endpoint's answer is not shaped as {api}'s (is provider right for "
            f"base_url?): {type(exc).__name__}: {str(exc)[:200]}"
        ) from None


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"text is {type(value).__name__}, not a string")
    return value


def _not_a_reply(body: str) -> ModelAnswerError:
    return ModelAnswerError(
        "the model endpoint answered with no reply (is base_url the API's own, "
        f"e.g. http://host:11434/v1?): {body[:200]!r}"
    )


def _count(value: int | None) -> int:
    """A token count as the API reports it; a negative one (a broken or hostile
    endpoint) counts as none: it would take spend off the day's cost cap."""
    return max(0, int(value or 0))
