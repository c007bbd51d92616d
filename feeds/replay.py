"""Replay a recording or a candle CSV as the events a live feed would publish.

Three formats (``.gz`` suffix = gzip):

* **JSONL**: one FeedEvent per line, exactly as the recorder writes them
  (``daemon.events.encode``). Events are published as recorded, in file order,
  but the ``account.*`` ones (the recorded run's broker output; this run's
  broker makes its own) are left out and counted.
* **Coinbase**: raw Coinbase Advanced Trade WebSocket messages, one per line
  (bare, or ``{"recv_ts": ..., "raw": "..."}``). Each ticker message gives the
  ticks the live ``coinbase_ws`` feed publishes for it, same ids; ``candles``
  messages give the 5m candles they close, with the REST poller's ids
  (:mod:`feeds.coinbase_ws.recording`); other messages are left out and counted.
  ``auto`` tells it from a FeedEvent recording by its first line.
* **CSV**: OHLCV candles, one row per candle, open times increasing (a row
  repeating the row before it exactly, as overlapping exports and concatenated
  files have them, is skipped and counted; a second candle at an open time with
  other values is an error: which one traded is unknown): with the header ``open_time_ms,open,high,low,close,volume``, or Binance's
  kline files as they come (:mod:`feeds.candle_csv`). Each row becomes the same
  ``market.candle.closed`` event the live poller emits
  (``feeds.candles.protocol.closed_event``), with ``source``/``symbol``/
  ``timeframe`` from ``[feeds.replay]``.

Determinism: the same file gives the same events, ids and order, byte for
byte. ``receivedTs`` is set to the event's ``ts`` (a replay has no meaningful
receive time, and a wall-clock value would make two runs differ).

Pacing: with ``speed`` > 0 the gap between two events is their ``ts`` gap
divided by ``speed`` (1 = real time, 60 = a minute per second); events whose
``ts`` goes backwards (interleaved partitions in a recording) are not delayed.
``speed`` 0 publishes as fast as the bus accepts.

Restarts: the service tells the feed, per partition, up to which event time
every agent already finished (:meth:`ReplayFeed.resume_after`). Those events
are published again without pacing (the agents skip them, but their state
caches take whatever a crash kept them from saving); pacing starts at the first
event past that point, so a restarted replay resumes where it was.

Bad input: a malformed line is a :class:`ReplayError` naming ``file:line``,
raised when the replay reaches it (before ``started()`` for the first line or
a bad CSV header, so the daemon refuses to start on an unreadable file). The
one exception is a JSONL file whose *last* line lacks its newline and does not
parse: that is a recording cut off by a crash, so it is skipped and counted.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import deque
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from contextlib import closing
from functools import partial
from pathlib import Path
from typing import IO, TypeVar

import anyio
import anyio.lowlevel
import msgspec
import structlog
from anyio.abc import TaskStatus

from daemon.errors import NOT_JSON, FeedProtocolError, ReplayError
from daemon.events import (
    ACCOUNT_PREFIX,
    MARKET_CANDLE_CLOSED,
    MARKET_PRICE_TICK,
    TIMEFRAMES,
    Candle,
    FeedEvent,
    candle_of,
    decode,
    parse_iso_ms,
)
from daemon.inputfile import open_text
from feeds import candle_csv
from feeds.base import FeedHealth, Publish
from feeds.candles.protocol import closed_event
from feeds.config import ReplaySection

log = structlog.get_logger("feeds.replay")

T = TypeVar("T")
# Far above any event or candle line (the feeds' messages are kilobytes); a file
# with no newline at all (binary, or not a recording) stops here, not in memory.
MAX_LINE_CHARS = 4 * 1024 * 1024


class ReplayFeed:
    """A finite feed: publishes every event of one file, then returns."""

    def __init__(self, config: ReplaySection, *, name: str = "replay") -> None:
        self.name = name
        self.config = config
        self.path = Path(config.path)
        self.skipped = 0  # truncated trailing JSONL lines
        self.duplicates = 0  # CSV rows repeating the row before them (skipped)
        self.outputs = 0  # recorded broker events left out (see _jsonl)
        self.other_messages = 0  # recorded Coinbase messages without ticks
        self.published = 0
        self.fast_forwarded = 0
        self._resume: dict[str, int] = {}
        self._parts: list[ReplayFeed] | None = None
        self._format: str | None = None  # auto: what the file turned out to be

    def resume_after(self, marks: Mapping[str, int]) -> None:
        """Fast-forward (no pacing) through events at or before ``marks[partition]``."""
        self._resume = dict(marks)

    def statistics(self) -> dict[str, int]:
        """For status: events published, fast-forwarded after a restart, lines skipped."""
        return {
            "published": self.published,
            "fast_forwarded": self.fast_forwarded,
            "skipped_lines": sum(part.skipped for part in self.parts()),
            "duplicate_rows": sum(part.duplicates for part in self.parts()),
            "account_events_left_out": sum(part.outputs for part in self.parts()),
            "other_messages_left_out": sum(part.other_messages for part in self.parts()),
        }

    def format(self) -> str:
        """``jsonl``, ``coinbase`` or ``csv``: the configured one, else ``csv`` by
        suffix, else by the first line (JSON: a FeedEvent or a Coinbase message)."""
        if self.config.format != "auto":
            return self.config.format
        if self._format is None:
            self._format = self._sniff()
        return self._format

    def _sniff(self) -> str:
        name = self.path.name.removesuffix(".gz")
        if Path(name).suffix.lower() == ".csv":
            return "csv"
        first = ""
        with closing(self._lines()) as lines:
            for _, line in lines:
                if first := line.strip().lstrip("\ufeff"):
                    break
        if not first.startswith("{"):
            return "csv"
        from feeds.coinbase_ws.recording import is_coinbase_message  # websockets: lazily

        return "coinbase" if is_coinbase_message(first) else "jsonl"

    def events(self) -> Generator[FeedEvent, None, None]:
        """Every event of the file, in order; ReplayError (file:line) on bad input."""
        for _, event in self._timed():
            yield event

    def recorded(self) -> Generator[FeedEvent, None, None]:
        """Every event of the file as recorded, in order: a recording's ``account.*``
        events and ``receivedTs`` kept (what rebuilds the state its hooks saw); with
        ``files``, every file's, merged by event time as :meth:`selected` does."""
        if not self.config.files:
            for _, event in self._timed(as_recorded=True):
                yield event
            return
        sources = [
            (part._first(as_recorded=True), partial(part._timed, as_recorded=True))
            for part in self.parts()
        ]
        for _, event in by_time(sources):
            yield event

    def _first(self, as_recorded: bool = False) -> int | None:
        """The time of the file's first event (None: it has none): none of it is earlier."""
        with closing(self._timed(as_recorded)) as events:
            first = next(events, None)
        return None if first is None else first[0]

    def _timed(self, as_recorded: bool = False) -> Generator[tuple[int, FeedEvent], None, None]:
        """(event ms, event) for every event of the file: each parser knows the time
        it formatted or checked, so nothing parses ``ts`` again."""
        if not self.config.path:
            raise ReplayError("feeds.replay.path is not set")
        match self.format():
            case "jsonl":
                yield from self._jsonl_all() if as_recorded else self._jsonl()
            case "coinbase":
                yield from self._coinbase()
            case _:
                yield from self._csv()

    def parts(self) -> list[ReplayFeed]:
        """This file, then one feed per ``files`` entry (with the replay's settings)."""
        if self._parts is not None:
            return self._parts
        c = self.config
        more = [
            ReplayFeed(
                msgspec.structs.replace(
                    c,
                    path=f.path,
                    format=f.format,
                    symbol=f.symbol or c.symbol,
                    timeframe=f.timeframe or c.timeframe,
                    files=[],
                ),
                name=self.name,
            )
            for f in c.files
        ]
        self._parts = [self, *more]
        return self._parts

    def selected(self) -> Iterator[tuple[int, FeedEvent]]:
        """(event ms, event) of the events within ``from_ms`` .. ``to_ms``, in order;
        several files merged by event time (a tie keeps the files' order)."""
        if not self.config.files:
            return self._selected()
        return by_time([(part._first(), part._selected) for part in self.parts()])

    def closes(self, symbol: str) -> Iterator[tuple[int, float]]:
        """(close time ms, close) of ``symbol``'s closed candles within ``from_ms`` ..
        ``to_ms``, in order, over every file: what a backtest report draws. A CSV's
        time and close columns are read alone (~6x faster than building the events:
        a replay has checked every row), a recording's from its events (its ticks'
        prices when it has no candles of ``symbol``)."""
        parts = self.parts()
        if len(parts) == 1:
            return parts[0]._closes(symbol)
        return by_time([(part._first(), partial(part._closes, symbol)) for part in parts])

    def _closes(self, symbol: str) -> Iterator[tuple[int, float]]:
        if self.format() != "csv":
            yield from _prices(until_bad(self._selected()), symbol)
            return
        if self.config.symbol != symbol or self.config.timeframe not in TIMEFRAMES:
            return
        tf_ms = TIMEFRAMES[self.config.timeframe] * 1000
        lo, hi = self.config.from_ms, self.config.to_ms or None
        _, lines = self._csv_rows()
        last = None
        with closing(lines):
            for _, line in lines:
                try:
                    t, close = candle_csv.row_close(line)
                except (ValueError, IndexError):
                    continue  # a blank line (a bad row fails the replay itself)
                if t == last:
                    continue  # a duplicate row (the replay skipped it, or failed on it)
                last = t
                t += tf_ms
                if hi is not None and t >= hi:
                    return  # open times increase (the replay checked them)
                if t >= lo:
                    yield t, close

    def history(self, n: int) -> list[tuple[str, str, list[Candle]]]:
        """(symbol, timeframe, candles) of each series' last ``n`` closed candles that
        close before ``from_ms``, oldest first, over every file: what primes the state
        caches of a replay that starts later than its data (indicators then start
        warm, as a daemon that had been running). Nothing when ``from_ms`` is 0."""
        if not self.config.from_ms or n < 1:
            return []
        held: dict[tuple[str, str], deque[Candle]] = {}
        for part in self.parts():
            for key, candle in part._before(n):
                held.setdefault(key, deque(maxlen=n)).append(candle)
        return [(s, tf, list(candles)) for (s, tf), candles in held.items()]

    def _before(self, n: int) -> Iterator[tuple[tuple[str, str], Candle]]:
        """((symbol, timeframe), candle) of this file's closed candles before
        ``from_ms`` (a CSV's last ``n`` only: its rows are parsed once they are)."""
        lo = self.config.from_ms
        if self.format() != "csv":
            for ts, event in self._timed():
                if ts >= lo:
                    return
                if event.topic == MARKET_CANDLE_CLOSED and event.symbol and event.timeframe:
                    candle = candle_of(event.payload)
                    if candle is not None:
                        yield (event.symbol, event.timeframe), candle
            return
        symbol, timeframe = self.config.symbol, self.config.timeframe
        if not symbol or timeframe not in TIMEFRAMES:
            return  # the replay itself reports it
        tf_ms = TIMEFRAMES[timeframe] * 1000
        last: deque[tuple[int, str]] = deque(maxlen=n)
        layout, lines = self._csv_rows()
        with closing(lines):
            for lineno, line in lines:
                try:
                    if candle_csv.row_time(line) + tf_ms >= lo:
                        break
                except ValueError:
                    continue  # a blank line; a bad row fails the replay itself
                last.append((lineno, line))
        for lineno, line in last:
            where = f"{self.path}:{lineno}"
            yield (symbol, timeframe), candle_csv.candle(line, layout, tf_ms, where)

    def _selected(self) -> Iterator[tuple[int, FeedEvent]]:
        lo, hi = self.config.from_ms, self.config.to_ms or None
        if self.format() == "csv":
            yield from self._csv(lo, hi)
            return
        for ts, event in self._timed():
            if ts >= lo and (hi is None or ts < hi):
                yield ts, event

    async def run(
        self,
        publish: Publish,
        health: FeedHealth,
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Publish the selected part of the file (paced by ``speed``) and return."""
        events = self.selected()
        first = next(events, None)
        task_status.started()
        if first is None:
            log.info("replay.finished", path=str(self.path), events=0)
            return
        pace: _Pacer | None = None
        for ts, event in itertools.chain((first,), events):
            if ts <= self._resume.get(event.partition, -1):
                self.fast_forwarded += 1
            elif pace is None:
                pace = _Pacer(self.config.speed, ts)
            else:
                await pace.wait(ts)
            await self._publish(event, publish, health)
        if self.fast_forwarded:
            log.info("replay.resumed", fast_forwarded=self.fast_forwarded)
        log.info(
            "replay.finished",
            path=str(self.path),
            events=self.published,
            skipped=self.statistics()["skipped_lines"],
        )

    async def _publish(self, event: FeedEvent, publish: Publish, health: FeedHealth) -> None:
        await publish(event)
        self.published += 1
        health.beat()
        if self.published % 256 == 0:
            await anyio.lowlevel.checkpoint()  # let others run even if publish never blocks

    def _open(self) -> IO[str]:
        try:
            return open_text(self.path, newline="")  # a FIFO is an error, never a wait
        except OSError as exc:
            raise ReplayError(f"{self.path}: cannot open replay file: {exc.strerror}") from None

    def _lines(self) -> Generator[tuple[int, str], None, None]:
        """(line number, text) pairs; read and decode errors, and a line longer than
        :data:`MAX_LINE_CHARS` (a file with no newlines would be read whole into
        memory), become ReplayError."""
        lineno = 0
        try:
            with self._open() as fh:
                read = fh.readline
                while line := read(MAX_LINE_CHARS + 1):
                    lineno += 1
                    if len(line) > MAX_LINE_CHARS:
                        raise ReplayError(
                            f"{self.path}:{lineno}: a line longer than {MAX_LINE_CHARS:,} "
                            "characters: not a recording or candle file"
                        )
                    yield lineno, line
        except (OSError, EOFError, UnicodeDecodeError) as exc:
            raise ReplayError(f"{self.path}:{lineno + 1}: cannot read: {exc}") from None

    def _jsonl(self) -> Iterator[tuple[int, FeedEvent]]:
        """The recording's events but its ``account.*`` ones: those are what the
        recorded run's paper broker did, and this run's broker makes its own (replayed,
        they would show the agents and the copy-trade relay orders and fills twice)."""
        for ms, event in self._jsonl_all():
            if event.topic.startswith(ACCOUNT_PREFIX):
                self.outputs += 1
                continue
            yield ms, msgspec.structs.replace(event, received_ts=event.ts)

    def _jsonl_all(self) -> Iterator[tuple[int, FeedEvent]]:
        for events in self._json_lines(self._jsonl_event):
            yield from events

    def _json_lines(
        self, parse: Callable[[int, str], list[tuple[int, FeedEvent]]]
    ) -> Iterator[list[tuple[int, FeedEvent]]]:
        """``parse`` of each non-blank line; a last line without its newline that does
        not parse is a recording cut off by a crash: skipped and counted."""
        pending: tuple[int, str] | None = None
        for lineno, line in self._lines():
            if pending is not None:
                yield parse(*pending)
            pending = (lineno, line) if line.strip() else None
        if pending is None:
            return
        lineno, line = pending
        try:
            yield parse(lineno, line)
        except ReplayError:
            if line.endswith("\n"):
                raise
            self.skipped += 1
            log.warning("replay.truncated_last_line", path=str(self.path), line=lineno)

    def _jsonl_event(self, lineno: int, line: str) -> list[tuple[int, FeedEvent]]:
        try:
            event = decode(line)
            ms = parse_iso_ms(event.ts)
        except (*NOT_JSON, msgspec.ValidationError, ValueError) as exc:
            raise ReplayError(f"{self.path}:{lineno}: not a FeedEvent: {exc}") from None
        return [(ms, event)]

    def _coinbase(self) -> Iterator[tuple[int, FeedEvent]]:
        from feeds.coinbase_ws.recording import Recording  # websockets: lazily

        recording = Recording()

        def parsed(lineno: int, line: str) -> list[tuple[int, FeedEvent]]:
            try:
                recorded = recording.parse(line)
            except FeedProtocolError as exc:
                raise ReplayError(f"{self.path}:{lineno}: {exc}") from None
            self.other_messages += recorded.other
            return recorded.events

        for events in self._json_lines(parsed):
            yield from events
        yield from recording.finish()

    def _csv_rows(self) -> tuple[candle_csv.Layout, Generator[tuple[int, str], None, None]]:
        """The CSV's layout (ReplayError if it has none) and its rows, as
        (line number, text): the first line too when it is not a header."""
        lines = self._lines()
        try:
            first = next(lines, None)
            layout = candle_csv.layout_of(first[1] if first else "", f"{self.path}:1")
        except BaseException:
            lines.close()
            raise

        def rows() -> Generator[tuple[int, str], None, None]:
            with closing(lines):  # closing the rows closes the file
                if first is not None and not layout.header:
                    yield first
                yield from lines

        return layout, rows()

    def _csv(self, lo: int = 0, hi: int | None = None) -> Iterator[tuple[int, FeedEvent]]:
        """The events of the rows that close within ``lo`` .. ``hi``. The rows before
        ``lo`` are checked but make no event; reading stops at the first row at or
        past ``hi`` (open times increase), so a backtest of a month of a year's file
        reads a month, and a bad row after its window is not its concern."""
        symbol, timeframe = self.config.symbol, self.config.timeframe
        if not symbol:
            raise ReplayError(f"{self.path}: feeds.replay.symbol must be set to replay CSV candles")
        if timeframe not in TIMEFRAMES:
            raise ReplayError(f"{self.path}: unknown feeds.replay.timeframe {timeframe!r}")
        tf_ms = TIMEFRAMES[timeframe] * 1000
        layout, lines = self._csv_rows()
        previous = None
        gaps: list[int] = []  # the first ones, which tell the file's timeframe
        with closing(lines):
            for lineno, line in lines:
                if not line.strip():
                    continue
                where = f"{self.path}:{lineno}"
                candle = candle_csv.candle(line, layout, tf_ms, where)
                if not candle_csv.follows(previous, candle, tf_ms, gaps, where):
                    self.duplicates += 1  # the same candle again: one event
                    continue
                previous = candle
                if candle.close_time_ms < lo:
                    continue
                if hi is not None and candle.close_time_ms >= hi:
                    return
                yield (
                    candle.close_time_ms,
                    closed_event(
                        candle,
                        source=self.config.source,
                        symbol=symbol,
                        timeframe=timeframe,
                        received_ms=candle.close_time_ms,
                    ),
                )


def by_time(
    sources: Sequence[tuple[int | None, Callable[[], Iterator[tuple[int, T]]]]],
) -> Iterator[tuple[int, T]]:
    """The sources' (time, item) pairs in time order, a tie in the sources' order. A
    source is a file's first time (None: it has nothing) and how to read it; it is
    opened only once the merge reaches that time, so a year of daily files of one
    series holds one open at a time (a k-way merge opened them all at the start, past
    the descriptor limit with a few hundred)."""
    waiting = sorted((first, i) for i, (first, _) in enumerate(sources) if first is not None)
    heap: list[tuple[int, int, T, Iterator[tuple[int, T]]]] = []  # (time, source, item, rest)

    def push(i: int, rest: Iterator[tuple[int, T]]) -> None:
        nxt = next(rest, None)
        if nxt is not None:  # one entry per source: (time, source) never ties
            heapq.heappush(heap, (nxt[0], i, nxt[1], rest))

    w = 0
    try:
        while heap or w < len(waiting):
            while w < len(waiting) and (not heap or waiting[w][0] <= heap[0][0]):
                i = waiting[w][1]
                push(i, sources[i][1]())
                w += 1
            if not heap:
                continue
            t, i, item, rest = heapq.heappop(heap)
            yield t, item
            push(i, rest)
    finally:
        for *_, rest in heap:
            close = getattr(rest, "close", None)
            if close is not None:
                close()  # its file, when the reader stops early


def until_bad(events: Iterator[T]) -> Iterator[T]:
    """``events`` up to the first bad line, if any: what a replay that met it (and said
    so) published, for a report of the run, not a second failure."""
    try:
        yield from events
    except ReplayError:
        return


def _prices(events: Iterator[tuple[int, FeedEvent]], symbol: str) -> list[tuple[int, float]]:
    """``symbol``'s candle closes among ``events``, or its tick prices when it has no
    closed candle (a recording of ticks only)."""
    closes: list[tuple[int, float]] = []
    ticks: list[tuple[int, float]] = []
    for t, event in events:
        if event.symbol != symbol or not isinstance(event.payload, dict):
            continue
        if event.topic == MARKET_CANDLE_CLOSED:
            value, into = event.payload.get("close"), closes
        elif event.topic == MARKET_PRICE_TICK and not closes:
            value, into = event.payload.get("price"), ticks
        else:
            continue
        if isinstance(value, int | float):
            into.append((t, float(value)))
    return closes or ticks


class _Pacer:
    """Sleeps so event-time gaps become wall-time gaps divided by ``speed``."""

    def __init__(self, speed: float, first_ms: int) -> None:
        self.speed = speed
        self.first_ms = first_ms
        self.started = time.monotonic()

    async def wait(self, event_ms: int) -> None:
        if self.speed <= 0:
            return
        due = self.started + (event_ms - self.first_ms) / 1000 / self.speed
        delay = due - time.monotonic()
        if delay > 0:
            await anyio.sleep(delay)
