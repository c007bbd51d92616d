"""Runners: what an agent run actually does with a :class:`WakeContext`.

A runner is anything with a ``name`` and ``async def run(ctx) -> RunResult``;
:class:`daemon.llm.runner.LlmRunner` (``kind = "llm"``) plugs in the same way. A runner reports
failures in its result; the scheduler also survives one that raises.

* :class:`LogRunner` (the default) logs the run and calls nothing.
* :class:`CommandRunner` runs a configured argv (never through a shell) in its
  own process group, writes the context as one JSON object to its stdin and
  closes it, keeps at most ``max_output_bytes`` of stdout and of stderr (the
  rest is read and dropped so the child never blocks on a full pipe), and
  kills the whole group when ``timeout`` passes. The run ends when the program
  exits: what it left running in its group is killed then (after
  ``LEFTOVER_GRACE`` for its output), so a background child holding stdout
  neither holds the run until the timeout nor outlives it. The child's environment is
  only ``PATH``, ``LANG`` and ``MARKETWAKE_AGENT_ID``: daemon secrets stay put.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeGuard

import anyio
import anyio.abc
import msgspec
import structlog

from daemon.wake.context import RunResult, Usage, WakeContext
from daemon.wake.policy import RunnerConfig

log = structlog.get_logger("wake.runner")
_encoder = msgspec.json.Encoder()
_PASSED_ENV = ("PATH", "LANG")
# Seconds the program's pipes may stay open after it exits (its leftovers still writing).
LEFTOVER_GRACE = 1.0


class Runner(Protocol):
    """Does one agent run."""

    name: str

    async def run(self, ctx: WakeContext) -> RunResult:
        """Run the agent for ``ctx``; report failures in the result."""
        ...


# Gets what a run has spent so far (running totals).
Spent = Callable[[Usage], None]


class SpendingRunner(Protocol):
    """A runner that reports its spend as it goes (the LLM runner): the scheduler keeps
    it, so a run a kill cuts still counts against ``max_cost_per_day``."""

    name: str
    reports_spend: ClassVar[bool]

    async def run(self, ctx: WakeContext, spent: Spent | None = None) -> RunResult:
        """As :meth:`Runner.run`; ``spent`` gets the running totals after each call
        that spends."""
        ...


def is_spending(runner: object) -> TypeGuard[SpendingRunner]:
    """Whether ``runner`` is a :class:`SpendingRunner` (by its class flag: a runtime
    protocol check cost ~9 us, once per run of a backtest's quarter of candles)."""
    return getattr(runner, "reports_spend", False) is True


class LogRunner:
    """Records that the agent would run; calls no LLM."""

    name = "log"

    def __init__(self) -> None:
        # Bound once (at an agent's start, after logging is configured): a backtest
        # runs this for a quarter of its candles, and the module's lazy logger builds
        # a new bound logger on every call.
        self._log = log.bind()

    async def run(self, ctx: WakeContext) -> RunResult:
        """Log the run's reasons and succeed."""
        self._log.info(
            "agent run",
            agent=ctx.agent_id,
            run=ctx.run_id,
            kind=ctx.kind,
            reasons=[r.reason for r in ctx.reasons],
            earlier=ctx.earlier,
        )
        return RunResult(status="ok")


def scrubbed_env(agent_id: str, parent: dict[str, str] | None = None) -> dict[str, str]:
    """The child environment: PATH and LANG from the parent, plus the agent id."""
    source = os.environ if parent is None else parent
    env = {k: source[k] for k in _PASSED_ENV if k in source}
    env["MARKETWAKE_AGENT_ID"] = agent_id
    return env


class _Capture:
    """Keeps the first ``limit`` bytes of a stream and drains the rest."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.data = bytearray()
        self.truncated = False

    async def drain(self, stream: anyio.abc.ByteReceiveStream | None) -> None:
        if stream is None:
            return
        async for chunk in stream:
            room = self.limit - len(self.data)
            if len(chunk) > room:
                self.truncated = True
            if room > 0:
                self.data += chunk[:room]

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


async def _feed(stream: anyio.abc.ByteSendStream | None, payload: bytes) -> None:
    """Write the context and close stdin; a child that never reads is not an error."""
    if stream is None:
        return
    try:
        await stream.send(payload)
    except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        pass
    finally:
        try:
            await stream.aclose()
        except OSError:
            pass


def _kill_group(process: anyio.abc.Process) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class CommandRunner:
    """Pipes the wake context as JSON to a program and captures what it says."""

    name = "command"

    def __init__(
        self,
        argv: Sequence[str],
        *,
        timeout: float = 300.0,
        max_output_bytes: int = 64 * 1024,
        cwd: Path | None = None,
    ) -> None:
        if not argv or not argv[0]:
            raise ValueError("CommandRunner needs a program to run")
        self.argv = list(argv)
        self.timeout = timeout
        self.max_output_bytes = max_output_bytes
        self.cwd = cwd

    async def run(
        self, ctx: WakeContext, spawned: Callable[[int], None] | None = None
    ) -> RunResult:
        """Start the program, feed it, wait for it (or kill it), report; ``spawned``
        gets its pid as it starts (the scheduler keeps it: see :mod:`.leftovers`)."""
        try:
            process = await anyio.open_process(
                self.argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=scrubbed_env(ctx.agent_id),
                cwd=self.cwd,
                start_new_session=True,
            )
        except OSError as exc:
            return RunResult(status="failed", error=f"cannot start {self.argv[0]!r}: {exc}")
        if spawned is not None:
            spawned(process.pid)
        out, err = _Capture(self.max_output_bytes), _Capture(self.max_output_bytes)
        timed_out = await self._supervise(process, _encoder.encode(ctx), out, err)
        truncated = out.truncated or err.truncated
        if timed_out:
            return RunResult(
                status="timeout",
                exit_code=process.returncode,
                stdout=out.text(),
                stderr=err.text(),
                truncated=truncated,
                error=f"killed after {self.timeout:g} s",
            )
        code = process.returncode
        return RunResult(
            status="ok" if code == 0 else "failed",
            exit_code=code,
            stdout=out.text(),
            stderr=err.text(),
            truncated=truncated,
            error=None if code == 0 else f"exit status {code}",
        )

    async def _supervise(
        self, process: anyio.abc.Process, payload: bytes, out: _Capture, err: _Capture
    ) -> bool:
        """Feed and drain the child within the timeout; True when it had to be killed.
        Once it exits, what it left in its process group is killed."""
        drained = anyio.Event()

        async def drain() -> None:
            async with anyio.create_task_group() as tg:
                tg.start_soon(out.drain, process.stdout)
                tg.start_soon(err.drain, process.stderr)
            drained.set()

        try:
            with anyio.move_on_after(self.timeout) as scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_feed, process.stdin, payload)
                    tg.start_soon(drain)
                    await process.wait()
                    with anyio.move_on_after(LEFTOVER_GRACE):
                        await drained.wait()
                    if not drained.is_set():
                        log.warning(
                            "the run's program exited and left processes holding its "
                            "output: killed",
                            program=self.argv[0],
                            exit_code=process.returncode,
                        )
                    _kill_group(process)  # its leftovers (none: nothing to kill)
                    with anyio.move_on_after(LEFTOVER_GRACE):
                        await drained.wait()  # the killed writers closed their ends
                    tg.cancel_scope.cancel()  # one that left the group holds them still
            return scope.cancelled_caught
        finally:
            _kill_group(process)  # on a timeout or a cancel: the program and its group
            with anyio.CancelScope(shield=True):
                await process.aclose()


def build_runner(
    config: RunnerConfig, *, agent_dir: Path | None = None, tools: Any = None
) -> Runner:
    """The runner a policy asks for; an ``llm`` runner reads ``agent_dir``/AGENT.md and
    calls ``tools`` (a :class:`daemon.llm.runner.ToolBox`; None: no tools)."""
    if config.kind == "llm":
        from daemon.llm.runner import LlmRunner  # the SDKs load only for LLM agents

        return LlmRunner(config, tools=tools, agent_dir=agent_dir)
    if config.kind == "command":
        return CommandRunner(
            config.command,
            timeout=config.timeout_seconds,
            max_output_bytes=config.max_output_bytes,
        )
    return LogRunner()
