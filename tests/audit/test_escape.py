"""Hook-controlled strings cannot inject terminal escapes or forge lines in tail / why."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from daemon.audit.writer import AuditWriter
from daemon.printable import visible
from tests.audit.factory import hook

ROOT = Path(__file__).resolve().parents[2]
FORGED = "\n2026-02-17 03:05:00.000 example wake_two_green WAKE Two consecutive green candles"
EVIL = "\x1b[2J\x1b[H\x1b]0;pwned\x07calm" + FORGED + "\u202eesrever"


def test_visible_escapes_controls_and_bidi_but_keeps_text() -> None:
    assert visible("plain reason, ünïcode ok") == "plain reason, ünïcode ok"
    out = visible(EVIL)
    assert "\x1b" not in out and "\n" not in out and "\x07" not in out and "\u202e" not in out
    assert "\\x1b[2J" in out and "\\n2026-02-17" in out and "\\u202e" in out


def test_tail_and_why_print_escapes_visibly(tmp_path: Path) -> None:
    d = tmp_path / "audit"
    w = AuditWriter(d)
    w.write(hook(decision="WAKE", reason=EVIL, dedupe_key="k\x1b[31m", hook_id="wake_x\rforged"))
    w.write(hook(agent_id="other", error="boom\n\x1b[32mfine", decision=None))
    w.close()
    for args in (["audit", "tail", "--dir", str(d)], ["why", "t1", "--dir", str(d)]):
        res = subprocess.run(
            [sys.executable, "-m", "daemon.cli", *args],
            cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert res.returncode == 0, res.stderr
        assert "\x1b" not in res.stdout and "\x07" not in res.stdout and "\r" not in res.stdout
        assert "\\x1b[2J" in res.stdout
        # the forged text stays on the line of the record that carried it
        forged = [ln for ln in res.stdout.splitlines() if "Two consecutive green" in ln]
        assert forged and all("\\n2026-02-17" in ln for ln in forged)


def test_a_refused_signal_row_renders_on_one_line_with_its_reason_escaped() -> None:
    """A webhook refusal quotes what the sender sent (a leader name, a field name)."""
    import msgspec

    from daemon.audit.records import SignalRecord
    from daemon.audit.render import render

    row = SignalRecord(
        ts="2026-11-25T12:00:00.000Z",
        agent_id="-",
        source="copytrade_webhook",
        leader="alice",
        signal_id=None,
        status="rejected",
        http_status=422,
        reason="invalid signal: unknown field " + EVIL,
        remote="127.0.0.1",
    )
    text = render(msgspec.to_builtins(row)).plain
    assert text.startswith("2026-11-25 12:00:00.000 - signal rejected alice/? (422): invalid")
    assert "\x1b" not in text and "\n" not in text and text.endswith("from 127.0.0.1")
