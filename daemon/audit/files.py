"""Naming of audit files: ``audit-YYYY-MM-DD.jsonl``, then ``audit-YYYY-MM-DD.N.jsonl``.

A day's log rolls to a numbered part when it reaches the per-file cap, so the
disk bound can delete whole old parts even within a busy day.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

_NAME = re.compile(r"^audit-(\d{4}-\d{2}-\d{2})(?:\.(\d+))?\.jsonl$")
_DAY = re.compile(r"^\d{4}-\d{2}-\d{2}$")


class AuditFile(NamedTuple):
    """One audit file; sorts oldest first by (day, part)."""

    day: str
    part: int
    path: Path


def file_name(day: str, part: int) -> str:
    """The file name of ``part`` of ``day`` (part 0 has no number)."""
    return f"audit-{day}.jsonl" if part == 0 else f"audit-{day}.{part}.jsonl"


def day_of(ts: str) -> str | None:
    """The UTC day of an audit ``ts``, or None when it is not a timestamp."""
    day = ts[:10]
    return day if _DAY.match(day) else None


def list_files(directory: Path) -> list[AuditFile]:
    """Audit files in ``directory``, oldest first; a missing directory is empty."""
    try:
        names = [p for p in directory.iterdir() if p.is_file()]
    except FileNotFoundError:
        return []
    found = []
    for path in names:
        m = _NAME.match(path.name)
        if m:
            found.append(AuditFile(m.group(1), int(m.group(2) or 0), path))
    return sorted(found)
