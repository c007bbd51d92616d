"""One definition per tool: typed request and response, an async function, a description.

A :class:`Tool` is declared once and served twice: the MCP server lists it
(input JSON Schema generated from the request Struct) and the LLM runner calls
it in-process. :meth:`Registry.call` is the only entry point, and it never
raises: arguments that do not fit the request Struct become a
:class:`ToolError` naming every path the model must fix, a tool that overruns
its time budget becomes ``timeout``, and an unexpected exception becomes
``internal`` (logged with its traceback, never shown to the model).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

import anyio
import msgspec
import structlog

log = structlog.get_logger("tools")

Req = TypeVar("Req", bound=msgspec.Struct)
Ctx = TypeVar("Ctx")

ErrorKind = Literal[
    "invalid_arguments", "unknown_tool", "not_found", "unavailable", "timeout", "internal"
]


class Problem(msgspec.Struct, frozen=True, kw_only=True):
    """One thing wrong with the arguments: where (``subscriptions[0].timeout``) and what."""

    path: str
    message: str


class ToolError(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """What a tool answers instead of raising; written for the model to act on."""

    error: ErrorKind
    message: str
    problems: list[Problem] = msgspec.field(default_factory=list)
    suggestion: str | None = None
    retryable: bool = False


@dataclass(frozen=True)
class Tool(Generic[Req, Ctx]):
    """A tool: name, LLM-facing description, request Struct, and the function."""

    name: str
    title: str
    description: str
    request: type[Req]
    run: Callable[[Ctx, Req], Awaitable[msgspec.Struct]]
    # The tool's own budget; a run past it answers ``timeout``. Waiting tools set it
    # from the request (see ``budget``).
    timeout_seconds: float = 30.0
    budget: Callable[[Req], float] | None = None

    def input_schema(self) -> dict[str, Any]:
        """The request as one self-contained JSON Schema object (no ``$ref``)."""
        return inline_schema(self.request)


_REF = re.compile(r"^#/\$defs/(.+)$")


def inline_schema(tp: type[msgspec.Struct]) -> dict[str, Any]:
    """``msgspec.json.schema(tp)`` with every ``$ref`` replaced by its definition.

    Some hosts accept only a plain object schema at the root (``type: object``)."""
    raw = msgspec.json.schema(tp)
    defs: dict[str, Any] = raw.get("$defs", {})

    def resolve(node: Any, depth: int = 0) -> Any:
        if depth > 32:
            raise ValueError(f"{tp.__name__}: schema nests too deep (recursive type?)")
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and (m := _REF.match(ref)):
                merged = {**defs[m.group(1)], **{k: v for k, v in node.items() if k != "$ref"}}
                return resolve(merged, depth + 1)
            return {k: resolve(v, depth + 1) for k, v in node.items() if k != "$defs"}
        if isinstance(node, list):
            return [resolve(v, depth + 1) for v in node]
        return node

    out: dict[str, Any] = resolve(raw)
    out.pop("title", None)
    return out


_AT = re.compile(r" - at `\$(?P<path>[^`]*)`$")


_STEP = re.compile(r"\.?([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]")


def schema_at(schema: dict[str, Any], path: str) -> dict[str, Any] | None:
    """The sub-schema at ``a.b[0].c`` of an inlined object schema, if there is one."""
    node: Any = schema
    for m in _STEP.finditer(path):
        if m.group(1) is not None:
            node = node.get("properties", {}).get(m.group(1)) if isinstance(node, dict) else None
        else:
            node = node.get("items") if isinstance(node, dict) else None
        if node is None:
            return None
    return node if isinstance(node, dict) else None


def problems_of(exc: msgspec.ValidationError, schema: dict[str, Any]) -> list[Problem]:
    """msgspec's message (``Expected `int`, got `str` - at `$.a[0]```) as a Problem;
    a bad enum value also lists the allowed ones."""
    text = str(exc)
    m = _AT.search(text)
    path = m.group("path").lstrip(".") if m else ""
    message = text[: m.start()] if m else text
    sub = schema_at(schema, path) if path else None
    if sub is not None and isinstance(sub.get("enum"), list):
        message += f" (expected one of: {', '.join(map(str, sub['enum']))})"
    return [Problem(path=path or "(arguments)", message=message)]


class Registry(Generic[Ctx]):
    """The tools, by name; the one place a call is decoded, bounded and answered."""

    def __init__(self, tools: Iterable[Tool[Any, Ctx]]) -> None:
        self.tools: dict[str, Tool[Any, Ctx]] = {}
        for tool in tools:
            if tool.name in self.tools:
                raise ValueError(f"tool {tool.name!r} is defined twice")
            self.tools[tool.name] = tool

    def __iter__(self) -> Any:
        return iter(self.tools.values())

    def decode(self, name: str, arguments: Mapping[str, Any] | None) -> msgspec.Struct | ToolError:
        """The typed request for ``name``, or the ToolError the model should read."""
        tool = self.tools.get(name)
        if tool is None:
            return ToolError(
                error="unknown_tool",
                message=f"no tool named {name!r}",
                suggestion=f"available tools: {', '.join(sorted(self.tools))}",
            )
        try:
            request: msgspec.Struct = msgspec.convert(
                dict(arguments or {}), tool.request, strict=False
            )
            return request
        except msgspec.ValidationError as exc:
            return ToolError(
                error="invalid_arguments",
                message=f"{name}: the arguments do not match the tool's schema",
                problems=problems_of(exc, tool.input_schema()),
                suggestion="fix the fields listed in problems and call again",
            )

    async def call(
        self, ctx: Ctx, name: str, arguments: Mapping[str, Any] | None
    ) -> msgspec.Struct:
        """Run one call to completion: the tool's response, or a ToolError. Never raises
        (cancellation of the caller excepted: a cancelled call ends at once)."""
        request = self.decode(name, arguments)
        if isinstance(request, ToolError):
            return request
        tool = self.tools[name]
        limit = tool.budget(request) + 5.0 if tool.budget is not None else tool.timeout_seconds
        try:
            with anyio.fail_after(limit):
                return await tool.run(ctx, request)
        except TimeoutError:
            return ToolError(
                error="timeout",
                message=f"{name} did not finish within {limit:g} s",
                retryable=True,
            )
        except Exception:
            log.exception("tool failed", tool=name)
            return ToolError(
                error="internal",
                message=f"{name} failed unexpectedly (the daemon log has the details)",
                retryable=True,
            )


def render(result: msgspec.Struct) -> tuple[dict[str, Any], bool]:
    """A response as plain JSON data, and whether it is an error."""
    data: dict[str, Any] = msgspec.to_builtins(result)
    return data, isinstance(result, ToolError)
