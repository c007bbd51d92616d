"""Sans-I/O candle protocol: parsing Coinbase bodies, closing rules, paging."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from daemon.errors import FeedProtocolError
from daemon.events import Candle
from feeds.candles import protocol as p
from feeds.candles.store import HighWaterStore

M5 = 300_000
T0 = 1_775_520_000_000

BODY = (
    b'{"candles": ['
    b'{"start": "1775520300", "low": "99.5", "high": "101.25", "open": "100", "close": "101",'
    b' "volume": "12.50000000"},'
    b'{"start": "1775520000", "low": "98", "high": "100.5", "open": "99", "close": "100",'
    b' "volume": "3"}]}'
)


def test_candles_newest_first_strings_become_oldest_first_floats() -> None:
    """Coinbase's newest-first string candles parse into ascending typed Candles."""
    candles = p.parse_candles(BODY, "5m")
    assert [c.open_time_ms for c in candles] == [T0, T0 + M5]
    assert candles[1] == Candle(
        open_time_ms=T0 + M5,
        close_time_ms=T0 + 2 * M5,
        open=100.0,
        high=101.25,
        low=99.5,
        close=101.0,
        volume=12.5,
    )


def test_numeric_fields_and_duplicate_buckets_are_accepted() -> None:
    """Numbers instead of strings parse too; a repeated bucket keeps one candle."""
    one = b'{"start": 1775520000, "low": 1, "high": 2, "open": 1.5, "close": 1.5, "volume": 0}'
    candles = p.parse_candles(b'{"candles": [' + one + b", " + one + b"]}", "5m")
    assert candles == [
        Candle(
            open_time_ms=T0,
            close_time_ms=T0 + M5,
            open=1.5,
            high=2.0,
            low=1.0,
            close=1.5,
            volume=0.0,
        )
    ]
    assert p.parse_candles(b'{"candles": []}', "1h") == []


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"<html>502</html>", "bad candles response"),
        (b'{"candles": [{"start": "1775520000", "low": "1"', "bad candles response"),
        (b'{"data": []}', "candles"),
        (
            b'{"candles": [{"start": "x", "low": "1", "high": "1", "open": "1", "close": "1", "volume": "1"}]}',
            "start",
        ),
        (
            b'{"candles": [{"start": "1775520000", "low": "3", "high": "2", "open": "2", "close": "2", "volume": "1"}]}',
            "high/low",
        ),
        (
            b'{"candles": [{"start": "1775520000", "low": "1", "high": "2", "open": "2", "close": "NaN", "volume": "1"}]}',
            "out of range",
        ),
        (
            b'{"candles": [{"start": "1775520060", "low": "1", "high": "2", "open": "2", "close": "2", "volume": "1"}]}',
            "boundary",
        ),
        (
            b'{"candles": [{"start": "1775520000", "low": "0", "high": "2", "open": "2", "close": "2", "volume": "1"}]}',
            "price of zero",
        ),
    ],
)
def test_malformed_candle_bodies_raise_protocol_errors(body: bytes, message: str) -> None:
    """Non-JSON, truncated, wrong shape or impossible values: FeedProtocolError, never a crash."""
    with pytest.raises(FeedProtocolError, match=message):
        p.parse_candles(body, "5m")


@pytest.mark.parametrize(
    "body",
    [
        b'{"iso": "2026-04-07T00:00:01.5Z", "epochSeconds": "1775520001", "epochMillis": "1775520001500"}',
        b'{"iso": "2026-04-07T00:00:01.5Z", "epochSeconds": 1775520001, "epochMillis": 1775520001500}',
        b'{"epochSeconds": "1775520001.5"}',
        b'{"iso": "2026-04-07T00:00:01.500000Z"}',
    ],
)
def test_server_time_accepts_string_or_numeric_fields(body: bytes) -> None:
    """/time with strings (live) or ints (some mocks) gives the same epoch ms."""
    assert p.parse_server_time(body) == T0 + 1_500


@pytest.mark.parametrize(
    "body",
    [b"{}", b"[]", b'{"epochMillis": "soon"}', b"garbage", b'{"epochMillis": "inf"}',
     b'{"epochSeconds": "1e999"}', b'{"epochMillis": "nan"}', b'{"epochMillis": "1e300"}',
     b'{"epochSeconds": -5}'],
)  # fmt: skip
def test_bad_server_time_is_a_protocol_error(body: bytes) -> None:
    """A /time body without a usable time is FeedProtocolError."""
    with pytest.raises(FeedProtocolError):
        p.parse_server_time(body)


def test_forming_candle_is_not_closed_until_settled() -> None:
    """Closed iff close time + settle margin <= server now."""
    c = p.parse_candles(BODY, "5m")[1]  # closes at T0 + 2*M5
    assert not p.is_closed(c, T0 + M5 + 10_000)
    assert not p.is_closed(c, T0 + 2 * M5 + 1_999)
    assert p.is_closed(c, T0 + 2 * M5 + 2_000)
    assert p.is_closed(c, T0 + 2 * M5, settle_ms=0)


def test_first_run_plan_starts_at_newest_closed_bucket() -> None:
    """No high-water mark: one window from the last closed bucket through the forming one."""
    plan = p.plan(None, T0 + 100_000, M5, max_backfill=1000)
    assert plan == p.Plan(windows=[p.Window(T0 - M5, T0 + M5)], skipped=0)


def test_backfill_pages_stay_within_300_buckets_and_overlap_the_mark() -> None:
    """A long gap is paged oldest first, <= 300 buckets each, starting one bucket before the mark."""
    m1 = 60_000
    mark = T0
    now = T0 + 700 * m1 + 5_000
    plan = p.plan(mark, now, m1, max_backfill=1000)
    assert plan.skipped == 0
    assert plan.windows[0].start_ms == mark - m1
    assert plan.windows[-1].end_ms == T0 + 701 * m1
    assert all((w.end_ms - w.start_ms) // m1 <= 300 for w in plan.windows)
    assert all(a.end_ms == b.start_ms for a, b in itertools.pairwise(plan.windows))


def test_backfill_beyond_cap_skips_and_counts_oldest() -> None:
    """More missed closes than max_backfill: the oldest are skipped and counted."""
    plan = p.plan(T0, T0 + 50 * M5 + 10_000, M5, max_backfill=10)
    assert plan.skipped == 40
    assert plan.windows == [p.Window(T0 + 40 * M5, T0 + 51 * M5)]


def test_request_params_use_unix_seconds_and_the_granularity_enum() -> None:
    """Windows turn into Coinbase query params; every timeframe has an enum value."""
    params = p.candle_params(p.Window(T0, T0 + 300 * M5), "5m")
    assert params == {
        "start": "1775520000",
        "end": str((T0 + 300 * M5) // 1000),
        "granularity": "FIVE_MINUTE",
    }
    assert p.GRANULARITY["4h"] == "FOUR_HOUR" and p.GRANULARITY["1d"] == "ONE_DAY"


@pytest.mark.parametrize(
    ("tf", "seconds"), [("1m", 10.0), ("5m", 30.0), ("15m", 90.0), ("1h", 300.0), ("1d", 300.0)]
)
def test_derived_poll_interval_is_well_inside_the_timeframe(tf: str, seconds: float) -> None:
    """poll_seconds=0 derives a tenth of the timeframe, clamped to 10..300 s."""
    assert p.derive_poll_seconds(tf) == seconds


def test_retry_after_accepts_seconds_and_http_dates() -> None:
    """Retry-After is delta-seconds or an HTTP date relative to now."""
    assert p.parse_retry_after("3", 0) == 3.0
    assert p.parse_retry_after(None, 0) is None
    assert p.parse_retry_after("Tue, 07 Apr 2026 00:00:30 GMT", T0) == 30.0
    assert p.parse_retry_after("whenever", T0) is None


def test_error_bodies_are_described_with_coinbase_fields() -> None:
    """Coinbase's {error, error_details, message} shape reads as one line."""
    body = b'{"error": "INVALID_ARGUMENT", "error_details": "too many candles", "message": "x"}'
    assert p.describe_error(400, body) == "HTTP 400 INVALID_ARGUMENT: too many candles"
    assert p.describe_error(502, b"<html>") == "HTTP 502: '<html>'"


def test_high_water_mark_only_moves_forward_and_persists(tmp_path: Path) -> None:
    """The SQLite mark survives reopening and never goes backward."""
    path = tmp_path / "state" / "candles.sqlite3"
    store = HighWaterStore(path)
    assert store.get("k") is None
    store.advance("k", 200)
    store.advance("k", 100)
    store.close()
    again = HighWaterStore(path)
    assert again.get("k") == 200 and again.all() == {"k": 200}
    again.close()
