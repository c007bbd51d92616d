"""A line torn by a crash never swallows the next run's first line."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from daemon.appendfile import open_append, repair_tail
from daemon.audit.records import HookRecord
from daemon.audit.writer import AuditWriter


@pytest.mark.parametrize(
    ("before", "torn", "after"),
    [
        (b'{"a":1}\n{"b":', "truncate", b'{"a":1}\n'),
        (b'{"a":1}\n{"b":', "terminate", b'{"a":1}\n{"b":\n'),
        (b'{"a":1}', "terminate", b'{"a":1}\n'),  # whole but unterminated: kept readable
        (b'{"b":', "truncate", b""),  # the only line was torn
        (b'{"a":1}\n', "truncate", b'{"a":1}\n'),  # nothing to repair
        (b"", "terminate", b""),
    ],
)
def test_repair_tail(tmp_path: Path, before: bytes, torn: str, after: bytes) -> None:
    path = tmp_path / "f.jsonl"
    path.write_bytes(before)
    repair_tail(path, torn)  # type: ignore[arg-type]
    assert path.read_bytes() == after


def test_a_missing_file_is_created_on_append(tmp_path: Path) -> None:
    path = tmp_path / "new.jsonl"
    assert repair_tail(path, "truncate") == 0
    with open_append(path, "truncate") as fh:
        fh.write(b"{}\n")
    assert path.read_bytes() == b"{}\n"


def test_audit_rows_after_a_torn_line_stay_readable(tmp_path: Path) -> None:
    w = AuditWriter(tmp_path, max_total_bytes=1 << 20)
    record = HookRecord(
        ts="2026-01-02T00:00:00.000Z", agent_id="a", trace_id="t", hook_id="h",
        revision="r", kind="wake", event_id="e1", topic="market.candle.closed",
        symbol="BTC-USD", decision="IGNORE", reason="", dedupe_key=None,
        suppressed_by="none", runtime_ms=0.1, error=None,
    )  # fmt: skip
    w.write(record)
    w.close()
    path = next(tmp_path.glob("audit-*.jsonl"))
    path.write_bytes(path.read_bytes() + b'{"type":"hook","ts":"2026-01-02T00:0')  # kill -9
    w2 = AuditWriter(tmp_path, max_total_bytes=1 << 20)
    w2.write(msgspec.structs.replace(record, event_id="e2"))
    w2.close()
    ids = []
    for line in path.read_bytes().splitlines():
        try:
            ids.append(json.loads(line)["eventId"])
        except ValueError:
            pass
    assert ids == ["e1", "e2"]
