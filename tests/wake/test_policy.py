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
        ({"rerun_interrupted_within_seconds": -1}, "rerun_interrupted_within_seconds"),
        ({"rerun_interrupted_within_seconds": "soon"}, "rerun_interrupted_within_seconds"),
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


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), 400 * 86400.0])
def test_signal_expiry_is_a_bounded_number_of_seconds(bad: float) -> None:
    """A signal's limit entry is good for 0 (no expiry) up to a year; TOML's nan or inf,
    a negative or a longer time is refused by name."""
    runner = msgspec.convert({"runner": {"signal_expiry_seconds": 3600}}, WakePolicy).runner
    assert runner.signal_expiry_seconds == 3600
    with pytest.raises(msgspec.ValidationError, match="signal_expiry_seconds"):
        msgspec.convert({"runner": {"signal_expiry_seconds": bad}}, WakePolicy)
