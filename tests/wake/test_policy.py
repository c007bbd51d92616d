"""WakePolicy decoding: defaults, bounds, unknown keys, the command runner's argv."""

from __future__ import annotations

import msgspec
import pytest

from daemon.wake.policy import WakePolicy


def test_empty_table_gives_safe_defaults() -> None:
    """No [wake] table: a budget, collect mode, the log runner, audits off."""
    policy = msgspec.convert({}, WakePolicy)
    assert policy == WakePolicy()
    assert policy.queue_mode == "collect" and policy.runner.kind == "log"
    assert policy.max_runs_per_hour > 0 and policy.audit_interval_seconds == 0


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"max_runs_per_hour": -1}, "max_runs_per_hour"),
        ({"queue_mode": "later"}, "queue_mode"),
        ({"max_collected": 0}, "max_collected"),
        ({"cooldown": 5}, "unknown field `cooldown`"),
        ({"runner": {"kind": "command"}}, "must name the program"),
        ({"runner": {"kind": "command", "command": ["x"], "timeout_seconds": 0}}, "timeout"),
        ({"runner": {"kind": "command", "command": "echo hi"}}, "command"),
    ],
)
def test_bad_values_are_rejected_with_the_key(raw: dict[str, object], message: str) -> None:
    """Each bad value fails with an error naming the key."""
    with pytest.raises(msgspec.ValidationError, match=message):
        msgspec.convert(raw, WakePolicy)


def test_command_runner_table() -> None:
    """A command runner decodes its argv and limits."""
    policy = msgspec.convert(
        {"runner": {"kind": "command", "command": ["/usr/bin/agent", "--json"]}}, WakePolicy
    )
    assert policy.runner.command == ["/usr/bin/agent", "--json"]
