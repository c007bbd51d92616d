"""Ingest: incremental and idempotent, persistent, input formats, missing data, exchange mode."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import numpy as np
import pytest
from aiohttp import web

from daemon.errors import DataFileError, FeedError, FeedProtocolError
from daemon.rag.config import ExchangeSection, RagConfig, StoreSection
from daemon.rag.datafiles import CANDLE_COLUMNS, read_candles, read_funding, read_open_interest
from daemon.rag.exchange import fetch_history
from daemon.rag.features import DAY_MS, Bars
from daemon.rag.ingest import ingest
from daemon.rag.schema import point_id
from daemon.rag.service import RagService
from daemon.rag.store_embedded import EmbeddedStore
from feeds import candle_csv
from tests.loopback import serve_app
from tests.rag import synth
from tests.rag.conftest import (
    OI_START_BAR,
    TF_MS,
    Collection,
    make_collection,
    observations,
    params_from,
)
from tests.rag.fake_binance import FakeBinance

H = 3_600_000


def test_incremental_reingest_adds_nothing_twice(tmp_path: Path) -> None:
    """A prefix, then the full file, then the full file again: ids never duplicate."""
    rows = synth.candles(2500, seed=21, tf=TF_MS)
    col = make_collection(tmp_path, rows=rows[:1800])
    first = col.store.count()
    fund, oi = observations(col.funding), observations(col.oi)
    full = synth.funding(int(rows[0, 0]) - 8 * H, int(rows[-1, 0]) + TF_MS)
    again = ingest(
        col.store, "BTCUSDT", "15m", Bars.from_rows(rows), observations(full), oi, col.cfg
    )
    assert again.new == 700
    # The last day of the prefix had pending outcomes (and funding ran out): rewritten in place.
    assert again.written > again.new
    assert col.store.count() == first + 700 == again.points
    third = ingest(
        col.store, "BTCUSDT", "15m", Bars.from_rows(rows), observations(full), oi, col.cfg
    )
    assert (third.written, third.new, third.unchanged) == (0, 0, third.points)
    ids = col.points()["id"]
    assert len(np.unique(ids)) == len(ids)
    assert set(ids.tolist()) >= {point_id("BTCUSDT", "15m", int(rows[-1, 0]))}
    del fund


def test_first_ingest_needs_complete_bars(tmp_path: Path) -> None:
    """Without funding/OI (or too short for warm-up) the collection is not created with junk stats."""
    rows = synth.candles(1200, tf=TF_MS)
    store = EmbeddedStore(str(tmp_path), "t")
    cfg = RagConfig(store=StoreSection(path=str(tmp_path)))
    with pytest.raises(DataFileError, match="at least 50 complete bars") as err:
        ingest(store, "BTCUSDT", "15m", Bars.from_rows(rows), None, None, cfg)
    # the error says what the bars past the warm-up lack
    past = int(re.search(r"of (\d+) bars past the warm-up", str(err.value)).group(1))  # type: ignore[union-attr]
    assert 0 < past < 1200 and f"{past} without a funding rate" in str(err.value)
    assert f"{past} without open interest" in str(err.value)
    with pytest.raises(DataFileError, match="got 0"):
        ingest(store, "BTCUSDT", "15m", Bars.from_rows(rows[:100]), None, None, cfg)
    assert store.meta() is None


def test_point_ids_are_deterministic() -> None:
    """The same bar always gets the same id; another symbol/timeframe/time gets another."""
    a = point_id("BTCUSDT", "5m", 1_700_000_000_000)
    assert a == point_id("BTCUSDT", "5m", 1_700_000_000_000)
    assert (
        len(
            {
                a,
                point_id("ETHUSDT", "5m", 1_700_000_000_000),
                point_id("BTCUSDT", "1m", 1_700_000_000_000),
            }
        )
        == 3
    )
    assert 0 <= a < 2**63


def test_persistence_across_restart(collection: Collection) -> None:
    """A new store object on the same directory answers exactly as before."""
    ts = int(collection.points()["t_ms"][-1])
    params = params_from(
        collection.points()[collection.points()["complete"]][300], ts, min_similarity=0.5
    )
    before = RagService(collection.cfg, collection.store).query_patterns(params)
    reopened = EmbeddedStore(str(collection.path), "trading_patterns")
    after = RagService(collection.cfg, reopened).query_patterns(params)
    assert reopened.count() == collection.store.count()
    assert after["matches"] == before["matches"] and after["statistics"] == before["statistics"]


def test_stored_outcomes_wait_for_their_horizon(collection: Collection) -> None:
    """In the store, the last day of points has no 24 h outcome, the last 4 h no 4 h outcome."""
    pts = collection.points()
    end = int(collection.rows[-1, 0]) + TF_MS
    pending = pts["t_ms"] + 24 * H > end
    assert pending.sum() == 24 * 4 and np.isnan(pts["outcome_24h"][pending]).all()
    assert np.isfinite(pts["outcome_24h"][~pending]).all()
    late4 = pts["t_ms"] + 4 * H > end
    assert np.isnan(pts["outcome_4h"][late4]).all() and np.isnan(pts["hit_stop_loss"][late4]).all()
    assert np.isfinite(pts["hit_take_profit"][~late4]).all()


def test_missing_oi_points_are_kept_but_never_matched(collection: Collection) -> None:
    """Bars without OI are stored incomplete (NaN, not 0) and never appear in results."""
    pts = collection.points()
    oi_start = int(collection.rows[OI_START_BAR, 0])
    early = pts[pts["t_ms"] < oi_start]
    assert len(early) > 0 and not early["complete"].any()
    assert np.isnan(early["open_interest_latest"]).all()
    ts = int(pts["t_ms"][-1])
    params = params_from(
        pts[pts["complete"]][10],
        ts,
        top_k=50,
        min_similarity=0.0,
        include_regime_filters=False,
        min_gap_hours=0,
    )
    out = RagService(collection.cfg, collection.store).query_patterns(params)
    assert len(out["matches"]) == 50
    assert all(m["timestamp"] >= oi_start for m in out["matches"])


def test_csv_formats_and_gzip(tmp_path: Path) -> None:
    """Candles (.gz, columns reordered), funding, both OI formats are read as documented."""
    rows = synth.candles(50, tf=TF_MS)
    text = "volume,open_time_ms,open,high,low,close\n" + "".join(
        f"{r[5]},{int(r[0])},{r[1]},{r[2]},{r[3]},{r[4]}\n" for r in rows[::-1]
    )
    gz = tmp_path / "c.csv.gz"
    gz.write_bytes(gzip.compress(text.encode()))
    bars = read_candles(gz)
    assert np.array_equal(bars.open_ms, rows[:, 0].astype(np.int64))
    assert np.allclose(bars.close, rows[:, 4])
    f = synth.write_csv(
        tmp_path / "f.csv", "funding_time_ms,funding_rate", np.array([[2, 0.1], [1, -0.2]])
    )
    assert read_funding(f).time_ms.tolist() == [1, 2]
    binance = tmp_path / "BTCUSDT-fundingRate-2025-01.csv"  # as data.binance.vision has it
    binance.write_text(
        "calc_time,funding_interval_hours,last_funding_rate\n"
        "1735689600000,8,0.00010000\n1735718400000,8,-0.00002500\n"
    )
    got = read_funding(binance)
    assert got.time_ms.tolist() == [1735689600000, 1735718400000]
    assert got.value.tolist() == [0.0001, -0.000025]
    g = synth.write_csv(tmp_path / "g.csv", "time_ms,open_interest", np.array([[5, 10.0]]))
    assert read_open_interest(g, "BTCUSDT").value.tolist() == [10.0]
    daily = tmp_path / "d.csv"
    daily.write_text(
        "date,day_start_ms,btcusdt_oi_value_usd,ethusdt_oi_value_usd\n2025-11-07,1762473600000,8.3e9,5.6e9\n"
    )
    eth = read_open_interest(daily, "ETHUSDT")
    # A daily value is known at the end of its day, never during it.
    assert eth.time_ms.tolist() == [1762473600000 + 24 * H] and eth.value.tolist() == [5.6e9]


def test_binance_kline_files_read_as_the_own_layout(tmp_path: Path) -> None:
    """Binance's kline files as they come (no header or Binance's; milliseconds, or
    microseconds as its spot files from 2025 on) give the candles the own layout does."""
    rows = synth.candles(50, tf=TF_MS)
    own = read_candles(synth.write_csv(tmp_path / "own.csv", ",".join(CANDLE_COLUMNS), rows))

    def binance(unit: int) -> list[str]:
        return [
            f"{int(r[0]) * unit},{r[1]},{r[2]},{r[3]},{r[4]},{r[5]},"
            f"{(int(r[0]) + TF_MS) * unit - 1},1.5,7,0.5,0.75,0\n"
            for r in rows
        ]

    ms, us = binance(1), binance(1000)
    files = {
        "ms.csv": "".join(ms),
        "header.csv": candle_csv.BINANCE_HEADER + "\n" + "".join(us),
        "joined.csv": "".join(ms[:20] + us[20:]),
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
        bars = read_candles(tmp_path / name)
        for field in ("open_ms", "open", "high", "low", "close", "volume"):
            assert np.array_equal(getattr(bars, field), getattr(own, field)), (name, field)


METRICS = (
    "create_time,symbol,sum_open_interest,sum_open_interest_value,"
    "count_toptrader_long_short_ratio,sum_toptrader_long_short_ratio,"
    "count_long_short_ratio,sum_taker_long_short_vol_ratio\n"
)


def test_binance_daily_metrics_files_give_open_interest_as_of_each_row(tmp_path: Path) -> None:
    """Binance's metrics files, one a day: the USD value as of each create_time (UTC
    text), several files read together, an empty value a gap (and a value of 0 or
    below: open interest has none); a bad row names its line."""
    day1 = tmp_path / "BTCUSDT-metrics-2025-01-01.csv"
    day1.write_text(
        METRICS + "2025-01-01 00:05:00,BTCUSDT,80000.5,7500000000.25,1.2,1.3,1.4,0.9\n"
        "2025-01-01 00:10:00,BTCUSDT,80001,,1.2,1.3,1.4,0.9\n"
        "2025-01-01 00:15:00,BTCUSDT,0,0,1.2,1.3,1.4,0.9\n"
        "2025-01-01 00:20:00,BTCUSDT,80001,-5,1.2,1.3,1.4,0.9\n"
    )
    day2 = tmp_path / "BTCUSDT-metrics-2025-01-02.csv"
    day2.write_text(METRICS + "2025-01-02 00:00:00,BTCUSDT,80100,7510000000,1,1,1,1\n")
    got = read_open_interest(day2, "BTCUSDT", day1)  # any order: sorted by time
    start = 1_735_689_600_000  # 2025-01-01T00:00:00Z
    assert got.time_ms.tolist() == [start + 300_000, start + DAY_MS]
    assert got.value.tolist() == [7_500_000_000.25, 7_510_000_000.0]
    bad = tmp_path / "bad.csv"
    bad.write_text(
        METRICS + "2025-01-01 00:05:00,BTCUSDT,1,2,1,1,1,1\nyesterday,BTCUSDT,1,2,1,1,1,1\n"
    )
    with pytest.raises(DataFileError, match=r"bad\.csv:3: malformed data"):
        read_open_interest(bad, "BTCUSDT")
    endless = tmp_path / "endless.csv"  # a row with no newline is never read whole
    endless.write_text(METRICS + "2025-01-01 00:05:00,BTCUSDT,1," + "9" * 200_000)
    with pytest.raises(DataFileError, match=r"endless\.csv:2: .*a line longer than 65,536"):
        read_open_interest(endless, "BTCUSDT")


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("open_time_ms,open,high,low,close\n1,1,1,1,1\n", "lacks volume"),
        ("open_time_ms,open,high,low,close,volume\n1,1,x,1,1,1\n", "malformed"),
        ("open_time_ms,open,high,low,close,volume\n", "no candles"),
        ("open_time_ms,open,high,low,close,volume\n1,1,1,0,1,1\n", "positive"),
        ("x" * 70_000, "first line is longer than"),  # no newline: never read whole
    ],
)
def test_bad_candle_files(tmp_path: Path, content: str, fragment: str) -> None:
    """Malformed candle CSVs raise DataFileError naming the file and the problem."""
    p = tmp_path / "bad.csv"
    p.write_text(content)
    with pytest.raises(DataFileError, match=fragment):
        read_candles(p)


def test_unknown_oi_format(tmp_path: Path) -> None:
    """An OI file in neither accepted format says which columns it expected."""
    p = tmp_path / "oi.csv"
    p.write_text("when,value\n1,2\n")
    with pytest.raises(DataFileError, match="time_ms,open_interest"):
        read_open_interest(p, "BTCUSDT")


@pytest.mark.filterwarnings("ignore:Payload indexes have no effect")
def test_remote_qdrant_adapter_gives_same_answers(collection: Collection) -> None:
    """The Qdrant adapter (against qdrant-client's in-memory mode) matches the embedded store."""
    from qdrant_client import QdrantClient

    from daemon.rag.store_qdrant import QdrantStore

    rows = collection.rows
    q = QdrantStore(QdrantClient(":memory:"), "trading_patterns")
    args = (
        "BTCUSDT",
        "15m",
        Bars.from_rows(rows),
        observations(collection.funding),
        observations(collection.oi),
    )
    report = ingest(q, *args, collection.cfg, batch_size=500)
    assert q.count() == collection.store.count() == report.written
    assert ingest(q, *args, collection.cfg).written == 0
    qm, em = q.meta(), collection.store.meta()
    assert qm is not None and em is not None
    assert (qm.norm_mean, qm.norm_std, qm.vectors) == (em.norm_mean, em.norm_std, em.vectors)
    pts = collection.points()
    params = params_from(
        pts[pts["complete"]][600], int(pts["t_ms"][-1]), top_k=10, min_similarity=0.5
    )
    remote = RagService(collection.cfg, q).query_patterns(params)
    local = RagService(collection.cfg, collection.store).query_patterns(params)
    assert [m["timestamp"] for m in remote["matches"]] == [m["timestamp"] for m in local["matches"]]
    assert [m["similarity"] for m in remote["matches"]] == pytest.approx(
        [m["similarity"] for m in local["matches"]], abs=1e-5
    )
    assert remote["statistics"]["outcome_4h"] == pytest.approx(local["statistics"]["outcome_4h"])
    assert not q.has_symbol("ETHUSDT")
    assert q.coverage() == collection.store.coverage()


def _exchange_series(now: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    start = (now - 20 * 24 * H) // (4 * H) * (4 * H)
    n = (now - start) // TF_MS + 1  # the last kline is still open at ``now``
    rows = synth.candles(int(n), seed=9, start=start, tf=TF_MS)
    fund = synth.funding(start - 8 * H, now)
    oi = synth.open_interest(start - 24 * H, now, step=TF_MS)
    return rows, fund, oi


async def test_fetch_history_pages_and_drops_open_kline() -> None:
    """klines/funding/OI are paged through completely; the still-open kline is dropped,
    and so is an open interest of 0 (a gap, as in a file)."""
    now = synth.T0 + 30 * 24 * H + 7 * 60_000
    rows, fund, oi = _exchange_series(now)
    oi[-3, 1] = 0.0
    fake = FakeBinance(rows, fund, oi)
    async with serve_app(fake.app()) as url:
        bars, f, o = await fetch_history(url, "BTCUSDT", "15m", int(rows[0, 0]), now, 5)
        with pytest.raises(FeedError, match=r"HTTP 400.*Invalid symbol"):
            await fetch_history(url, "XYZUSDT", "15m", int(rows[0, 0]), now, 5)
    assert np.array_equal(bars.open_ms, rows[:-1, 0].astype(np.int64))
    assert np.allclose(bars.close, rows[:-1, 4])
    assert fake.requests.count("/fapi/v1/klines") >= 2  # more than one page of 1500
    assert np.allclose(f.value, fund[fund[:, 0] >= rows[0, 0] - 24 * H, 1], atol=1e-8)
    assert fake.requests.count("/futures/data/openInterestHist") >= 4  # pages of 500
    in_range = (oi[:, 0] >= rows[0, 0] - 24 * H) & (oi[:, 0] <= now)
    assert len(o.time_ms) == int(in_range.sum()) - 1 and oi[-3, 0] not in o.time_ms


async def test_an_exchange_kline_priced_at_zero_or_without_its_time_is_refused() -> None:
    """A kline whose price is 0 or not finite, or a row with no time to page on, is a
    FeedProtocolError naming it, not a bar (nor a crash)."""
    now = synth.T0 + 30 * 24 * H + 7 * 60_000
    rows, fund, oi = _exchange_series(now)
    zero = rows.copy()
    zero[5, 3] = 0.0  # a low of 0
    async with serve_app(FakeBinance(zero, fund, oi).app()) as url:
        with pytest.raises(
            FeedProtocolError, match=r"klines: 1 not finite or priced at 0 or below; the first: \["
        ):
            await fetch_history(url, "BTCUSDT", "15m", int(rows[0, 0]), now, 5)

    async def timeless(_: web.Request) -> web.Response:
        return web.json_response([{"openTime": 1}])

    odd = web.Application()
    odd.router.add_get("/fapi/v1/klines", timeless)
    async with serve_app(odd) as url:
        with pytest.raises(FeedProtocolError, match="a row without its time"):
            await fetch_history(url, "BTCUSDT", "15m", int(rows[0, 0]), now, 5)


async def test_an_exchange_page_past_the_size_bound_is_a_feed_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A page over MAX_REST_BYTES (here 1 KiB) is not read further: a FeedError."""
    from daemon.rag import exchange

    monkeypatch.setattr(exchange, "MAX_REST_BYTES", 1024)
    now = synth.T0 + 30 * 24 * H + 7 * 60_000
    rows, fund, oi = _exchange_series(now)
    async with serve_app(FakeBinance(rows, fund, oi).app()) as url:
        with pytest.raises(FeedError, match="over 1024 bytes"):
            await fetch_history(url, "BTCUSDT", "15m", int(rows[0, 0]), now, 5)


async def test_exchange_unreachable_is_feed_error() -> None:
    """A closed port becomes a FeedError, not an aiohttp exception."""
    with pytest.raises(FeedError):
        await fetch_history("http://127.0.0.1:9", "BTCUSDT", "15m", 0, 10_000_000, 2)


def test_exchange_config_default_is_binance() -> None:
    """The documented default base URL, overridable in [rag.exchange]."""
    assert ExchangeSection().base_url == "https://fapi.binance.com"


def test_bars_must_be_the_timeframe_apart(tmp_path: Path) -> None:
    """A 15m series offered as 5m is refused with what was found and what to pass."""
    from daemon.errors import DataFileError
    from daemon.rag.config import RagConfig, StoreSection
    from daemon.rag.features import Bars
    from daemon.rag.ingest import ingest
    from daemon.rag.store_embedded import EmbeddedStore

    rows = synth.candles(300, tf=TF_MS)
    store = EmbeddedStore(str(tmp_path), "trading_patterns")
    cfg = RagConfig(store=StoreSection(path=str(tmp_path)))
    with pytest.raises(DataFileError) as info:
        ingest(store, "BTCUSDT", "5m", Bars.from_rows(rows), None, None, cfg)
    assert str(info.value) == (
        "the bars are 15m apart (the median spacing), not 5m: pass --timeframe 15m"
    )
