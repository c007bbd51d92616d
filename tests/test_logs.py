"""Outage: a repeating failure is one line when it starts and one when it ends."""

from __future__ import annotations

import structlog
import structlog.testing

from daemon.logs import Outage


def test_an_outage_is_logged_when_it_starts_and_when_it_ends() -> None:
    log = structlog.get_logger("test")
    outage = Outage(log, "store failing", "store works again", level="warning")
    quiet = Outage(log, "snapshot not written")  # no line when it ends
    with structlog.testing.capture_logs() as logs:
        outage.worked()  # nothing failed: nothing to say
        for error in ("disk full", "disk full", "still full"):
            outage.failed(error, agent="a")
        assert outage.error == "still full"  # the current one, for status
        outage.worked(agent="a")
        outage.worked()
        outage.failed("again")
        quiet.failed("x")
        quiet.worked()
    assert [(e["log_level"], e["event"], e.get("error")) for e in logs] == [
        ("warning", "store failing", "disk full"),
        ("info", "store works again", None),
        ("warning", "store failing", "again"),
        ("error", "snapshot not written", "x"),
    ]
    assert outage.error == "again" and quiet.error == ""
