"""Replay of JSONL recordings and OHLCV CSVs: shape, determinism, pacing, errors."""

from __future__ import annotations

import gzip
import heapq
import os
import random
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from daemon.errors import ReplayError
from daemon.events import (
    ACCOUNT_ORDER_FILLED,
    MARKET_CANDLE_CLOSED,
    MARKET_PRICE_TICK,
    Candle,
    FeedEvent,
    encode,
    iso_ms,
    parse_iso_ms,
)
from feeds.base import FeedHealth
from feeds.config import ReplayFileSection, ReplaySection
from feeds.replay import ReplayFeed, by_time

M1 = 60_000
T0 = 1_704_067_200_000
ROWS = [
    (T0, "100.0", "101.5", "99.5", "101.0", "12.5"),
    (T0 + M1, "101.0", "101.0", "100.0", "100.0", "3"),
    (T0 + 2 * M1, "100.0", "100.0", "100.0", "100.0", "0"),
    (T0 + 3 * M1, "100.0", "104.0", "100.0", "103.5", "7.25"),
    (T0 + 4 * M1, "103.5", "103.6", "102.0", "102.5", "1"),
]


def write_csv(path: Path, rows: list[tuple[Any, ...]] = ROWS, header: str | None = None) -> Path:
    text = (header or "open_time_ms,open,high,low,close,volume") + "\n"
    text += "".join(",".join(str(f) for f in r) + "\n" for r in rows)
    if path.name.endswith(".gz"):
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def recording() -> list[FeedEvent]:
    tick = FeedEvent(
        event_id="coinbase:BTC-USD:tick:1",
        ts=iso_ms(T0 + 500),
        source="coinbase",
        topic=MARKET_PRICE_TICK,
        payload={"price": 100.25},
        symbol="BTC-USD",
        received_ts="2026-11-22T01:02:03.456Z",
    )
    close = FeedEvent(
        event_id=f"coinbase:BTC-USD:5m:{T0 + 300_000}",
        ts=iso_ms(T0 + 300_000),
        source="coinbase",
        topic=MARKET_CANDLE_CLOSED,
        payload={"close": 101.0, "closeTimeMs": T0 + 300_000},
        symbol="BTC-USD",
        timeframe="5m",
        partition_key="coinbase:BTC-USD:5m",
        received_ts="2026-11-22T01:02:04.000Z",
    )
    return [tick, close]


def write_jsonl(path: Path, events: list[FeedEvent], tail: bytes = b"") -> Path:
    data = b"".join(encode(e) + b"\n" for e in events) + tail
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


def feed_for(path: Path, **cfg: Any) -> ReplayFeed:
    cfg.setdefault("symbol", "BTC-USD")
    return ReplayFeed(ReplaySection(enabled=True, path=str(path), **cfg))


async def replay(feed: ReplayFeed) -> tuple[list[FeedEvent], list[float]]:
    """Run the feed to completion; events and the monotonic time each arrived."""
    events: list[FeedEvent] = []
    stamps: list[float] = []

    async def publish(event: FeedEvent) -> None:
        events.append(event)
        stamps.append(time.monotonic())

    try:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                await tg.start(feed.run, publish, FeedHealth("replay"))
    except BaseExceptionGroup as group:  # unwrap the task group's wrapper
        raise group.exceptions[0] from None
    return events, stamps


class Status:
    """A task_status that remembers whether started() was called."""

    called = False

    def started(self, value: object = None) -> None:
        self.called = True


async def test_csv_rows_become_live_candle_close_events(tmp_path: Path) -> None:
    """Each CSV row is a market.candle.closed with the poller's id, times and payload."""
    events, _ = await replay(feed_for(write_csv(tmp_path / "c.csv"), source="backtest"))
    assert len(events) == len(ROWS)
    ev = events[1]
    close_ms = T0 + 2 * M1
    assert ev.event_id == f"backtest:BTC-USD:1m:{close_ms}"
    assert ev.topic == MARKET_CANDLE_CLOSED and ev.source == "backtest"
    assert ev.ts == iso_ms(close_ms) == ev.received_ts
    assert ev.partition_key == "backtest:BTC-USD:1m" and ev.timeframe == "1m"
    assert ev.payload == {
        "open": 101.0,
        "high": 101.0,
        "low": 100.0,
        "close": 100.0,
        "volume": 3.0,
        "openTime": iso_ms(T0 + M1),
        "closeTime": iso_ms(close_ms),
        "openTimeMs": T0 + M1,
        "closeTimeMs": close_ms,
    }


@pytest.mark.parametrize("name", ["c.csv", "c.csv.gz", "r.jsonl", "r.jsonl.gz"])
async def test_same_file_twice_gives_identical_events(tmp_path: Path, name: str) -> None:
    """Replaying one file twice yields byte-identical events in the same order."""
    path = tmp_path / name
    write_csv(path) if ".csv" in name else write_jsonl(path, recording())
    first, _ = await replay(feed_for(path))
    second, _ = await replay(feed_for(path))
    assert first and [encode(e) for e in first] == [encode(e) for e in second]


async def test_jsonl_replays_recorded_events_with_received_equal_ts(tmp_path: Path) -> None:
    """A recording comes back event for event; only receivedTs is pinned to ts."""
    recorded = recording()
    events, _ = await replay(feed_for(write_jsonl(tmp_path / "r.jsonl", recorded)))
    assert [e.event_id for e in events] == [e.event_id for e in recorded]
    assert [e.payload for e in events] == [e.payload for e in recorded]
    assert all(e.received_ts == e.ts for e in events)
    assert events[1].partition_key == "coinbase:BTC-USD:5m"


async def test_a_recordings_broker_events_are_left_out_and_counted(tmp_path: Path) -> None:
    """account.* lines are what the recorded run's paper broker did; this run's broker
    makes its own, so replaying them would show every order and fill twice."""
    tick, close = recording()
    fill = msgspec.structs.replace(
        tick, event_id="paper:fill:1", topic=ACCOUNT_ORDER_FILLED, source="paper", symbol=None
    )
    feed = feed_for(write_jsonl(tmp_path / "r.jsonl", [tick, fill, close]))
    events, _ = await replay(feed)
    assert [e.event_id for e in events] == [tick.event_id, close.event_id]
    assert feed.statistics()["account_events_left_out"] == 1
    assert feed.statistics()["published"] == 2


async def test_speed_factor_divides_event_time_gaps(tmp_path: Path) -> None:
    """At speed 1200 the i-th one-minute step is due 50 ms * i after the first; speed 0: no pacing."""
    path = write_csv(tmp_path / "c.csv")
    _, paced = await replay(feed_for(path, speed=1200.0))
    offsets = [t - paced[0] for t in paced]
    assert all(off >= 0.05 * i - 0.005 for i, off in enumerate(offsets)), offsets
    assert offsets[-1] < 1.0  # paced, not stuck
    _, fast = await replay(feed_for(path, speed=0.0))
    assert fast[-1] - fast[0] < 0.1


async def test_bad_csv_header_fails_before_started_naming_file_and_line(tmp_path: Path) -> None:
    """A wrong header is a ReplayError at file:1 raised before the feed reports started."""
    path = write_csv(tmp_path / "c.csv", header="time,open,high,low,close,volume")
    status = Status()

    async def publish(event: FeedEvent) -> None:
        raise AssertionError("nothing may be published")

    with pytest.raises(ReplayError, match=rf"{path}:1: expected the header"):
        await feed_for(path).run(publish, FeedHealth("replay"), task_status=status)
    assert not status.called


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ((T0 + 9 * M1, "x", "1", "1", "1", "1"), "could not convert"),
        ((T0 + 9 * M1, "1", "1", "1"), "expected 6 fields"),
        ((T0 + 9 * M1, "1", "0.5", "1", "1", "1"), "high/low"),
        ((T0 + 9 * M1, "1", "1", "1", "1", "nan"), "finite"),
        ((T0 + 9 * M1, "0", "0", "0", "0", "0"), "above 0"),
        ((T0 + 9 * M1, "1", "1", "1", "1", "-1"), "volume not negative"),
        ((T0, "1", "1", "1", "1", "1"), "not increasing"),
        (
            (10**20, "1", "1", "1", "1", "1"),
            "open time 100000000000000000000 is past the year 9999",
        ),
    ],
)
async def test_bad_csv_row_names_its_line(
    tmp_path: Path, row: tuple[Any, ...], message: str
) -> None:
    """A malformed or out-of-order row is a ReplayError at its own line number."""
    path = write_csv(tmp_path / "c.csv", [*ROWS, row])
    with pytest.raises(ReplayError, match=rf"{path}:{len(ROWS) + 2}: .*{message}"):
        [e async for e in _aiter(feed_for(path))]


async def test_a_row_repeated_exactly_is_one_candle(tmp_path: Path) -> None:
    """Overlapping exports and concatenated files repeat rows: a row the same as the one
    before it is skipped and counted (one event, one close drawn); a second candle at
    the same open time with other values is an error at its line."""
    twice = [ROWS[0], ROWS[1], ROWS[1], ROWS[1], *ROWS[2:]]
    path = write_csv(tmp_path / "c.csv", twice)
    feed = feed_for(path, timeframe="1m")
    events, _ = await replay(feed)
    assert [e.event_id for e in events] == [e.event_id for e in (await replay(feed_for(
        write_csv(tmp_path / "once.csv"), timeframe="1m")))[0]]  # fmt: skip
    assert feed.statistics()["duplicate_rows"] == 2
    assert [t for t, _ in feed.closes("BTC-USD")] == [T0 + (i + 1) * M1 for i in range(5)]
    other = (T0 + M1, "101.0", "101.0", "100.0", "100.5", "3")  # the close differs
    path = write_csv(tmp_path / "clash.csv", [ROWS[0], ROWS[1], other, *ROWS[2:]])
    with pytest.raises(ReplayError, match=r"clash\.csv:4: a second candle opening at "
                       r"2024-01-01T00:01:00\.000Z with other values"):  # fmt: skip
        await replay(feed_for(path, timeframe="1m"))


@pytest.mark.parametrize(
    ("minutes", "timeframe", "message"),
    [
        (
            [0, 1, 2, 3, 4],
            "5m",
            (
                r":3: this candle opens 1m after the one before it, less than the 5m "
                r"timeframe it is replayed as \(1m candles\? Name the file's own"
            ),
        ),
        ([0, 0.001, 0.002, 0.003], "1m", r":3: this candle opens 60 ms after .* in seconds\?"),
        ([0, 5, 10, 15, 20], "1m", r":5: the first rows are 5m apart, not 1m: 5m candles\?"),
        ([0, 5, 17, 22, 27], "5m", None),  # gaps: candles missing from the data, not an error
    ],
)
async def test_rows_not_spaced_by_the_timeframe_are_not_its_candles(
    tmp_path: Path, minutes: list[float], timeframe: str, message: str | None
) -> None:
    """marketwake's own layout has no close time: 1m rows replayed as 5m, or open times
    written in seconds, would make overlapping candles, and 5m rows replayed as 1m
    candles a minute long with four-minute holes; the spacing says so. Data with
    candles missing here and there (longer gaps, uneven) is fine."""
    rows = [(T0 + round(m * M1), "100", "101", "99", "100", "1") for m in minutes]
    path = write_csv(tmp_path / "c.csv", rows)
    if message is None:
        events, _ = await replay(feed_for(path, timeframe=timeframe))
        assert len(events) == len(rows)
        return
    with pytest.raises(ReplayError, match=message):
        await replay(feed_for(path, timeframe=timeframe))


def test_a_csv_window_is_read_up_to_its_end_only(tmp_path: Path) -> None:
    """A CSV's open times increase, so reading stops at the first row past ``to_ms``:
    a window of a large file costs the window, and a bad row after it (here a time
    that goes backwards, then a row that does not parse) is not the window's concern.
    Rows before ``from_ms`` are still checked."""
    bad_after = [*ROWS, (T0, "1", "1", "1", "1", "1"), ("x", "1")]
    path = write_csv(tmp_path / "c.csv", bad_after)
    window = feed_for(path, timeframe="1m", from_ms=T0 + 2 * M1, to_ms=T0 + 4 * M1)
    assert [ts for ts, _ in window.selected()] == [T0 + 2 * M1, T0 + 3 * M1]
    assert list(window.closes("BTC-USD")) == [(T0 + 2 * M1, 100.0), (T0 + 3 * M1, 100.0)]
    with pytest.raises(ReplayError, match="not increasing"):  # the whole file
        list(feed_for(path, timeframe="1m", from_ms=T0 + 2 * M1).selected())
    bad_before = [(T0 - M1, "0", "0", "0", "0", "0"), *ROWS]
    path = write_csv(tmp_path / "before.csv", bad_before)
    with pytest.raises(ReplayError, match=r"before\.csv:2: .*above 0"):
        list(feed_for(path, timeframe="1m", from_ms=T0 + 2 * M1).selected())


async def _aiter(feed: ReplayFeed) -> Any:
    for event in feed.events():
        yield event


async def test_csv_needs_a_symbol(tmp_path: Path) -> None:
    """CSV rows carry no symbol, so an empty replay.symbol is a clear error."""
    with pytest.raises(ReplayError, match="symbol must be set"):
        await replay(feed_for(write_csv(tmp_path / "c.csv"), symbol=""))


async def test_missing_file_is_a_replay_error(tmp_path: Path) -> None:
    """A path that does not exist names itself in the error."""
    with pytest.raises(ReplayError, match="cannot open"):
        await replay(feed_for(tmp_path / "nope.csv"))


async def test_malformed_jsonl_line_is_error_but_cut_off_tail_is_skipped(tmp_path: Path) -> None:
    """A bad middle line fails at file:line; a crash-truncated last line is skipped and counted."""
    events = recording()
    cut = write_jsonl(tmp_path / "cut.jsonl", events, tail=b'{"eventId":"x","ts":"20')
    feed = feed_for(cut)
    got, _ = await replay(feed)
    assert len(got) == 2 and feed.skipped == 1
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(encode(events[0]) + b"\n{not json}\n" + encode(events[1]) + b"\n")
    with pytest.raises(ReplayError, match=rf"{bad}:2: not a FeedEvent"):
        await replay(feed_for(bad))


async def test_format_is_sniffed_when_suffix_is_unknown(tmp_path: Path) -> None:
    """Without a telling suffix, a leading '{' means JSONL, anything else CSV."""
    as_jsonl = write_jsonl(tmp_path / "rec.log", recording())
    as_csv = write_csv(tmp_path / "candles.txt")
    assert feed_for(as_jsonl).format() == "jsonl"
    assert feed_for(as_csv).format() == "csv"
    assert feed_for(as_csv, format="jsonl").format() == "jsonl"


async def test_several_files_merge_by_time_ties_in_file_order(tmp_path: Path) -> None:
    btc = write_csv(tmp_path / "btc.csv")
    # ETH: two minutes of its own, half a minute apart from BTC's, and one tie
    eth_rows = [
        (T0 + M1 // 2, "10", "11", "9", "10", "1"),
        (T0 + 2 * M1, "10", "10", "10", "10", "1"),
    ]
    eth = write_csv(tmp_path / "eth.csv", eth_rows)
    bad = write_csv(tmp_path / "bad.csv", header="time,open,high,low,close,volume")
    files = [ReplayFileSection(path=str(eth), symbol="ETH-USD", timeframe="1m")]
    events, _ = await replay(feed_for(btc, timeframe="1m", files=files))
    got = [(e.symbol, parse_iso_ms(e.ts) - T0) for e in events]
    assert (
        got
        == [
            ("BTC-USD", 1 * M1),
            ("ETH-USD", M1 // 2 + M1),
            ("BTC-USD", 2 * M1),
            ("BTC-USD", 3 * M1),
            ("ETH-USD", 3 * M1),  # the tie: the first file's first
            ("BTC-USD", 4 * M1),
            ("BTC-USD", 5 * M1),
        ][: len(got)]
        and len(got) == 7
    )
    # a bad file among several fails before the feed starts, naming it
    with pytest.raises(ReplayError, match=r"bad\.csv"):
        await replay(feed_for(btc, files=[ReplayFileSection(path=str(bad))]))


@pytest.mark.parametrize("bounds", [{}, {"from_ms": T0 + 2 * M1, "to_ms": T0 + 4 * M1}])
def test_closes_are_the_replayed_candle_closes(tmp_path: Path, bounds: dict[str, int]) -> None:
    """What a report draws, read from the close column alone, is exactly what the replay
    publishes: per symbol over several files (one gzipped, one JSONL), within the range."""
    btc = write_csv(tmp_path / "btc.csv.gz")
    eth = write_csv(tmp_path / "eth.csv", [(T0 + M1 // 2, "10", "11", "9", "10.5", "1")])
    rec = write_jsonl(tmp_path / "rec.jsonl", recording())
    files = [
        ReplayFileSection(path=str(eth), symbol="ETH-USD", timeframe="1m"),
        ReplayFileSection(path=str(rec), format="jsonl"),
    ]
    feed = feed_for(btc, timeframe="1m", files=files, **bounds)
    for symbol in ("BTC-USD", "ETH-USD", "SOL-USD"):
        want = [
            (t, float(e.payload["close"]))
            for t, e in feed.selected()
            if e.topic == MARKET_CANDLE_CLOSED and e.symbol == symbol
        ]
        assert list(feed.closes(symbol)) == want
        if symbol == "BTC-USD":  # the CSV's and the recording's candles, merged by time
            assert len(want) == (6 if not bounds else 2)


def test_closes_skip_blank_lines_as_the_replay_does(tmp_path: Path) -> None:
    """Blank lines (the replay skips them) are not points of the price plot either."""
    path = write_csv(tmp_path / "gaps.csv")
    text = path.read_text().splitlines(keepends=True)
    path.write_text("".join([*text[:3], "\n", "   \n", *text[3:], "\n"]))
    feed = feed_for(path, timeframe="1m")
    want = [(t, float(e.payload["close"])) for t, e in feed.selected()]
    assert list(feed.closes("BTC-USD")) == want and len(want) == len(ROWS)


async def test_a_file_without_newlines_is_refused_at_the_line_bound(tmp_path: Path) -> None:
    """A line past MAX_LINE_CHARS (a binary file, a huge blob) is a ReplayError naming
    the line, read no further than the bound, not a whole file held in memory."""
    from feeds.replay import MAX_LINE_CHARS

    blob = tmp_path / "blob.jsonl"
    blob.write_text(encode(recording()[0]).decode() + "\n" + "x" * (MAX_LINE_CHARS + 10))
    with pytest.raises(ReplayError, match=rf"{blob}:2: a line longer than"):
        await replay(feed_for(blob))
    ok = tmp_path / "ok.jsonl"
    ok.write_text(encode(recording()[0]).decode() + "\n" + " " * (MAX_LINE_CHARS - 1) + "\n")
    got, _ = await replay(feed_for(ok))
    assert len(got) == 1  # a line at the bound is read (here: blank, skipped)


def test_history_is_the_last_candles_before_from_per_series(tmp_path: Path) -> None:
    """What warms a replay that starts later than its data: per file and series, the
    last n candles closing before from_ms (a CSV's and a recording's; ticks and
    candles at or after from_ms are not history). Nothing without a from_ms."""
    from feeds.candles.protocol import closed_event

    csv = write_csv(tmp_path / "c.csv")  # 1m candles closing at T0 + 1..5 minutes
    candles = [
        Candle(open=1.0, high=2.0, low=0.5, close=10.0 + i, volume=1.0,
               open_time_ms=T0 + i * 300_000, close_time_ms=T0 + (i + 1) * 300_000)
        for i in range(4)
    ]  # fmt: skip
    events = [closed_event(c, source="rec", symbol="ETH-USD", timeframe="5m",
                           received_ms=c.close_time_ms) for c in candles]  # fmt: skip
    rec = write_jsonl(tmp_path / "r.jsonl", [recording()[0], *events])
    files = [ReplayFileSection(path=str(rec))]
    feed = feed_for(csv, timeframe="1m", from_ms=T0 + 3 * 300_000, files=files)
    (btc, btc_tf, btc_held), (eth, eth_tf, eth_held) = feed.history(2)
    assert (btc, btc_tf, [c.close for c in btc_held]) == ("BTC-USD", "1m", [103.5, 102.5])
    assert (eth, eth_tf, [c.close for c in eth_held]) == ("ETH-USD", "5m", [10.0, 11.0])
    assert feed_for(csv, timeframe="1m").history(2) == []


def test_many_files_of_one_series_are_open_one_at_a_time(tmp_path: Path) -> None:
    """A hundred daily files and a second series: the merge opens a file once it
    reaches its first event, so a few are open at once, not a hundred (three years of
    Binance daily files passed the descriptor limit); the events come in time order."""
    days = []
    for d in range(100):
        rows = [(T0 + (d * 3 + k) * M1, "1", "1", "1", "1", "1") for k in range(3)]
        days.append(write_csv(tmp_path / f"BTC-{d:03d}.csv", rows))
    eth = write_csv(
        tmp_path / "eth.csv", [(T0 + k * M1, "2", "2", "2", "2", "2") for k in range(300)]
    )
    more = [ReplayFileSection(path=str(p)) for p in days[1:]]
    more.append(ReplayFileSection(path=str(eth), symbol="ETH-USD"))
    feed = feed_for(days[0], files=more)
    before = len(os.listdir("/proc/self/fd"))
    seen, most = [], 0
    for t, event in feed.selected():
        most = max(most, len(os.listdir("/proc/self/fd")) - before)
        seen.append((t, event.symbol))
    assert most <= 4, most
    assert len(seen) == 600 and [t for t, _ in seen] == sorted(t for t, _ in seen)
    assert seen[:2] == [(T0 + M1, "BTC-USD"), (T0 + M1, "ETH-USD")]  # a tie: files' order


@pytest.mark.parametrize("seed", range(20))
def test_the_merge_is_a_k_way_merge(seed: int) -> None:
    """by_time gives what heapq.merge gives (ties in the sources' order), for sources
    that overlap, start late, or are empty; a reader that stops early closes them."""
    rnd = random.Random(seed)
    runs = [sorted(rnd.randrange(50) for _ in range(rnd.randrange(0, 8))) for _ in range(6)]
    items = [[(t, (i, k)) for k, t in enumerate(run)] for i, run in enumerate(runs)]
    sources = [(run[0][0] if run else None, partial(iter, run)) for run in items]
    assert list(by_time(sources)) == list(heapq.merge(*items, key=lambda ti: ti[0]))
    started: list[int] = []
    closed: list[int] = []

    def opened(i: int) -> Iterator[tuple[int, tuple[int, int]]]:
        started.append(i)
        try:
            yield from items[i]
        finally:
            closed.append(i)

    merged = by_time([(s[0], partial(opened, i)) for i, s in enumerate(sources)])
    if next(merged, None) is not None:
        merged.close()  # type: ignore[attr-defined]
        assert started and sorted(closed) == sorted(started)  # every file it opened
