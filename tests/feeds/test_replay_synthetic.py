"""The seeded synthetic candle generator (demo data): determinism and features."""

from __future__ import annotations

import csv
import itertools
from pathlib import Path

import anyio
import pytest

from daemon.events import FeedEvent
from feeds.base import FeedHealth
from feeds.candle_csv import HEADER as CSV_HEADER
from feeds.config import ReplaySection
from feeds.replay import ReplayFeed
from feeds.synthetic import generate_candles, main


def rows_of(path: Path) -> list[dict[str, float]]:
    with path.open() as fh:
        return [{k: float(v) for k, v in r.items()} for r in csv.DictReader(fh)]


def test_same_seed_same_bytes_other_seed_other_series(tmp_path: Path) -> None:
    """Generation is a pure function of its arguments."""
    a, b, c = tmp_path / "a.csv", tmp_path / "b.csv", tmp_path / "c.csv"
    assert generate_candles(a, seed=3, n=500) == 500
    generate_candles(b, seed=3, n=500)
    generate_candles(c, seed=4, n=500)
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()


@pytest.mark.parametrize("seed", [1, 7, 42])
def test_series_has_the_shapes_the_example_hooks_look_for(tmp_path: Path, seed: int) -> None:
    """Valid OHLC, continuous opens, a >10% crash within 24 h, doji and green runs."""
    path = tmp_path / "synthetic_BTC-USD_1m.csv"
    generate_candles(path, seed=seed, n=3000, start_price=30_000.0)
    assert path.read_text().splitlines()[0] == CSV_HEADER
    rows = rows_of(path)
    assert all(
        r["low"] <= min(r["open"], r["close"]) <= max(r["open"], r["close"]) <= r["high"]
        for r in rows
    )
    assert all(b["open"] == a["close"] for a, b in itertools.pairwise(rows))
    assert all(b["open_time_ms"] - a["open_time_ms"] == 60_000 for a, b in itertools.pairwise(rows))
    closes = [r["close"] for r in rows]
    worst = max(1 - min(closes[i : i + 1440]) / closes[i] for i in range(len(closes)))
    assert worst > 0.10
    assert sum(r["open"] == r["close"] for r in rows) >= 10
    assert _longest_green_run(rows) >= 6


def _longest_green_run(rows: list[dict[str, float]]) -> int:
    best = run = 0
    for r in rows:
        run = run + 1 if r["close"] > r["open"] else 0
        best = max(best, run)
    return best


async def test_generated_file_replays_as_candle_closes(tmp_path: Path) -> None:
    """The CLI's output is accepted by the replay feed, one close per row."""
    path = tmp_path / "synthetic_ETH-USD_5m.csv"
    assert (
        main([str(path), "--seed", "5", "--n", "200", "--timeframe", "5m", "--start-price", "2000"])
        == 0
    )
    feed = ReplayFeed(ReplaySection(enabled=True, path=str(path), symbol="ETH-USD", timeframe="5m"))
    events: list[FeedEvent] = []

    async def publish(event: FeedEvent) -> None:
        events.append(event)

    async with anyio.create_task_group() as tg:
        await tg.start(feed.run, publish, FeedHealth("replay"))
    assert len(events) == 200
    assert events[0].payload["open"] == 2000.0
    assert events[-1].payload["closeTimeMs"] - events[0].payload["closeTimeMs"] == 199 * 300_000
