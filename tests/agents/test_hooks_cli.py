"""`marketwake hooks test / resume / paused`: usage errors are clear and exit non-zero."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from daemon.agents.store import HookStore
from daemon.cli.hooks import hooks_group

ROOT = Path(__file__).resolve().parent.parent.parent


def test_event_that_is_not_a_feedevent_is_a_usage_error(tmp_path: Path) -> None:
    """A JSON file without the FeedEvent fields is rejected before any hook runs."""
    bad = tmp_path / "ev.json"
    bad.write_text(json.dumps({"x": 1}))
    res = CliRunner().invoke(
        hooks_group, ["test", str(ROOT / "agents" / "example"), "--event", str(bad)]
    )
    assert res.exit_code == 2
    assert "not a FeedEvent" in res.output and "eventId" in res.output


def test_a_state_that_is_not_an_object_is_a_usage_error(tmp_path: Path) -> None:
    """Hooks get a mapping: a list (or any non-object) --state is refused, saying so."""
    event = tmp_path / "ev.json"
    event.write_text(json.dumps({"eventId": "e", "ts": "2026-01-01T00:00:00Z", "source": "s",
                                 "topic": "t", "payload": {}}))  # fmt: skip
    values: list[object] = [[], 5, None]
    for value in values:
        state = tmp_path / "st.json"
        state.write_text(json.dumps(value))
        res = CliRunner().invoke(
            hooks_group,
            [
                "test",
                str(ROOT / "agents" / "example"),
                "--event",
                str(event),
                "--state",
                str(state),
            ],
        )
        assert res.exit_code == 2 and "the state must be a JSON object" in res.output


def test_a_state_the_sandbox_cannot_carry_is_each_hooks_error(tmp_path: Path) -> None:
    """An integer past 64 bits in --state cannot be sent to the worker: each hook gets
    the daemon's "unsendable" error on its line and the command exits 1, no traceback
    (found by mutating the inputs of `hooks test`)."""
    event = tmp_path / "ev.json"
    event.write_text(json.dumps({"eventId": "e", "ts": "2026-01-01T00:00:00Z", "source": "s",
                                 "topic": "t", "payload": {}}))  # fmt: skip
    state = tmp_path / "st.json"
    state.write_text(json.dumps({"indicators": {"n": 2**64}}))
    args = ["test", str(ROOT / "agents" / "example"), "--event", str(event), "--state", str(state)]
    res = CliRunner().invoke(hooks_group, args)
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit | None), res.exception
    lines = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 3 and {line["error_kind"] for line in lines} == {"unsendable"}
    assert all("64" in line["error"] for line in lines)


def test_resume_needs_a_store_and_a_known_hook(tmp_path: Path) -> None:
    """No store: say where we looked. Unknown hook: say so. Known hook: resumed."""
    runner = CliRunner()
    res = runner.invoke(hooks_group, ["resume", "a", "h", "--state-dir", str(tmp_path)])
    assert res.exit_code == 1 and "no hook store at" in res.output
    store = HookStore(tmp_path / "hooks.sqlite3")
    store.record_revision("a", "wake_x", "r1", "p", None)
    store.pause("a", "wake_x", "boom")
    store.close()
    # A hook's name where the agent goes: an unknown agent, and the usage.
    res = runner.invoke(hooks_group, ["resume", "wake_x", "--state-dir", str(tmp_path)])
    assert res.exit_code == 1 and "unknown agent 'wake_x' (agents that ran: a)" in res.output
    assert "usage: hooks resume AGENT wake_x" in res.output
    res = runner.invoke(hooks_group, ["resume", "a", "wake_nope", "--state-dir", str(tmp_path)])
    assert res.exit_code == 1 and "unknown hook a/wake_nope" in res.output
    res = runner.invoke(hooks_group, ["paused", "--state-dir", str(tmp_path)])
    assert "a/wake_x: boom" in res.output
    res = runner.invoke(hooks_group, ["resume", "a", "wake_x", "--state-dir", str(tmp_path)])
    assert res.exit_code == 0 and "resumed a/wake_x" in res.output
