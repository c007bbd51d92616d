"""The id index of a compressed audit part: which event, trace, run and order ids
its rows name, so ``why <id>`` skips the parts that cannot hold it.

A part is indexed once, when it is compressed (it is never appended to again):
``audit-DAY[.N].ids`` beside ``audit-DAY[.N].jsonl.gz`` holds a 32-bit hash of
every id its rows name, sorted. A lookup is a binary search; a hash shared by
chance (about one id in 40,000 for a part of 100,000 ids) only costs reading
that part. Without a usable index (a part compressed by an older version, a
write the disk refused, a file from another part) the part is read as before:
an index can make ``why`` read less, never find less. The header records the
part's CRC-32 and length, which the gzip trailer repeats, so an index beside
another content than its own is never trusted. An index is read only if it is
a regular file of its own (never a FIFO that would block ``why``, a link) and
no bigger than its part could make it (4 bytes an id, an id at least a byte).
"""

from __future__ import annotations

import hashlib
import sys
import zlib
from array import array
from bisect import bisect_left
from collections.abc import Iterable
from pathlib import Path

import msgspec

from daemon.atomicfile import write_atomic
from daemon.errors import NOT_JSON, WorkspaceFileError
from hooks_runtime.safe_read import read_regular

SUFFIX = ".ids"
_MAGIC = b"MWIDX1\n\0"
# Then the part's CRC-32 and its length mod 2**32 (little-endian), as its gzip trailer.
_HEADER = len(_MAGIC) + 8


class _Named(msgspec.Struct, rename="camel"):
    """The fields of an audit row that name its event, trace, run or order (every
    other field is skipped unread)."""

    event_id: str | None = None
    trace_id: str | None = None
    run_id: str | None = None
    client_order_id: str | None = None
    trace_ids: list[str] | None = None
    event_ids: list[str] | None = None


_one = msgspec.json.Decoder(_Named)
_many = msgspec.json.Decoder(list[_Named])
_any = msgspec.json.Decoder()


def id_hash(ident: str) -> int:
    """The 32-bit hash an index keeps of ``ident``."""
    digest = hashlib.blake2b(ident.encode("utf-8", "surrogatepass"), digest_size=4).digest()
    return int.from_bytes(digest, "little")


def index_path(part: Path) -> Path:
    """The index of an audit part (either form): ``audit-DAY[.N].ids``."""
    name = part.name.removesuffix(".gz").removesuffix(".jsonl")
    return part.with_name(name + SUFFIX)


class IdCollector:
    """Collects the id hashes of the rows fed to it, in chunks of a part's bytes."""

    def __init__(self) -> None:
        # Each block's distinct ids, hashed (a part's rows repeat them: an event's
        # hooks, a run's rows); sorted and made unique at the end. 4 bytes an id, where
        # a set of a big part's id strings held ~100.
        self.hashes = array("I")
        self.length = 0
        self.crc = 0
        self._rest = b""

    def feed(self, chunk: bytes) -> None:
        """Take the next bytes of the part; a line is read once it is complete."""
        self.length += len(chunk)
        self.crc = zlib.crc32(chunk, self.crc)
        data = self._rest + chunk
        cut = data.rfind(b"\n") + 1
        self._rest = data[cut:]
        if cut:
            self._lines(data[:cut])

    def close(self) -> None:
        """The part ended: its last line, if it had no newline."""
        if self._rest.strip():
            self._lines(self._rest)
        self._rest = b""

    def _lines(self, block: bytes) -> None:
        try:
            rows = _many.decode(b"[" + b",".join(filter(None, block.splitlines())) + b"]")
        except (*NOT_JSON, msgspec.ValidationError):
            rows = []
            for line in block.splitlines():
                try:
                    rows.append(_one.decode(line))
                except msgspec.ValidationError:  # a damaged row: the reader still reads it
                    rows.append(_lenient(line))
                except NOT_JSON:
                    continue  # not a row the reader would decode either
        idents: set[str | None] = set()
        for row in rows:
            idents.update((row.event_id, row.trace_id, row.run_id, row.client_order_id))
            if row.trace_ids:
                idents.update(row.trace_ids)
            if row.event_ids:
                idents.update(row.event_ids)
        self.hashes.extend(id_hash(i) for i in idents if i)

    def encode(self) -> bytes:
        """The index file's bytes."""
        sorted_hashes = array("I", sorted(set(self.hashes)))
        if sys.byteorder == "big":
            sorted_hashes.byteswap()
        trailer = self.crc.to_bytes(4, "little") + (self.length % 2**32).to_bytes(4, "little")
        return _MAGIC + trailer + sorted_hashes.tobytes()


def _lenient(line: bytes) -> _Named:
    """The ids of a row whose fields are not all of their types (a ``traceIds`` that is
    no list): each one that is a string, or a list of strings, still counts."""
    row = _any.decode(line)
    if not isinstance(row, dict):
        return _Named()

    def listed(key: str) -> list[str] | None:
        value = row.get(key)
        return [v for v in value if isinstance(v, str)] if isinstance(value, list) else None

    def named(key: str) -> str | None:
        value = row.get(key)
        return value if isinstance(value, str) else None

    return _Named(
        event_id=named("eventId"), trace_id=named("traceId"), run_id=named("runId"),
        client_order_id=named("clientOrderId"), trace_ids=listed("traceIds"),
        event_ids=listed("eventIds"),
    )  # fmt: skip


def write_index(part: Path, collector: IdCollector) -> None:
    """Write ``part``'s index (OSError if the disk refuses it: the part is then read
    whole by ``why``, as one without an index)."""
    path = index_path(part)
    write_atomic(path, collector.encode())
    path.chmod(part.stat().st_mode & 0o777)  # whoever may read the part may read its index


class IdIndex:
    """A compressed part's index, loaded: :meth:`may_name` answers for an id."""

    def __init__(self, hashes: array[int]) -> None:
        self._hashes = hashes

    @classmethod
    def of(cls, part: Path) -> IdIndex | None:
        """The index of the compressed ``part`` if one is there and is its own; None
        (read the part whole) otherwise."""
        try:
            with part.open("rb") as fh:  # the gzip trailer: the content's CRC-32 and length
                fh.seek(-8, 2)
                trailer = fh.read(8)
            length = int.from_bytes(trailer[4:], "little")
            data = read_regular(index_path(part), _HEADER + 4 * length, "an audit id index")
        except (OSError, WorkspaceFileError):
            return None
        if len(data) < _HEADER or not data.startswith(_MAGIC) or (len(data) - _HEADER) % 4:
            return None
        if data[len(_MAGIC) : _HEADER] != trailer:
            return None
        hashes = array("I")  # (4 bytes on Linux, as written)
        hashes.frombytes(data[_HEADER:])
        if sys.byteorder == "big":
            hashes.byteswap()
        return cls(hashes)

    def may_name(self, idents: Iterable[str]) -> bool:
        """Whether a row of the part may name one of ``idents`` (False: none does)."""
        hashes = self._hashes
        for ident in idents:
            h = id_hash(ident)
            i = bisect_left(hashes, h)
            if i < len(hashes) and hashes[i] == h:
                return True
        return False
