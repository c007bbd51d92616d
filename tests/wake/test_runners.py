"""CommandRunner with real subprocesses; LogRunner; runner selection from the policy."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import anyio
import msgspec
import pytest

from daemon.wake.context import WakeContext, WakeReason
from daemon.wake.policy import RunnerConfig
from daemon.wake.runners import CommandRunner, LogRunner, build_runner, scrubbed_env


def context(agent: str = "a1") -> WakeContext:
    """A wake context with one reason."""
    reason = WakeReason(
        hook_id="wake_two_green",
        reason="two green candles",
        event_id="ev1",
        trace_id="tr1",
        symbol="BTC-USD",
        topic="market.candle.closed",
        ts="2026-02-17T03:05:00.000Z",
    )
    return WakeContext(
        agent_id=agent,
        run_id="r1",
        kind="wake",
        triggered_at="2026-02-17T03:05:01.000Z",
        reasons=[reason],
        state={"price": 100.5},
    )


def py(code: str) -> list[str]:
    """An argv running ``code`` in this interpreter."""
    return [sys.executable, "-c", code]


ECHO = (
    "import json, sys; ctx = json.load(sys.stdin); "
    "print(ctx['agentId'], ctx['reasons'][0]['traceId'], ctx['state']['price'], ctx['kind'])"
)


async def test_command_gets_context_json_on_stdin() -> None:
    """The program reads the camelCase context from stdin; its stdout is captured."""
    result = await CommandRunner(py(ECHO), timeout=20).run(context())
    assert result.status == "ok" and result.exit_code == 0
    assert result.stdout.split() == ["a1", "tr1", "100.5", "wake"]
    assert not result.truncated and result.error is None


async def test_context_wire_shape() -> None:
    """The documented keys are what goes on the wire."""
    wire = json.loads(msgspec.json.encode(context()))
    assert sorted(wire) == sorted(
        [
            "agentId",
            "runId",
            "kind",
            "triggeredAt",
            "reasons",
            "earlier",
            "earlierCount",
            "state",
            "rerunOf",
        ]
    )
    assert sorted(wire["reasons"][0]) == sorted(
        ["hookId", "reason", "eventId", "traceId", "symbol", "topic", "ts"]
    )


async def test_nonzero_exit_is_failed_with_stderr() -> None:
    """A non-zero exit is a failed run that keeps stderr."""
    code = "import sys; sys.stderr.write('bad input'); sys.exit(3)"
    result = await CommandRunner(py(code), timeout=20).run(context())
    assert (result.status, result.exit_code, result.stderr) == ("failed", 3, "bad input")
    assert result.error == "exit status 3"


async def test_timeout_kills_the_process_group(tmp_path: Path) -> None:
    """On timeout the program and its own child are killed, and the run says timeout."""
    pid_file = tmp_path / "grandchild.pid"
    code = with_a_child(pid_file, "print('started', flush=True); time.sleep(60)")
    t0 = time.monotonic()
    result = await CommandRunner(py(code), timeout=1.0).run(context())
    assert time.monotonic() - t0 < 10
    assert result.status == "timeout" and result.stdout == "started\n"
    assert result.error == "killed after 1 s"
    await gone(int(pid_file.read_text()))


async def test_the_run_ends_when_the_program_exits_and_its_leftovers_are_killed(
    tmp_path: Path,
) -> None:
    """A program that exits 0 but leaves a background child holding its stdout is an ok
    run as soon as it exits (not a timeout once the child lets go), and the child
    does not outlive the run."""
    pid_file = tmp_path / "leftover.pid"
    code = with_a_child(pid_file, "print('decided', flush=True)")
    t0 = time.monotonic()
    result = await CommandRunner(py(code), timeout=20).run(context())
    assert time.monotonic() - t0 < 10
    assert (result.status, result.exit_code, result.stdout) == ("ok", 0, "decided\n")
    await gone(int(pid_file.read_text()))


def with_a_child(pid_file: Path, then: str) -> str:
    """A program that starts a child sleeping 60 s (its pid in ``pid_file``; it
    inherits stdout), then runs ``then``."""
    return (
        "import subprocess, sys, time, pathlib; "
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        f"pathlib.Path({str(pid_file)!r}).write_text(str(p.pid)); {then}"
    )


async def gone(pid: int) -> None:
    """Until ``pid`` is dead (a SIGKILL lands within a tick); fails after 5 s."""
    with anyio.fail_after(5):
        while _alive(pid):  # noqa: ASYNC110 - no event tells us a foreign process died
            await anyio.sleep(0.02)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting to be reaped counts as dead)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


async def test_output_is_bounded_and_the_rest_drained() -> None:
    """A chatty program is cut at max_output_bytes and still exits normally (no full pipe)."""
    code = "import sys; sys.stdout.write('x' * 1_000_000); sys.stderr.write('y' * 300_000)"
    result = await CommandRunner(py(code), timeout=20, max_output_bytes=1024).run(context())
    assert result.status == "ok" and result.truncated
    assert result.stdout == "x" * 1024 and result.stderr == "y" * 1024


async def test_environment_is_scrubbed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A secret in the daemon's environment does not reach the program; the agent id does."""
    monkeypatch.setenv("MARKETWAKE_CANARY_SECRET", "hunter2")
    code = "import json, os; print(json.dumps(dict(os.environ)))"
    result = await CommandRunner(py(code), timeout=20).run(context("agent-7"))
    env = json.loads(result.stdout)
    assert "MARKETWAKE_CANARY_SECRET" not in env and "hunter2" not in result.stdout
    assert env["MARKETWAKE_AGENT_ID"] == "agent-7"
    assert set(env) - {"LC_CTYPE"} <= {"PATH", "LANG", "MARKETWAKE_AGENT_ID"}


def test_scrubbed_env_keeps_only_path_and_lang() -> None:
    """Only PATH and LANG pass from the parent."""
    parent = {"PATH": "/bin", "LANG": "C.UTF-8", "AWS_SECRET": "s", "HOME": "/root"}
    assert scrubbed_env("a", parent) == {
        "PATH": "/bin",
        "LANG": "C.UTF-8",
        "MARKETWAKE_AGENT_ID": "a",
    }


async def test_program_that_ignores_stdin_is_fine() -> None:
    """A program that exits without reading its stdin still succeeds."""
    result = await CommandRunner(py("print('hi')"), timeout=20).run(context())
    assert (result.status, result.stdout) == ("ok", "hi\n")


async def test_missing_program_is_a_failed_run(tmp_path: Path) -> None:
    """A program that does not exist fails the run with a message naming it."""
    result = await CommandRunner([str(tmp_path / "nope")], timeout=5).run(context())
    assert result.status == "failed" and "nope" in (result.error or "")


async def test_log_runner_succeeds_without_calling_anything() -> None:
    """The default runner just records the run."""
    assert (await LogRunner().run(context())).status == "ok"


def test_build_runner_from_config() -> None:
    """The policy's runner table picks the runner and its limits."""
    assert isinstance(build_runner(RunnerConfig()), LogRunner)
    cfg = RunnerConfig(
        kind="command", command=["/bin/true"], timeout_seconds=7, max_output_bytes=512
    )
    runner = build_runner(cfg)
    assert isinstance(runner, CommandRunner)
    assert (runner.argv, runner.timeout, runner.max_output_bytes) == (["/bin/true"], 7, 512)
    assert os.path.basename(runner.argv[0]) == "true"
