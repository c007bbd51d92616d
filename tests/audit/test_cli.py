"""`marketwake audit tail`: filters, --json, --config, bad input, and -f as a real process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from daemon.audit.writer import AuditWriter
from daemon.cli.audit import audit_group, why_command
from tests.audit.factory import hook, order, ts, wake


@pytest.fixture
def logdir(tmp_path: Path) -> Path:
    d = tmp_path / "audit"
    w = AuditWriter(d)
    w.write(hook(ts=ts("2026-02-16"), reason="yesterday"))
    w.write(hook(decision="WAKE", reason="two green"))
    w.write(
        hook(agent_id="beta", hook_id="autotrade_doji", decision="TRADE_INTENT", symbol="BTC-USD")
    )
    w.write(wake())
    w.write(order())
    w.close()
    return d


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(audit_group, ["tail", *args])
    return result.exit_code, result.output


def test_tail_prints_readable_lines(logdir: Path) -> None:
    """Default output is one readable line per record: time, agent, hook, decision, reason."""
    code, out = invoke("--dir", str(logdir), "-n", "3")
    assert code == 0
    lines = out.splitlines()
    assert len(lines) == 3
    assert "beta autotrade_doji TRADE_INTENT" in lines[0]
    assert "alpha wake woke" in lines[1]
    assert "order FILLED buy 0.01 ETH-USD @ 1000" in lines[2]


def test_hand_edited_rows_print_and_filter_without_a_crash(logdir: Path) -> None:
    """A row whose type is an object, a runtime or a duration that is text: the filters
    pass over it and the line prints (found by fuzzing the audit file: TypeError and
    ValueError out of `audit tail`)."""
    part = max(logdir.iterdir())
    with part.open("ab") as fh:
        fh.write(b'{"type": {"x": 1}, "ts": "2026-02-17T02:00:00.000Z"}\n')
        fh.write(
            b'{"type": "hook", "agentId": "alpha", "runtimeMs": "soon", "decision": "IGNORE"}\n'
        )
        fh.write(b'{"type": "run", "runId": "r1", "status": "finished", "durationMs": [1]}\n')
    code, out = invoke("--dir", str(logdir), "--type", "hook", "--type", "run", "-n", "2")
    assert code == 0, out
    assert "alpha" in out and "IGNORE" in out and "0.00ms" in out
    assert "run r1 finished in 0ms" in out


@pytest.mark.parametrize(
    ("args", "reasons"),
    [
        (["--agent", "alpha", "--type", "hook"], ["yesterday", "two green"]),
        (["--decision", "WAKE"], ["two green"]),
        (["--hook", "autotrade_doji"], ["one green candle"]),
        (["--symbol", "BTC-USD"], ["one green candle"]),
        (["--since", "2026-02-17T00:00:00Z", "--kind", "hook"], ["two green", "one green candle"]),
    ],
)
def test_tail_filters_json(logdir: Path, args: list[str], reasons: list[str]) -> None:
    """--json prints the stored lines, and each filter narrows them."""
    code, out = invoke("--dir", str(logdir), "--json", *args)
    assert code == 0, out
    assert [json.loads(line)["reason"] for line in out.splitlines()] == reasons


def test_tail_dir_from_config(logdir: Path, tmp_path: Path) -> None:
    """Without --dir the log is <daemon.state_dir>/audit of --config."""
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[daemon]\nstate_dir = "{logdir.parent}"\n')
    code, out = invoke("--config", str(cfg), "--json", "-n", "1")
    assert code == 0 and json.loads(out)["type"] == "order"


def test_tail_and_why_read_a_state_dir(logdir: Path, tmp_path: Path) -> None:
    """--state-dir (what status and hooks take; a backtest's OUT/state) reads its audit/;
    --dir still wins, and a state dir without a log is named with both options."""
    cfg = tmp_path / "config.toml"
    cfg.write_text('[daemon]\nstate_dir = "/nonexistent"\n')
    code, out = invoke("--state-dir", str(logdir.parent), "--config", str(cfg), "--json", "-n", "1")
    assert code == 0 and json.loads(out)["type"] == "order"
    code, out = invoke("--state-dir", str(tmp_path / "none"), "--dir", str(logdir), "-n", "1")
    assert code == 0 and "order FILLED" in out
    code, out = invoke("--state-dir", str(tmp_path / "none"))
    assert code == 1 and f"no audit log at {tmp_path / 'none' / 'audit'}" in out
    assert "--state-dir" in out
    why = CliRunner().invoke(why_command, ["nope", "--state-dir", str(logdir.parent)])
    assert why.exit_code == 1 and "no audit records for nope" in why.output  # the log was read


def test_tail_bad_since_is_a_usage_error(logdir: Path) -> None:
    """A malformed --since exits 2 and explains the accepted forms."""
    code, out = invoke("--dir", str(logdir), "--since", "last tuesday")
    assert code == 2 and "expected a duration" in out


def test_tail_missing_dir_says_so(tmp_path: Path) -> None:
    """An absent audit directory is a one-line error naming it (a typo'd path or the
    wrong config would otherwise look like an empty log)."""
    code, out = invoke("--dir", str(tmp_path / "none"))
    assert code == 1 and "no audit log at" in out


def test_tail_follow_prints_appended_records(logdir: Path) -> None:
    """tail -f prints the backlog, then records appended later, until stopped."""
    cmd = [sys.executable, "-m", "daemon.cli", "audit", "tail", "-f", "--json", "-n", "1"]
    cmd += ["--agent", "alpha", "--dir", str(logdir), "--poll", "0.02"]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            assert json.loads(proc.stdout.readline())["type"] == "order"
            w = AuditWriter(logdir)
            w.write(hook(agent_id="beta", reason="filtered out"))
            w.write(hook(reason="appended later"))
            w.close()
            assert json.loads(proc.stdout.readline())["reason"] == "appended later"
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def test_tail_shows_the_event_time_and_refuses_unknown_decisions(logdir: Path) -> None:
    """A replay is read by its own dates: hook lines show the event's time beside the
    wall clock; a misspelt --decision lists the valid ones (exit 2)."""
    code, out = invoke("--dir", str(logdir), "--type", "hook", "-n", "1")
    assert code == 0 and "event 2025-03-01 12:05:00" in out
    code, out = invoke("--dir", str(logdir), "--decision", "BOGUS")
    assert code == 2 and "'BOGUS' is not one of" in out and "trade_intent" in out
