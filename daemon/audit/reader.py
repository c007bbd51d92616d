"""Read audit records back: across rotated files, filtered, tailed, followed.

Records are returned as plain dicts (camelCase keys, as written) so the reader
keeps working on lines written by older or newer versions. A line that is not
a JSON object (a torn write after a crash) is skipped and counted, never fatal; in
one that is, a known field of the wrong type (a damaged row) is dropped.
"""

from __future__ import annotations

import io
import re
import time
import zlib
from collections import deque
from collections.abc import Collection, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import msgspec
import structlog

from daemon.audit.files import AuditFile, list_files, open_lines
from daemon.audit.ids import IdIndex
from daemon.errors import NOT_JSON
from daemon.events import iso_ms, now_ms, parse_iso_ms

Record = dict[str, Any]
log = structlog.get_logger("audit")
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
    # Market time (a row's ``eventTs``): from_ms <= it < to_ms (None: no bound); a row
    # without one is left out when either is set.
    from_ms: int | None = None
    to_ms: int | None = None

    def matches(self, rec: Record) -> bool:
        """True when ``rec`` passes every set criterion."""
        if self.types is not None:
            kind = rec.get("type")
            if type(kind) is not str or kind not in self.types:  # a hand-edited row: any
                return False
        if self.agent is not None and rec.get("agentId") != self.agent:
            return False
        if self.hook is not None and rec.get("hookId") != self.hook:
            return False
        if self.symbol is not None and rec.get("symbol") != self.symbol:
            return False
        if self.decision is not None and decision_of(rec) != self.decision.upper():
            return False
        if self.since_ms is not None and ts_ms(rec) < self.since_ms:
            return False
        if self.from_ms is None and self.to_ms is None:
            return True
        at = event_ms(rec)
        return (
            at > 0
            and (self.from_ms is None or at >= self.from_ms)
            and (self.to_ms is None or at < self.to_ms)
        )


def decision_of(rec: Record) -> str:
    """A hook record's decision (``ERROR`` when it failed); "" for other record types."""
    if rec.get("type") != "hook":
        return ""
    return str(rec.get("decision") or "ERROR").upper()


def event_ms(rec: Record) -> int:
    """The row's market time (``eventTs``) in epoch ms; 0 when it has none or it does
    not parse."""
    return ts_ms(rec, "eventTs")


def ts_ms(rec: Record, key: str = "ts") -> int:
    """A record's ``ts`` (or ``key``) in ms; 0 when it has none that reads."""
    ts = rec.get(key)
    try:
        return parse_iso_ms(ts) if isinstance(ts, str) else 0
    except ValueError:
        return 0


class Stats:
    """Counts lines the reader could not use."""

    def __init__(self) -> None:
        self.bad_lines = 0


# Fields the readers take for a string, or a list: in a damaged row (a disk, an
# editor) a value of another type is dropped as the line is read, as if absent, so
# the row still prints and no reader trips on it (a set of ids, a join of reasons).
_TEXT_FIELDS: frozenset[str] = frozenset((
    "type", "ts", "eventTs", "agentId", "traceId", "daemonRun", "hookId", "revision", "kind",
    "eventId", "topic", "symbol", "decision", "reason", "dedupeKey", "suppressedBy", "error",
    "outcome", "runId", "runner", "status", "summary", "clientOrderId", "broker", "side",
    "orderType", "role", "source", "leader", "signalId", "remote",
))  # fmt: skip
_LIST_FIELDS: frozenset[str] = frozenset({"reasons", "traceIds", "eventIds", "hookIds"})


def parse_line(line: bytes, stats: Stats | None = None) -> Record | None:
    """One audit line as a dict, or None (counted) when it is not a JSON object. A
    known field of the wrong type is dropped (see ``_TEXT_FIELDS``)."""
    try:
        value = _decoder.decode(line)
    except NOT_JSON:
        value = None
    if isinstance(value, dict):
        for key in _TEXT_FIELDS.intersection(value):
            if not isinstance(value[key], str | None):
                del value[key]
        for key in _LIST_FIELDS.intersection(value):
            if not isinstance(value[key], list):
                del value[key]
        return value
    if stats is not None and line.strip():
        stats.bad_lines += 1
    return None


def _files(directory: Path, since_ms: int | None) -> list[AuditFile]:
    """Files that can hold records at or after ``since_ms`` (by their day)."""
    first_day = iso_ms(since_ms)[:10] if since_ms is not None else ""
    return [f for f in list_files(directory) if f.day >= first_day]


def iter_records(
    directory: Path,
    flt: AuditFilter | None = None,
    *,
    contains: Iterable[str] = (),
    stats: Stats | None = None,
    upto: Mapping[tuple[str, int], int] | None = None,
    ids: Collection[str] = (),
) -> Iterator[Record]:
    """Matching records, oldest first, compressed parts included. ``contains``: a
    cheap prefilter on the raw line (a line must contain one of the strings to be
    decoded at all). ``upto``: read each part (by its (day, part) key) only to that
    many bytes of its content (-1: all), and no part it does not name (a snapshot).
    ``ids``: as ``contains``, for ids a row names (event, trace, run, order ids):
    a compressed part whose index rules them all out is not read."""
    flt = flt or AuditFilter()
    needles = [n.encode() for n in [*contains, *ids]]
    for line in iter_lines(directory, flt.since_ms, upto=upto, ids=ids):
        if needles and not any(n in line for n in needles):
            continue
        rec = parse_line(line, stats)
        if rec is not None and flt.matches(rec):
            yield rec


def iter_lines(
    directory: Path,
    since_ms: int | None = None,
    *,
    upto: Mapping[tuple[str, int], int] | None = None,
    ids: Collection[str] = (),
) -> Iterator[bytes]:
    """The raw lines of the audit log, oldest first, compressed parts included (for a
    reader that decodes only the fields it needs); ``upto`` and ``ids`` as in
    :func:`iter_records`."""
    for f in _files(directory, since_ms):
        if upto is not None and f.key not in upto:
            continue
        if ids and f.compressed:
            index = IdIndex.of(f.path)
            if index is not None and not index.may_name(ids):
                continue
        yield from _part_lines(f, upto)


def _part_lines(f: AuditFile, upto: Mapping[tuple[str, int], int] | None) -> Iterator[bytes]:
    """One part's lines (up to its ``upto`` offset); none if retention deleted it. A
    compressed part that breaks off (a damaged or truncated .gz) gives the lines
    before the break, with a warning: it reads as the end of that part, never as a
    crash of `why` or `audit tail` (click took the EOFError for Ctrl-C: "aborted")."""
    try:
        fh = open_lines(f.path)
    except FileNotFoundError:
        return  # deleted by retention while we listed
    with fh:
        try:
            yield from fh if upto is None else io.BytesIO(fh.read(upto[f.key]))  # -1: all
        except (EOFError, OSError, zlib.error) as exc:
            log.warning("audit part damaged: read up to where it breaks", path=str(f.path),
                        error=f"{type(exc).__name__}: {exc}")  # fmt: skip


def tail(
    directory: Path,
    flt: AuditFilter | None = None,
    n: int = 20,
    upto: Mapping[tuple[str, int], int] | None = None,
) -> list[Record]:
    """The last ``n`` matching records, oldest first (memory: ``n`` records); with
    ``upto`` (a :class:`Follower`'s offsets) exactly those before it starts. The
    newest part is read first, and an older one only while fewer than ``n`` have
    matched: a month's log costs its last part or two, not all of it."""
    flt = flt or AuditFilter()
    found: deque[Record] = deque()
    for f in reversed(_files(directory, flt.since_ms)):
        if len(found) >= n:
            break
        if upto is not None and f.key not in upto:
            continue
        last: deque[Record] = deque(maxlen=n - len(found))  # the part's newest matches
        for line in _part_lines(f, upto):
            rec = parse_line(line)
            if rec is not None and flt.matches(rec):
                last.append(rec)
        found.extendleft(reversed(last))
    return list(found)


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
    that is flushed while it starts. Offsets are positions in a part's content,
    kept by (day, part): when the writer compresses a part it has moved on
    from, the rest of it is read from the ``.gz``, nothing twice.
    """

    def __init__(self, directory: Path, flt: AuditFilter | None = None) -> None:
        self.directory = directory
        self.flt = flt or AuditFilter()
        self.stats = Stats()
        self._offsets: dict[tuple[str, int], int] = {}
        self._done: set[tuple[str, int]] = set()  # compressed before we started
        for f in list_files(directory):
            if f.compressed:
                self._done.add(f.key)
                continue
            try:
                self._offsets[f.key] = complete_size(f.path)
            except FileNotFoundError:
                continue
        self._partial: dict[tuple[str, int], bytes] = {}

    @property
    def offsets(self) -> Mapping[tuple[str, int], int]:
        """Per part, the byte of its content where following started."""
        return {**self._offsets, **dict.fromkeys(self._done, -1)}  # -1: all of it

    def poll(self) -> list[Record]:
        """New matching records in file order."""
        out: list[Record] = []
        files = list_files(self.directory)
        live = {f.key for f in files}
        for gone in [k for k in self._offsets if k not in live]:  # deleted by retention
            self._offsets.pop(gone)
            self._partial.pop(gone, None)
        for f in files:
            if f.key in self._done:
                continue
            for line in self._new_lines(f):
                rec = parse_line(line, self.stats)
                if rec is not None and self.flt.matches(rec):
                    out.append(rec)
            if f.compressed:  # never appended to again
                self._done.add(f.key)
                self._offsets.pop(f.key, None)
        return out

    def _new_lines(self, f: AuditFile) -> list[bytes]:
        start = self._offsets.get(f.key, 0)
        try:
            with open_lines(f.path) as fh:
                if f.compressed:
                    data = fh.read()[start:]  # a closed part: its whole rest
                else:
                    if fh.seek(0, 2) < start:  # truncated or replaced: start over
                        start = 0
                        self._partial.pop(f.key, None)
                    fh.seek(start)
                    data = fh.read(8 * 1024 * 1024)
        except (FileNotFoundError, EOFError, OSError, zlib.error):  # gone, or damaged
            return []
        self._offsets[f.key] = start + len(data)
        data = self._partial.pop(f.key, b"") + data
        *lines, rest = data.split(b"\n")
        if rest:
            self._partial[f.key] = rest
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


def output_of(rec: Record) -> dict[str, Any] | None:
    """What a hook row put in ``state.lastOutputs`` (None: a failed evaluation)."""
    decision = rec.get("decision")
    if rec.get("type") != "hook" or not isinstance(decision, str):
        return None
    output = rec.get("output")
    if isinstance(output, dict):
        return output
    out: dict[str, Any] = {"decision": decision, "reason": rec.get("reason", "")}
    if rec.get("dedupeKey") is not None:
        out["dedupeKey"] = rec["dedupeKey"]
    return out


class LastOutputs:
    """Folds hook rows, oldest first, into each agent's ``state.lastOutputs``."""

    def __init__(self) -> None:
        self.by_agent: dict[str, dict[str, dict[str, Any]]] = {}

    def add(self, rec: Record) -> None:
        """Take one row into account (rows of other types are ignored)."""
        agent, hook, output = rec.get("agentId"), rec.get("hookId"), output_of(rec)
        if isinstance(agent, str) and isinstance(hook, str) and output is not None:
            self.by_agent.setdefault(agent, {})[hook] = output


class CutIntent(msgspec.Struct, frozen=True):
    """A TRADE_INTENT a hook row shows acted on, with no risk row after it: the stop
    came between the decision and the order (see :func:`recent_evaluations`)."""

    event_id: str
    topic: str
    hook_id: str
    trace_id: str | None
    output: dict[str, Any]  # the decision, as lastOutputs holds it


class Unplaced(msgspec.Struct, frozen=True):
    """An approval with no order row of its client order id after it: the stop came
    between the verdict's row and the order's record, or between the record and
    the order's rows (the broker knows which, by the id)."""

    client_order_id: str
    hook_id: str | None  # a hook, or the tool that placed it
    event_id: str | None
    trace_id: str | None
    intent: dict[str, Any]  # the intent as the risk row holds it
    cut: CutIntent | None = None  # the hook intent it approved, when its row was read


class AuditedOrder(msgspec.Struct, frozen=True):
    """An order as its newest row in the audit shows it."""

    status: str
    role: str


class Recent(msgspec.Struct, frozen=True):
    """What the newest audit rows say each agent had done when the daemon stopped."""

    # Per agent, event ids it evaluated, oldest first.
    evaluated: dict[str, list[str]]
    # Per agent, the lastOutputs its hooks had produced.
    outputs: dict[str, dict[str, dict[str, Any]]]
    # Per agent, the intents the stop cut short, oldest first.
    cut: dict[str, list[CutIntent]] = msgspec.field(default_factory=dict)
    # Client order ids with a risk row: an intent for one of them (a second hook
    # asking for the same order) was checked once, and is no intent cut short.
    checked: set[str] = msgspec.field(default_factory=set)
    # Per agent, the approvals with no order row after them, oldest first.
    unplaced: dict[str, list[Unplaced]] = msgspec.field(default_factory=dict)
    # By client order id, each order's newest row: what the audit last saw of it.
    orders: dict[str, AuditedOrder] = msgspec.field(default_factory=dict)


def _stream_tail(fh: BinaryIO, n: int, chunk: int = 1 << 20) -> tuple[bytes, int]:
    """The last ``n`` bytes of a compressed part (which cannot seek from its end) and
    their offset, holding about ``n`` plus a chunk: the whole part decompressed at
    once was a 64 MB peak at every start, for its last 8 MB."""
    held: deque[bytes] = deque()
    size = total = 0
    while piece := fh.read(chunk):
        held.append(piece)
        size += len(piece)
        total += len(piece)
        while size - len(held[0]) >= n:
            size -= len(held.popleft())
    data = b"".join(held)
    if len(data) > n:
        data = data[len(data) - n :]
    return data, total - len(data)


def recent_evaluations(directory: Path, max_bytes: int = 8 * 1024 * 1024) -> Recent:
    """The newest hook rows (up to ``max_bytes`` of the newest files), per agent.

    After a crash, an agent's persisted marks lag its audit rows by up to a flush;
    the evaluated ids are the events it already evaluated in that gap. Its hooks'
    last outputs carry over a restart like the rest of its state.

    A decision's rows reach the OS before it acts, and its intent's risk row is
    written when the desk checks it: an acted TRADE_INTENT row with no risk row of
    its (agent, event, hook) is an intent a kill cut short, maybe before its order
    was recorded (the broker knows, by its client order id). So is an approval
    with no order row (an order a tool placed goes out after its approval's row
    reaches the OS), unless a later verdict settled it."""
    out: dict[str, dict[str, None]] = {}
    cut: dict[tuple[str, str, str], CutIntent] = {}
    checked: set[str] = set()
    unplaced: dict[str, tuple[str, Unplaced]] = {}  # by client order id: (agent, it)
    orders: dict[str, AuditedOrder] = {}
    outputs = LastOutputs()
    budget = max_bytes
    chunks: list[bytes] = []
    for f in reversed(list_files(directory)):
        if budget <= 0:
            break
        try:
            with open_lines(f.path) as fh:
                if f.compressed:  # a closed part (max_file_bytes, 64 MB, of content)
                    data, start = _stream_tail(fh, budget)
                else:
                    size = fh.seek(0, 2)
                    start = max(0, size - budget)
                    fh.seek(start)
                    data = fh.read()
        except FileNotFoundError:
            continue  # deleted by retention while we listed
        except (OSError, EOFError, zlib.error) as exc:
            # Damaged (zlib's error ended the daemon's start, at every start): its
            # rows may be decoded wrong up to where it breaks, so none are taken.
            log.warning("audit part unreadable: skipped", path=str(f.path),
                        error=f"{type(exc).__name__}: {exc}")  # fmt: skip
            continue
        if start > 0:
            data = data[data.find(b"\n") + 1 :]  # drop the partial first line
        budget -= len(data)
        chunks.append(data)
    # Per agent, the hook rows of its newest event (by trace), held until a row
    # shows that event's rows were all written: a torn row of the event, or fewer
    # rows than it has, means the write its decisions waited for was cut (see
    # _torn_event, _whole).
    held: dict[str, tuple[str, list[Record]]] = {}

    def fold(rows: list[Record]) -> None:
        for rec in rows:
            if rec.get("type") == "risk":
                agent, event_id, hook = rec.get("agentId"), rec.get("eventId"), rec.get("hookId")
                intent = cut.pop((str(agent), str(event_id), str(hook)), None)
                coid = rec.get("clientOrderId")
                if isinstance(coid, str):
                    checked.add(coid)
                    unplaced.pop(coid, None)  # a later verdict settles an earlier one
                    # (an approval written after its order's rows: the broker's
                    # recovery at a start opened the order before it was redone)
                    if _approval(rec) and isinstance(agent, str) and coid not in orders:
                        trace = rec.get("traceId")
                        unplaced[coid] = (
                            agent,
                            Unplaced(
                                coid,
                                hook if isinstance(hook, str) else None,
                                event_id if isinstance(event_id, str) else None,
                                trace if isinstance(trace, str) else None,
                                rec["intent"],
                                intent,
                            ),
                        )
                continue
            if rec.get("type") != "hook":
                continue
            agent, event_id = rec.get("agentId"), rec.get("eventId")
            if isinstance(agent, str) and isinstance(event_id, str):
                seen = out.setdefault(agent, {})
                seen.pop(event_id, None)
                seen[event_id] = None
                _note_intent(cut, agent, event_id, rec)
            outputs.add(rec)

    for data in reversed(chunks):
        for line in data.splitlines():
            rec = parse_line(line)
            if rec is None:
                torn = _torn_event(line)
                if torn is not None and held.get(torn[0], ("", []))[0] == torn[1]:
                    del held[torn[0]]  # not evaluated: the replay evaluates it again
                continue
            kind, agent, trace = rec.get("type"), rec.get("agentId"), rec.get("traceId")
            if kind == "order":
                coid, status, role = rec.get("clientOrderId"), rec.get("status"), rec.get("role")
                if isinstance(coid, str):
                    unplaced.pop(coid, None)
                    if isinstance(status, str) and isinstance(role, str):
                        orders[coid] = AuditedOrder(status, role)
                continue
            if kind not in ("hook", "wake", "risk") or not isinstance(agent, str):
                continue
            block = held.get(agent)
            if block is not None and block[0] == trace and kind != "risk":
                block[1].append(rec)
                continue
            if block is not None and _whole(rows := held.pop(agent)[1]):
                fold(rows)
            if kind == "risk":
                fold([rec])
            elif isinstance(trace, str):
                held[agent] = (trace, [rec])
    for _, rows in held.values():
        if _whole(rows):
            fold(rows)
    by_agent: dict[str, list[CutIntent]] = {}
    for (agent, _, _), intent in cut.items():
        by_agent.setdefault(agent, []).append(intent)
    evaluated = {agent: list(ids) for agent, ids in out.items()}
    approvals: dict[str, list[Unplaced]] = {}
    for agent, u in unplaced.values():
        approvals.setdefault(agent, []).append(u)
    return Recent(evaluated, outputs.by_agent, by_agent, checked, approvals, orders)


def _approval(rec: Record) -> bool:
    """Whether risk row ``rec`` approved an intent it holds."""
    return rec.get("approved") is True and isinstance(rec.get("intent"), dict)


_TORN = re.compile(
    rb'^\{"type":"(?:hook|wake)","ts":"[^"]*","agentId":"([^"\\]*)","traceId":"([^"\\]*)"'
)


def _torn_event(line: bytes) -> tuple[str, str] | None:
    """(agent, trace) of a hook or wake row a kill tore mid-write, when they show.

    Linux stops a write at a page boundary when the process is killed, so a kill
    inside the write-ahead leaves some of an event's rows whole and the next one
    torn. Its decisions had not acted yet (they wait for that write), so the
    event must be evaluated again, not counted as done from its whole rows."""
    m = _TORN.match(line)
    if m is None:
        return None
    return m.group(1).decode(errors="replace"), m.group(2).decode(errors="replace")


def _whole(rows: list[Record]) -> bool:
    """Whether an event's held rows hold every hook row the event has: its rows
    are queued together and say how many (``eventHooks``), so one short of that
    was cut by a kill, wherever the write tore (between two rows too, which
    leaves no torn line). Its decisions had not acted (they wait for that
    write): the event is evaluated again. Rows that do not say are whole."""
    want, hooks = 0, set()
    for rec in rows:
        if rec.get("type") == "hook":
            hooks.add(rec.get("hookId"))
            n = rec.get("eventHooks")
            if type(n) is int:
                want = max(want, n)
    return len(hooks) >= want


def _note_intent(
    cut: dict[tuple[str, str, str], CutIntent], agent: str, event_id: str, rec: Record
) -> None:
    """Remember ``rec`` if it is a TRADE_INTENT that acted (see recent_evaluations)."""
    hook, topic, output = rec.get("hookId"), rec.get("topic"), rec.get("output")
    if (
        rec.get("decision") == "TRADE_INTENT"
        and rec.get("suppressedBy", "none") == "none"
        and isinstance(hook, str)
        and isinstance(topic, str)
        and isinstance(output, dict)
    ):
        trace = rec.get("traceId")
        cut[agent, event_id, hook] = CutIntent(
            event_id, topic, hook, trace if isinstance(trace, str) else None, output
        )
