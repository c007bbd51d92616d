"""Naming of audit files: ``audit-YYYY-MM-DD.jsonl``, then ``audit-YYYY-MM-DD.N.jsonl``.

A day's log rolls to a numbered part when it reaches the per-file cap, so the
disk bound can delete whole old parts even within a busy day. A part the
writer has moved on from is gzip-compressed (``.jsonl.gz``, about a tenth of
the size), with the index of the ids its rows name (``audit-YYYY-MM-DD[.N].ids``,
:mod:`daemon.audit.ids`); readers open either form with :func:`open_lines`.
"""

from __future__ import annotations

import gzip
import os
import re
from pathlib import Path
from typing import BinaryIO, NamedTuple, cast

import structlog

from daemon.audit.ids import IdCollector, index_path, write_index

log = structlog.get_logger("audit")

_NAME = re.compile(r"^audit-(\d{4}-\d{2}-\d{2})(?:\.(\d+))?\.jsonl(\.gz)?$")
GZ = ".gz"
_DAY = re.compile(r"^\d{4}-\d{2}-\d{2}$")


class AuditFile(NamedTuple):
    """One audit file; sorts oldest first by (day, part)."""

    day: str
    part: int
    path: Path

    @property
    def compressed(self) -> bool:
        """A closed part, gzip-compressed (never appended to again)."""
        return self.path.name.endswith(GZ)

    @property
    def key(self) -> tuple[str, int]:
        """(day, part): the same for a part before and after compression."""
        return self.day, self.part


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
    found: dict[tuple[str, int], AuditFile] = {}
    for path in names:
        m = _NAME.match(path.name)
        if m:
            f = AuditFile(m.group(1), int(m.group(2) or 0), path)
            # Both forms exist only if compression was cut short after its rename:
            # the .gz is then complete (see compress), so it wins.
            if f.key not in found or f.compressed:
                found[f.key] = f
    return sorted(found.values())


def open_lines(path: Path) -> BinaryIO:
    """A binary reader of an audit file's lines, compressed or not."""
    if path.name.endswith(GZ):
        return cast(BinaryIO, gzip.GzipFile(path, "rb"))
    return path.open("rb")


def compress(path: Path, level: int = 6, *, index: bool = True) -> Path:
    """Replace a closed ``.jsonl`` part by its ``.jsonl.gz``: written to a temporary
    name, synced, renamed, then the original removed (a crash leaves one complete
    copy or both, never a torn .gz under the final name). ``index``: with its id
    index (:mod:`daemon.audit.ids`), written before the rename; an older one (a
    compression cut short, the part appended to since) is removed first."""
    target = path.with_name(path.name + GZ)
    tmp = path.with_name(path.name + GZ + ".tmp")
    discard(index_path(path))
    ids = IdCollector() if index else None
    with path.open("rb") as src, gzip.open(tmp, "wb", compresslevel=level) as dst:
        while chunk := src.read(1024 * 1024):
            dst.write(chunk)
            if ids is not None:
                ids.feed(chunk)
    with tmp.open("rb") as fh:
        os.fsync(fh.fileno())
    if ids is not None:
        ids.close()
        try:
            write_index(path, ids)
        except OSError as exc:  # the part reads whole, as one without an index
            log.warning("audit id index not written", path=str(index_path(path)), error=str(exc))
    tmp.replace(target)
    path.unlink(missing_ok=True)
    return target


_left: set[Path] = set()  # what discard() found in the way and said so


def discard(path: Path) -> None:
    """Remove an index or a leftover of the audit dir, if there. A directory under its
    name (someone's mistake) is left, with a warning once: it failed every bounds
    check, so retention stopped and the daemon ended with an audit error."""
    try:
        path.unlink(missing_ok=True)
    except IsADirectoryError:
        if path not in _left and len(_left) < 1024:
            _left.add(path)
            log.warning(
                "a directory in the audit dir under an audit file's name: left", path=str(path)
            )
