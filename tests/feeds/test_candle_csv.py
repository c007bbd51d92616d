"""Binance kline CSVs replay as they come: the same events as marketwake's own layout."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from daemon.errors import ReplayError
from daemon.events import encode
from feeds.candle_csv import BINANCE_HEADER
from feeds.config import ReplayFileSection, ReplaySection
from feeds.replay import ReplayFeed
from tests.binance import write_zip
from tests.feeds.test_replay import M1, ROWS, feed_for, replay, write_csv

T0 = ROWS[0][0]


def binance_rows(unit: int, span_ms: int = M1) -> list[str]:
    """ROWS as Binance writes them: 12 columns, times in ``unit`` per millisecond."""
    return [
        f"{t * unit},{o},{h},{lo},{c},{v},{(t + span_ms) * unit - 1},1.5,7,0.5,0.75,0"
        for t, o, h, lo, c, v in ROWS
    ]


def write(path: Path, lines: list[str]) -> Path:
    if path.name.endswith(".zip"):  # as data.binance.vision serves them
        return write_zip(path, [line + "\n" for line in lines])
    data = "".join(line + "\n" for line in lines).encode()
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


async def test_binance_files_give_the_events_of_the_own_layout(tmp_path: Path) -> None:
    """Headerless in milliseconds, in microseconds (gzip), zipped as Binance serves
    them, with Binance's header, and
    monthly files joined across Binance's switch to microseconds: the same events,
    byte for byte, as the same candles in marketwake's layout; the report's closes and
    the warm-up history alike."""
    own = write_csv(tmp_path / "own.csv")
    ms, us = binance_rows(1), binance_rows(1000)
    files = {
        "ms": write(tmp_path / "ms.csv", ms),
        "us": write(tmp_path / "us.csv.gz", us),
        "zip": write(tmp_path / "BTCUSDT-1m-2024-01.zip", ms),
        "header": write(tmp_path / "h.csv", [BINANCE_HEADER, *ms]),
        "joined": write(tmp_path / "j.csv", ms[:2] + us[2:]),
    }
    want, _ = await replay(feed_for(own))
    assert len(want) == len(ROWS)
    for name, path in files.items():
        got, _ = await replay(feed_for(path))
        assert [encode(e) for e in got] == [encode(e) for e in want], name
        assert list(feed_for(path).closes("BTC-USD")) == list(feed_for(own).closes("BTC-USD"))
        later = feed_for(path, from_ms=T0 + 4 * M1)
        assert later.history(2) == feed_for(own, from_ms=T0 + 4 * M1).history(2) != []


async def test_a_binance_file_replayed_at_another_timeframe_is_refused(tmp_path: Path) -> None:
    """close_time says what the candles are: 1m rows replayed as 5m name the line and
    both timeframes (a backtest of the wrong timeframe would be quietly wrong)."""
    path = write(tmp_path / "b.csv", binance_rows(1000))
    with pytest.raises(ReplayError, match=rf"{path}:1: .*a 1m candle, replayed as 5m"):
        await replay(feed_for(path, timeframe="5m"))
    odd = write(tmp_path / "odd.csv", binance_rows(1, span_ms=90_000))
    with pytest.raises(ReplayError, match=r"a 90 s candle, replayed as 1m"):
        await replay(feed_for(odd))
    for close_time in ("9" * 200, "1", "-5"):  # no candle's length (a float would overflow)
        row = binance_rows(1)[0].split(",")
        row[6] = close_time
        bad = write(tmp_path / "bad.csv", [",".join(row)])
        with pytest.raises(ReplayError, match=r":1: close_time .* is not after open_time"):
            await replay(feed_for(bad))


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (["time,open,high,low,close,volume", "1,1,1,1,1,1"], "expected the header"),
        (["x,1,1,1,1,1,1,1,1,1,1,1"], "or Binance kline rows"),
        ([*binance_rows(1)[:2], binance_rows(1)[2] + ",9"], ":3: expected 12 fields, found 13"),
        ([*binance_rows(1)[:2], binance_rows(1)[0]], ":3: open times not increasing"),
    ],
)
async def test_what_is_no_candle_file_says_where(
    tmp_path: Path, lines: list[str], message: str
) -> None:
    """A first line of neither layout, and a bad Binance row, name file and line."""
    path = write(tmp_path / "c.csv", lines)
    with pytest.raises(ReplayError, match=message):
        await replay(feed_for(path))


def test_an_own_file_and_a_binance_one_merge_by_time(tmp_path: Path) -> None:
    """Two layouts in one replay ([feeds.replay] files): merged by event time."""
    own = write_csv(tmp_path / "btc.csv")
    eth = write(tmp_path / "eth.csv", binance_rows(1000))
    more = [ReplayFileSection(path=str(eth), symbol="ETH-USD")]
    feed = ReplayFeed(ReplaySection(enabled=True, path=str(own), symbol="BTC-USD", files=more))
    got = [(e.symbol, e.payload["close"]) for _, e in feed.selected()]
    closes = [float(row[4]) for row in ROWS]
    assert got == [(s, c) for c in closes for s in ("BTC-USD", "ETH-USD")]


def test_how_a_row_follows_the_one_before_it() -> None:
    """The ordering rules, on candles alone (no file): a repeat is skipped, a clash,
    a step back or a row too close is an error naming where, and the first gaps
    tell a file replayed at the wrong timeframe."""
    from daemon.events import Candle
    from feeds.candle_csv import follows

    def at(minute: float, close: float = 100.0) -> Candle:
        start = 1_704_067_200_000 + round(minute * M1)
        return Candle(open_time_ms=start, close_time_ms=start + M1, open=100.0, high=101.0,
                      low=99.0, close=close, volume=1.0)  # fmt: skip

    gaps: list[int] = []
    assert follows(None, at(0), M1, gaps, "f:1") and gaps == []
    assert follows(at(0), at(1), M1, gaps, "f:2") and gaps == [M1]
    assert not follows(at(1), at(1), M1, gaps, "f:3")  # the same row again
    with pytest.raises(ReplayError, match="f:4: a second candle opening at"):
        follows(at(1), at(1, close=99.5), M1, gaps, "f:4")
    with pytest.raises(ReplayError, match="f:5: open times not increasing"):
        follows(at(1), at(0), M1, gaps, "f:5")
    with pytest.raises(ReplayError, match="f:6: this candle opens 30 s after"):
        follows(at(1), at(1.5), M1, gaps, "f:6")
    wide: list[int] = []
    follows(at(0), at(5), M1, wide, "g:2")
    follows(at(5), at(10), M1, wide, "g:3")
    with pytest.raises(ReplayError, match="g:4: the first rows are 5m apart, not 1m"):
        follows(at(10), at(15), M1, wide, "g:4")
    uneven: list[int] = []
    for i, (a, b) in enumerate([(0, 5), (5, 7), (7, 12), (12, 13)]):
        assert follows(at(a), at(b), M1, uneven, f"h:{i}")  # a gap is data missing
