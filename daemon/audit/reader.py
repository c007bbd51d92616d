"""Read audit records back: across rotated files, filtered, tailed, followed.

Records are returned as plain dicts (camelCase keys, as written) so the reader
keeps working on lines written by older or newer versions. A line that is not
a JSON object (a torn write after a crash) is skipped and counted, never fatal.
"""

from __future__ import annotations

import io
import re
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import msgspec

from daemon.audit.files import list_files
from daemon.events import iso_ms, now_ms, parse_iso_ms

Record = dict[str, Any]
_decoder = msgspec.json.Decoder()
_AGO = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhd])$")
_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_since(text: str, now: int | None = None) -> int:
    """Epoch ms of ``--since``: a duration ago (``90s``, ``15m``, ``2h``, ``3d``) or a timestamp."""
    m = _AGO.match(text.strip())
    if m:
        ref = now_ms() if now is None else now
        return ref - int(float(m.group(1)) * _UNIT_MS[m.group(2)])
    try:
        return parse_iso_ms(text.strip())
    except ValueError:
        raise ValueError(
            f"--since {text!r}: expected a duration like 15m, 2h, 3d or a time like 2026-02-17T03:05:00Z"
        ) from None


class AuditFilter(msgspec.Struct, frozen=True, kw_only=True):
    """Which records to keep; every set field must match (None = any)."""

    agent: str | None = None
    hook: str | None = None
    decision: str | None = None
    symbol: str | None = None
    since_ms: int | None = None
    types: frozenset[str] | None = None

    def matches(self, rec: Record) -> bool:
        """True when ``rec`` passes every set criterion."""
        if self.types is not None and rec.get("type") not in self.types:
            return False
        if self.agent is not None and rec.get("agentId") != self.agent:
            return False
        if self.hook is not None and rec.get("hookId") != self.hook:
            return False
        if self.symbol is not None and rec.get("symbol") != self.symbol:
            return False
        if self.decision is not None and decision_of(rec) != self.decision.upper():
            return False
        return self.since_ms is None or _ts_ms(rec) >= self.since_ms


def decision_of(rec: Record) -> str:
    """A hook record's decision (``ERROR`` when it failed); "" for other record types."""
    if rec.get("type") != "hook":
        return ""
    return str(rec.get("decision") or "ERROR").upper()


def _ts_ms(rec: Record) -> int:
    ts = rec.get("ts")
    try:
        return parse_iso_ms(ts) if isinstance(ts, str) else 0
    except ValueError:
        return 0


class Stats:
    """Counts lines the reader could not use."""

    def __init__(self) -> None:
        self.bad_lines = 0


def parse_line(line: bytes, stats: Stats | None = None) -> Record | None:
    """One audit line as a dict, or None (counted) when it is not a JSON object."""
    try:
        value = _decoder.decode(line)
    except msgspec.DecodeError:
        value = None
    if isinstance(value, dict):
        return value
    if stats is not None and line.strip():
        stats.bad_lines += 1
    return None


def _files(directory: Path, since_ms: int | None) -> list[Path]:
    """Files that can hold records at or after ``since_ms`` (by their day)."""
    first_day = iso_ms(since_ms)[:10] if since_ms is not None else ""
    return [f.path for f in list_files(directory) if f.day >= first_day]


def iter_records(
    directory: Path,
    flt: AuditFilter | None = None,
    *,
    contains: Iterable[str] = (),
    stats: Stats | None = None,
    upto: Mapping[Path, int] | None = None,
) -> Iterator[Record]:
    """Matching records, oldest first. ``contains``: a cheap prefilter on the raw line
    (a line must contain one of the strings to be decoded at all). ``upto``: read
    each file only to that many bytes, and no file it does not name (a snapshot)."""
    flt = flt or AuditFilter()
    needles = [n.encode() for n in contains]
    for path in _files(directory, flt.since_ms):
        if upto is not None and path not in upto:
            continue
        try:
            fh = path.open("rb")
        except FileNotFoundError:
            continue  # deleted by retention while we listed
        with fh:
            lines = fh if upto is None else io.BytesIO(fh.read(upto[path]))
            for line in lines:
                if needles and not any(n in line for n in needles):
                    continue
                rec = parse_line(line, stats)
                if rec is not None and flt.matches(rec):
                    yield rec


def tail(
    directory: Path,
    flt: AuditFilter | None = None,
    n: int = 20,
    upto: Mapping[Path, int] | None = None,
) -> list[Record]:
    """The last ``n`` matching records, oldest first (memory: ``n`` records); with
    ``upto`` (a :class:`Follower`'s offsets) exactly those before it starts."""
    return list(deque(iter_records(directory, flt, upto=upto), maxlen=max(n, 0)))


def complete_size(path: Path, step: int = 64 * 1024) -> int:
    """Bytes up to and including the file's last newline (a line being written is
    not a record yet)."""
    with path.open("rb") as fh:
        pos = fh.seek(0, 2)
        while pos > 0:
            size = min(step, pos)
            fh.seek(pos - size)
            found = fh.read(size).rfind(b"\n")
            if found >= 0:
                return pos - size + found + 1
            pos -= size
    return 0


class Follower:
    """Picks up records appended after it started, across rotation (sans sleep).

    Call :meth:`poll` repeatedly; it returns the new complete lines since the
    last call. A partial last line is kept until its newline arrives.
    :attr:`offsets` is where it starts: ``tail(..., upto=follower.offsets)``
    shows what came before, so ``tail -f`` never repeats or reorders a record
    that is flushed while it starts.
    """

    def __init__(self, directory: Path, flt: AuditFilter | None = None) -> None:
        self.directory = directory
        self.flt = flt or AuditFilter()
        self.stats = Stats()
        self._offsets: dict[Path, int] = {}
        for f in list_files(directory):
            try:
                self._offsets[f.path] = complete_size(f.path)
            except FileNotFoundError:
                continue
        self._partial: dict[Path, bytes] = {}

    @property
    def offsets(self) -> Mapping[Path, int]:
        """Per file, the byte where following started."""
        return dict(self._offsets)

    def poll(self) -> list[Record]:
        """New matching records in file order."""
        out: list[Record] = []
        files = list_files(self.directory)
        live = {f.path for f in files}
        for gone in [p for p in self._offsets if p not in live]:  # deleted by retention
            self._offsets.pop(gone)
            self._partial.pop(gone, None)
        for f in files:
            for line in self._new_lines(f.path):
                rec = parse_line(line, self.stats)
                if rec is not None and self.flt.matches(rec):
                    out.append(rec)
        return out

    def _new_lines(self, path: Path) -> list[bytes]:
        start = self._offsets.get(path, 0)
        try:
            with path.open("rb") as fh:
                if fh.seek(0, 2) < start:  # truncated or replaced: start over
                    start = 0
                    self._partial.pop(path, None)
                fh.seek(start)
                data = fh.read(8 * 1024 * 1024)
        except FileNotFoundError:
            self._offsets.pop(path, None)
            return []
        self._offsets[path] = start + len(data)
        data = self._partial.pop(path, b"") + data
        *lines, rest = data.split(b"\n")
        if rest:
            self._partial[path] = rest
        return lines


def follow(
    directory: Path, flt: AuditFilter | None = None, *, poll_interval: float = 0.25
) -> Iterator[Record]:
    """Yield records appended from now on, forever (``tail -f``)."""
    follower = Follower(directory, flt)
    while True:
        batch = follower.poll()
        if not batch:
            time.sleep(poll_interval)
        yield from batch


def recent_evaluations(directory: Path, max_bytes: int = 8 * 1024 * 1024) -> dict[str, list[str]]:
    """Per agent, the event ids of its newest hook rows (up to ``max_bytes`` of the
    newest files), oldest first.

    After a crash, an agent's persisted marks lag its audit rows by up to a flush;
    these ids are the events it already evaluated in that gap."""
    out: dict[str, dict[str, None]] = {}
    budget = max_bytes
    chunks: list[bytes] = []
    for f in reversed(list_files(directory)):
        if budget <= 0:
            break
        try:
            with f.path.open("rb") as fh:
                size = fh.seek(0, 2)
                start = max(0, size - budget)
                fh.seek(start)
                data = fh.read()
        except OSError:
            continue
        if start > 0:
            data = data[data.find(b"\n") + 1 :]  # drop the partial first line
        budget -= len(data)
        chunks.append(data)
    for data in reversed(chunks):
        for line in data.splitlines():
            rec = parse_line(line)
            if rec is None or rec.get("type") != "hook":
                continue
            agent, event_id = rec.get("agentId"), rec.get("eventId")
            if isinstance(agent, str) and isinstance(event_id, str):
                seen = out.setdefault(agent, {})
                seen.pop(event_id, None)
                seen[event_id] = None
    return {agent: list(ids) for agent, ids in out.items()}
