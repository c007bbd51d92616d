"""LlmRunner: one agent run = a model conversation with tools, under a deadline.

The loop: ask the model for a turn; if it called tools, run every call of that
turn **concurrently** (seed 002: the bundled tools exist so a run needs few,
parallel calls) through the tool box, answer them, and ask again; stop when
the model answers without tools. Bounds:

* ``deadline_seconds`` (45 by default, seed 002's budget) covers the whole run:
  model turns, the SDK's own retries of 429/5xx, tool calls. A run past it is
  cut and reported as ``timeout`` with what it had used so far.
* ``max_tool_calls`` per run: calls past it are answered with an error that
  asks the model to conclude; a model that keeps calling ends the run.
* each tool has its own time budget (:meth:`daemon.tools.base.Registry.call`).

Every run reports tokens in and out (and of the input, what the provider's
prompt cache wrote and read), its cost at the configured prices, why it
stopped and each tool call (name, a digest of its arguments, duration, ok or
the error), for the audit ``run`` record.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal, Protocol

import anyio
import msgspec
import structlog

from daemon.audit.records import LlmReport, ToolCallReport
from daemon.config import unexpanded
from daemon.errors import NOT_JSON, ConfigError
from daemon.llm.conversation import (
    Conversation,
    ToolCall,
    ToolOutcome,
    ToolSpec,
    Turn,
    open_conversation,
    warm,
)
from daemon.llm.prompt import render_context, system_prompt
from daemon.tools.base import Registry, render
from daemon.tools.calls import AgentCall
from daemon.tools.context import ToolContext
from daemon.wake.context import RunResult, WakeContext
from daemon.wake.policy import RunnerConfig
from daemon.wake.runners import Spent

log = structlog.get_logger("llm")
OpenConversation = Callable[[RunnerConfig, str, str, list[ToolSpec]], Awaitable[Conversation]]
# Sees the run as it goes (``marketwake agent run`` prints it): the prompt, each
# model turn, and each tool call with its answer.
Observer = Callable[["Step"], None]


class Step(msgspec.Struct, frozen=True):
    """One thing that happened in a run, for a transcript."""

    kind: str  # "system" | "user" | "turn" | "tool"
    text: str = ""
    turn: Turn | None = None
    call: ToolCall | None = None
    outcome: ToolOutcome | None = None


_ERROR_CHARS = 500


class ToolBox(Protocol):
    """The tools a run may call."""

    def for_run(self, ctx: WakeContext, config: RunnerConfig) -> ToolBox:
        """The same tools, acting for this run's agent (trading tools need to know)."""
        ...

    def specs(self) -> list[ToolSpec]:
        """What the model is offered."""
        ...

    async def call(self, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        """Run one call: (JSON text for the model, whether it is an error). Never raises."""
        ...


class RegistryToolBox:
    """The tool registry of :mod:`daemon.tools`, called in-process with its context."""

    def __init__(
        self,
        registry: Registry[ToolContext] | Callable[[], Registry[ToolContext]],
        ctx: ToolContext,
    ) -> None:
        self._registry = registry  # or what builds it, at the first run that needs it
        self.ctx = ctx

    @property
    def registry(self) -> Registry[ToolContext]:
        if not isinstance(self._registry, Registry):
            self._registry = self._registry()
        return self._registry

    def for_run(self, ctx: WakeContext, config: RunnerConfig) -> RegistryToolBox:
        first = ctx.reasons[0] if ctx.reasons else None
        call = AgentCall(
            agent_id=ctx.agent_id,
            # A re-run signals as the run a stop cut: a signal that run placed before
            # the stop is not placed twice (its key, and so its order, are the same).
            run_id=ctx.rerun_of or ctx.run_id,
            trace_id=first.trace_id if first else None,
            event_id=first.event_id if first else None,
            signal_notional=config.signal_notional,
            min_confidence=config.min_confidence,
            signal_expiry_seconds=config.signal_expiry_seconds,
        )
        return RegistryToolBox(self.registry, self.ctx.for_agent(call))

    def specs(self) -> list[ToolSpec]:
        return [ToolSpec(t.name, t.description, t.input_schema()) for t in self.registry]

    async def call(self, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        data, is_error = render(await self.registry.call(self.ctx, name, arguments))
        return json.dumps(data, separators=(",", ":")), is_error


def args_digest(arguments: dict[str, Any] | None) -> str:
    """A short stable digest of a call's arguments (canonical JSON)."""
    text = json.dumps(arguments, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


class _Tally:
    """What one run used, as it goes (kept even when the run is cut)."""

    def __init__(self) -> None:
        self.tokens_in = 0
        self.tokens_out = 0
        self.cache_write = 0
        self.cache_read = 0
        self.model_calls = 0
        self.calls: list[ToolCallReport] = []
        self.text = ""
        self.stop = ""


class LlmRunner:
    """Runs the model for one wake context (see the module docstring)."""

    name = "llm"
    reports_spend = True  # a SpendingRunner

    def __init__(
        self,
        config: RunnerConfig,
        *,
        tools: ToolBox | None = None,
        agent_dir: Path | None = None,
        open_conv: OpenConversation = open_conversation,
        observer: Observer | None = None,
    ) -> None:
        self.config = config
        self.tools = tools
        self.agent_dir = agent_dir
        self._open = open_conv
        self._observe: Observer = observer or (lambda _: None)
        if tools is not None and config.max_tool_calls:
            tools.specs()  # the tools' modules load as the agent does, not at its first wake
        if open_conv is open_conversation:
            warm(str(config.provider))  # its SDK too, in a thread (see daemon/llm/conversation.py)

    async def run(self, ctx: WakeContext, spent: Spent | None = None) -> RunResult:
        """The whole run; failures and the deadline are reported in the result;
        ``spent`` gets the run's usage so far after each model call."""
        cfg = self.config
        tools = self.tools.for_run(ctx, cfg) if self.tools is not None else None
        specs = tools.specs() if tools is not None and cfg.max_tool_calls else []
        tally = _Tally()
        status: Literal["ok", "failed", "timeout"] = "ok"
        error: str | None = None
        conv: Conversation | None = None
        try:
            with anyio.move_on_after(cfg.deadline_seconds) as scope:
                try:
                    if missing := unexpanded(cfg.api_key.reveal()):
                        # Loaded while the agent was disabled; never send the literal as a key.
                        raise ConfigError(
                            f"runner.api_key reads ${{{missing[0]}}}, which is not set in the "
                            "environment"
                        )
                    system, user = await system_prompt(self.agent_dir), render_context(ctx)
                    self._observe(Step("system", system))
                    self._observe(Step("user", user))
                    conv = await self._open(cfg, system, user, specs)
                    await self._loop(conv, tally, tools, spent)
                except Exception as exc:  # noqa: BLE001 - an API or protocol failure ends this run only
                    status, tally.stop = "failed", "error"
                    error = f"{type(exc).__name__}: {exc}"[:_ERROR_CHARS]
                    log.warning("llm run failed", agent=ctx.agent_id, run=ctx.run_id, error=error)
            if scope.cancelled_caught:
                status, tally.stop = "timeout", "deadline"
                error = f"the run passed its {cfg.deadline_seconds:g} s deadline and was cut"
        finally:  # a cancelled run (a stop, a reload) closes its connection too
            if conv is not None:
                with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                    await conv.close()
        return RunResult(status=status, error=error, llm=self._report(tally))

    async def _loop(
        self, conv: Conversation, tally: _Tally, tools: ToolBox | None, spent: Spent | None
    ) -> None:
        limit = self.config.max_tool_calls
        while True:
            turn = await conv.turn()
            self._observe(Step("turn", turn=turn))
            tally.model_calls += 1
            tally.tokens_in += turn.tokens_in
            tally.tokens_out += turn.tokens_out
            tally.cache_write += turn.cache_write
            tally.cache_read += turn.cache_read
            if spent is not None:
                spent((round(run_cost(self.config, tally), 6), tally.tokens_in, tally.tokens_out))
            if turn.text:
                tally.text = turn.text
            if not turn.tool_calls:
                tally.stop = turn.stop_reason or "end_turn"
                return
            left = limit - len(tally.calls)
            if left <= 0:
                tally.stop = "max_tool_calls"
                return
            run_now, refused = turn.tool_calls[:left], turn.tool_calls[left:]
            outcomes = await self._call_all(run_now, tally, tools)
            note = (
                f"not run: this run's budget of {limit} tool calls is used up; "
                "answer now with what you have"
            )
            outcomes += [ToolOutcome(c.id, json.dumps({"error": note}), True) for c in refused]
            conv.answer(outcomes)

    async def _call_all(
        self, calls: list[ToolCall], tally: _Tally, tools: ToolBox | None
    ) -> list[ToolOutcome]:
        """Every call of one turn at once; answers in the model's order."""
        results: list[ToolOutcome | None] = [None] * len(calls)
        reports: list[ToolCallReport | None] = [None] * len(calls)

        async def one(i: int, call: ToolCall) -> None:
            t0 = time.perf_counter()
            if call.arguments is None:
                text, bad = json.dumps({"error": "the arguments are not a JSON object"}), True
            elif tools is None:
                text, bad = json.dumps({"error": f"no tool named {call.name!r}"}), True
            else:
                text, bad = await tools.call(call.name, call.arguments)
            results[i] = outcome = ToolOutcome(call.id, text, bad)
            self._observe(Step("tool", call=call, outcome=outcome))
            reports[i] = ToolCallReport(
                name=call.name,
                args_digest=args_digest(call.arguments),
                duration_ms=round((time.perf_counter() - t0) * 1000, 3),
                ok=not bad,
                error=_error_of(text) if bad else None,
            )

        async with anyio.create_task_group() as tg:
            for i, call in enumerate(calls):
                tg.start_soon(one, i, call)
        tally.calls += [r for r in reports if r is not None]
        return [r for r in results if r is not None]

    def _report(self, tally: _Tally) -> LlmReport:
        cfg = self.config
        return LlmReport(
            provider=str(cfg.provider),
            model=cfg.model,
            tokens_in=tally.tokens_in,
            tokens_out=tally.tokens_out,
            tokens_cache_write=tally.cache_write,
            tokens_cache_read=tally.cache_read,
            cost=round(run_cost(cfg, tally), 6),
            model_calls=tally.model_calls,
            stop_reason=tally.stop,
            tool_calls=tally.calls,
            text=tally.text[:4000],
        )


CACHE_WRITE_FACTOR = 1.25  # Anthropic's price of a cache write, x the input price
CACHE_READ_FACTOR = 0.1  # and of a read, unless [wake.runner] names its own price


def run_cost(cfg: RunnerConfig, tally: _Tally) -> float:
    """What the run's tokens cost: uncached input, cache writes and reads, output."""
    p_in = cfg.price_input_per_mtok
    p_read = cfg.price_cached_input_per_mtok
    if p_read is None:
        p_read = p_in * CACHE_READ_FACTOR if cfg.provider == "anthropic" else p_in
    # A server that reports more cached tokens than input ones never earns a refund.
    plain = max(0, tally.tokens_in - tally.cache_write - tally.cache_read)
    return (
        plain * p_in
        + tally.cache_write * p_in * CACHE_WRITE_FACTOR
        + tally.cache_read * p_read
        + tally.tokens_out * cfg.price_output_per_mtok
    ) / 1e6


def _error_of(text: str) -> str:
    """The one-line error of a tool's error answer (its ``message``, else the text)."""
    try:
        data = msgspec.json.decode(text)
    except NOT_JSON:
        return text[:200]
    if isinstance(data, dict):
        return str(data.get("message") or data.get("error") or text)[:200]
    return text[:200]
