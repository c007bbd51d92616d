"""The state cache: ring buffers, dedup, ticks, forming candles and export."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import msgspec
import pytest

from daemon import events
from daemon.config import StateSection
from daemon.errors import StoreError
from daemon.events import FeedEvent, iso_ms
from daemon.state import StateCache, read_snapshot, write_snapshot
from tests.test_indicators import atr_ref, ema_ref, ohlc_series, rsi_ref

STEP = 300_000  # 5m
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def candle_payload(
    i: int, o: float, h: float, lo: float, c: float, v: float = 1.0
) -> dict[str, Any]:
    open_ms = T0 + i * STEP
    return {
        "open": o,
        "high": h,
        "low": lo,
        "close": c,
        "volume": v,
        "openTimeMs": open_ms,
        "closeTimeMs": open_ms + STEP,
        "openTime": iso_ms(open_ms),
        "closeTime": iso_ms(open_ms + STEP),
    }


def candle_event(
    payload: dict[str, Any],
    symbol: str | None = "BTC-USD",
    timeframe: str | None = "5m",
    topic: str = events.MARKET_CANDLE_CLOSED,
) -> FeedEvent:
    return FeedEvent(
        event_id=f"test:{symbol}:{timeframe}:{payload.get('closeTimeMs')}",
        ts=iso_ms(T0),
        source="test",
        topic=topic,
        payload=payload,
        symbol=symbol,
        timeframe=timeframe,
    )


def tick_event(product: str | None, price: str, ts_ms: int, **extra: Any) -> FeedEvent:
    return FeedEvent(
        event_id=f"tick:{product}:{ts_ms}",
        ts=iso_ms(ts_ms),
        source="test",
        topic=events.MARKET_PRICE_TICK,
        payload={"price": price, **extra},
        symbol=product,
    )


OPENS, HIGHS, LOWS, CLOSES = ohlc_series(300, seed=11)


def feed(cache: StateCache, n: int, symbol: str = "BTC-USD", tf: str = "5m") -> None:
    for i in range(n):
        p = candle_payload(i, OPENS[i], HIGHS[i], LOWS[i], CLOSES[i])
        assert cache.apply(candle_event(p, symbol, tf))


def assert_plain(value: Any) -> None:
    """Only JSON types: dict with str keys, list, str, int, float, bool, None."""
    if isinstance(value, dict):
        for k, v in value.items():
            assert type(k) is str
            assert_plain(v)
    elif isinstance(value, list):
        for v in value:
            assert_plain(v)
    else:
        assert value is None or type(value) in (str, int, float, bool), type(value)


def test_closed_candles_drive_indicators_to_reference_values() -> None:
    """Indicators exported after 300 closes equal full recomputations."""
    cache = StateCache()
    feed(cache, 300)
    ind = cache.export()["indicators"]["BTC-USD"]["5m"]
    refs = {
        "ema20": ema_ref(CLOSES, 20)[-1],
        "ema50": ema_ref(CLOSES, 50)[-1],
        "ema200": ema_ref(CLOSES, 200)[-1],
        "rsi14": rsi_ref(CLOSES, 14)[-1],
        "atr14": atr_ref(HIGHS, LOWS, CLOSES, 14)[-1],
    }
    for key, ref in refs.items():
        assert ref is not None and math.isclose(ind[key], ref, rel_tol=1e-9), key
    assert ind["count"] == 300


def test_ring_buffer_keeps_only_the_newest_candles_in_order() -> None:
    """The buffer is bounded by max_candles and lists oldest to newest."""
    cache = StateCache(max_candles=10)
    feed(cache, 25)
    got = cache.export(candles=None)["candles"]["BTC-USD"]["5m"]
    assert [c["closeTimeMs"] for c in got] == [T0 + (i + 1) * STEP for i in range(15, 25)]
    assert got[-1]["close"] == CLOSES[24] and got[-1]["closeTime"] == iso_ms(T0 + 25 * STEP)
    assert cache.statistics()["candles_held"] == 10
    assert cache.statistics()["closed"] == 25


def test_an_encoded_export_is_the_msgpack_of_the_same_window() -> None:
    """Sandbox requests take each candle's msgpack, encoded once per close: the bytes
    are what encoding the plain export gives, window for window."""
    cache = StateCache(max_candles=10)
    feed(cache, 25)
    for n in (None, 0, 3, 10, 50):
        plain = cache.export(candles=n)
        encoded = cache.export(candles=n, encoded=True)
        assert all(type(c) is msgspec.Raw for c in encoded["candles"]["BTC-USD"]["5m"])
        assert msgspec.msgpack.encode(encoded) == msgspec.msgpack.encode(plain)


def test_from_config_uses_max_candles() -> None:
    """StateSection.max_candles sizes every series' buffer."""
    cache = StateCache.from_config(StateSection(max_candles=3))
    feed(cache, 8)
    assert len(cache.export(candles=None)["candles"]["BTC-USD"]["5m"]) == 3


def test_duplicate_and_out_of_order_closes_are_ignored_and_counted() -> None:
    """Re-emitted or older closes change neither candles nor indicators."""
    cache = StateCache()
    feed(cache, 40)
    before = cache.export(candles=None)
    dup = candle_payload(39, 1.0, 2.0, 0.5, 1.5)
    old = candle_payload(10, 1.0, 2.0, 0.5, 1.5)
    assert not cache.apply(candle_event(dup))
    assert not cache.apply(candle_event(old))
    assert not cache.apply(candle_event(dup))
    assert cache.export(candles=None) == before
    stats = cache.statistics()
    assert stats["duplicates_ignored"] == 2 and stats["out_of_order_ignored"] == 1
    assert stats["closed"] == 40


def test_gap_in_closes_is_counted_but_accepted() -> None:
    """A missing candle is counted as a gap; the later close is still taken."""
    cache = StateCache()
    cache.apply(candle_event(candle_payload(0, 1, 2, 0.5, 1.5)))
    assert cache.apply(candle_event(candle_payload(3, 1, 2, 0.5, 1.6)))
    assert cache.statistics()["gaps"] == 1
    assert cache.export()["candles"]["BTC-USD"]["5m"][-1]["close"] == 1.6


@pytest.mark.parametrize(
    ("payload", "symbol", "timeframe"),
    [
        ({"open": 1.0}, "BTC-USD", "5m"),
        ({**candle_payload(0, 1, 2, 0.5, 1.5), "close": math.nan}, "BTC-USD", "5m"),
        ({**candle_payload(0, 1, 2, 0.5, 1.5), "high": math.inf}, "BTC-USD", "5m"),
        ({**candle_payload(0, 1, 2, 0.5, 1.5), "close": "1.5"}, "BTC-USD", "5m"),
        ({**candle_payload(0, 1, 2, 0.5, 1.5), "closeTimeMs": "x"}, "BTC-USD", "5m"),
        (candle_payload(0, 1, 2, 0.5, 1.5), None, "5m"),
        (candle_payload(0, 1, 2, 0.5, 1.5), "BTC-USD", None),
    ],
)
def test_malformed_candles_are_counted_not_raised(
    payload: dict[str, Any], symbol: str | None, timeframe: str | None
) -> None:
    """Bad fields, non-finite numbers or a missing symbol never reach the indicators."""
    cache = StateCache()
    assert not cache.apply(candle_event(payload, symbol, timeframe))
    assert cache.statistics()["malformed"] == 1
    assert cache.export()["indicators"] == {}


def test_candle_without_iso_times_gets_them_from_ms() -> None:
    """openTime/closeTime are filled from the ms fields when a feed omits them."""
    payload = candle_payload(0, 1, 2, 0.5, 1.5)
    del payload["openTime"], payload["closeTime"]
    cache = StateCache()
    cache.apply(candle_event(payload))
    c = cache.export()["candles"]["BTC-USD"]["5m"][0]
    assert (c["openTime"], c["closeTime"]) == (iso_ms(T0), iso_ms(T0 + STEP))


def test_series_are_separate_per_symbol_and_timeframe() -> None:
    """The same close time on another symbol or timeframe is not a duplicate."""
    cache = StateCache()
    feed(cache, 5, "BTC-USD", "5m")
    feed(cache, 5, "ETH-USD", "5m")
    feed(cache, 5, "BTC-USD", "1h")
    stats = cache.statistics()
    assert stats["series"] == 3 and stats["candles_held"] == 15
    assert stats["duplicates_ignored"] == 0


def test_last_tick_is_kept_per_product_with_ts() -> None:
    """Each product keeps its latest tick payload as-is plus the event ts."""
    cache = StateCache()
    cache.apply(tick_event("BTC-USD", "100.0", T0, volume_24_h="5"))
    cache.apply(tick_event("ETH-USD", "10.0", T0 + 1))
    cache.apply(tick_event("BTC-USD", "101.5", T0 + 2, volume_24_h="6"))
    cache.apply(tick_event(None, "0.5", T0 + 3, productId="SOL-USD"))
    ticks = cache.export()["ticks"]
    assert ticks["BTC-USD"] == {"price": "101.5", "volume_24_h": "6", "ts": iso_ms(T0 + 2)}
    assert ticks["ETH-USD"]["price"] == "10.0" and ticks["SOL-USD"]["price"] == "0.5"
    assert cache.statistics()["products"] == 3 and cache.statistics()["ticks"] == 4


def test_tick_event_payload_is_not_mutated() -> None:
    """Adding ts to the stored tick must not touch the event other subscribers see."""
    cache = StateCache()
    ev = tick_event("BTC-USD", "100", T0)
    cache.apply(ev)
    assert ev.payload == {"price": "100"}


def test_tick_without_product_is_malformed() -> None:
    """A tick naming no product is counted, not stored."""
    cache = StateCache()
    assert not cache.apply(tick_event(None, "1", T0))
    assert cache.statistics()["malformed"] == 1 and cache.export()["ticks"] == {}


def test_forming_candle_is_tracked_and_cleared_on_close() -> None:
    """Updated candles show as forming, stay out of indicators, vanish on close."""
    cache = StateCache()
    feed(cache, 3)
    forming = candle_payload(3, 1, 2, 0.5, 1.7)
    assert cache.apply(candle_event(forming, topic=events.MARKET_CANDLE_UPDATED))
    snap = cache.export()
    assert snap["forming"]["BTC-USD"]["5m"]["close"] == 1.7
    assert snap["indicators"]["BTC-USD"]["5m"]["count"] == 3
    assert cache.apply(candle_event({**forming, "close": 1.8}))
    assert cache.export()["forming"] == {}
    late = candle_event(forming, topic=events.MARKET_CANDLE_UPDATED)
    assert not cache.apply(late)  # an update for a candle that already closed
    assert cache.export()["forming"] == {}


def test_other_topics_are_ignored() -> None:
    """Events the cache does not track leave it unchanged."""
    cache = StateCache()
    ev = FeedEvent(event_id="n", ts=iso_ms(T0), source="x", topic=events.NEWS_HEADLINE, payload={})
    assert not cache.apply(ev)
    assert cache.statistics()["malformed"] == 0
    assert cache.export() == {"candles": {}, "forming": {}, "indicators": {}, "ticks": {}}


def test_export_filters_by_symbol_and_timeframe_and_limits_candles() -> None:
    """symbols, timeframes and candles=N narrow the export."""
    cache = StateCache()
    feed(cache, 60, "BTC-USD", "5m")
    feed(cache, 60, "BTC-USD", "1h")
    feed(cache, 60, "ETH-USD", "5m")
    cache.apply(tick_event("ETH-USD", "10", T0))
    snap = cache.export(["BTC-USD"], timeframes=["1h"], candles=5)
    assert list(snap["candles"]) == ["BTC-USD"] and list(snap["candles"]["BTC-USD"]) == ["1h"]
    got = [c["closeTimeMs"] for c in snap["candles"]["BTC-USD"]["1h"]]
    assert got == [T0 + (i + 1) * STEP for i in range(55, 60)]
    assert snap["ticks"] == {}
    assert cache.export("ETH-USD", candles=0)["candles"] == {"ETH-USD": {"5m": []}}
    assert list(cache.export("ETH-USD")["ticks"]) == ["ETH-USD"]
    assert len(cache.export()["candles"]["BTC-USD"]["5m"]) == 50  # the default
    assert len(cache.export(candles=None)["candles"]["BTC-USD"]["5m"]) == 60


def test_export_round_trips_through_json_with_plain_types_only() -> None:
    """The export is JSON-serialisable and made only of plain types."""
    cache = StateCache()
    feed(cache, 60)
    cache.apply(tick_event("BTC-USD", "100", T0))
    cache.apply(
        candle_event(candle_payload(60, 1, 2, 0.5, 1.5), topic=events.MARKET_CANDLE_UPDATED)
    )
    snap = cache.export()
    assert_plain(snap)
    assert msgspec.json.decode(msgspec.json.encode(snap)) == snap
    assert set(snap["candles"]["BTC-USD"]["5m"][0]) == {
        "open",
        "high",
        "low",
        "close",
        "volume",
        "openTime",
        "closeTime",
        "openTimeMs",
        "closeTimeMs",
    }


def test_export_is_a_copy() -> None:
    """Mutating an export does not change the cache (hooks get a read-only view)."""
    cache = StateCache()
    feed(cache, 30)
    cache.apply(tick_event("BTC-USD", "100", T0))
    snap = cache.export()
    snap["candles"]["BTC-USD"]["5m"][0]["close"] = -1.0
    snap["indicators"]["BTC-USD"]["5m"]["macd"]["macd"] = -1.0
    snap["ticks"]["BTC-USD"]["price"] = "0"
    fresh = cache.export()
    assert fresh["candles"]["BTC-USD"]["5m"][0]["close"] != -1.0
    assert fresh["indicators"]["BTC-USD"]["5m"]["macd"]["macd"] != -1.0
    assert fresh["ticks"]["BTC-USD"]["price"] == "100"


def test_series_and_product_counts_are_bounded() -> None:
    """New series or products beyond the limits are dropped and counted."""
    cache = StateCache(max_series=2, max_products=1)
    feed(cache, 1, "A", "5m")
    feed(cache, 1, "B", "5m")
    assert not cache.apply(candle_event(candle_payload(0, 1, 2, 0.5, 1.5), "C", "5m"))
    assert cache.apply(tick_event("A", "1", T0))
    assert not cache.apply(tick_event("B", "1", T0))
    stats = cache.statistics()
    assert stats["series"] == 2 and stats["products"] == 1 and stats["dropped_over_limit"] == 2


def test_max_candles_must_be_positive() -> None:
    """A zero-size buffer is a configuration mistake, reported at construction."""
    with pytest.raises(ValueError, match="max_candles"):
        StateCache(max_candles=0)


def test_seed_primes_indicators_and_live_overlap_is_a_duplicate() -> None:
    """History seeded at startup warms the indicators; an overlapping live close is ignored."""
    cache = StateCache()
    history = [candle_payload(i, OPENS[i], HIGHS[i], LOWS[i], CLOSES[i]) for i in range(250)]
    assert cache.seed("BTC-USD", "5m", history) == 250
    ema200 = ema_ref(CLOSES[:250], 200)[-1]
    assert ema200 is not None
    assert math.isclose(
        cache.export()["indicators"]["BTC-USD"]["5m"]["ema200"], ema200, rel_tol=1e-9
    )
    assert not cache.apply(candle_event(history[-1]))
    nxt = candle_payload(250, OPENS[250], HIGHS[250], LOWS[250], CLOSES[250])
    assert cache.apply(candle_event(nxt))
    assert cache.statistics()["duplicates_ignored"] == 1


def test_dump_and_load_carry_candles_and_indicators_across_a_restart() -> None:
    """A new cache loaded from a dump exports the same candles and indicators."""
    before = StateCache()
    feed(before, 300)
    feed(before, 40, "ETH-USD", "1h")
    after = StateCache()
    assert after.load(before.dump()) == 340
    assert after.export(candles=None)["candles"] == before.export(candles=None)["candles"]
    assert after.export()["indicators"] == before.export()["indicators"]


def test_load_of_a_bounded_buffer_rebuilds_indicators_from_what_was_kept() -> None:
    """With fewer candles kept than seen, indicators restart from the kept window."""
    before = StateCache(max_candles=60)
    feed(before, 300)
    after = StateCache(max_candles=60)
    after.load(before.dump())
    ind = after.export()["indicators"]["BTC-USD"]["5m"]
    ema20 = ema_ref(CLOSES[240:300], 20)[-1]
    assert ind["count"] == 60 and ema20 is not None
    assert math.isclose(ind["ema20"], ema20, rel_tol=1e-9) and ind["ema200"] is None


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"not json", "not readable"),
        (b'{"version": 1, "series": [{"symbol": 3}]}', "not readable"),
        (b'{"version": 99, "series": []}', "version 99, expected 1"),
    ],
)
def test_load_rejects_an_unreadable_snapshot(data: bytes, message: str) -> None:
    """A corrupt or foreign snapshot raises StoreError and leaves the cache empty."""
    cache = StateCache()
    with pytest.raises(StoreError, match=message):
        cache.load(data)
    assert cache.statistics()["series"] == 0


def test_snapshot_file_round_trip_is_atomic(tmp_path: Path) -> None:
    """write_snapshot leaves only the final file; read_snapshot of a missing file is None."""
    path = tmp_path / "state.json"
    assert read_snapshot(path) is None
    cache = StateCache()
    feed(cache, 5)
    write_snapshot(path, cache.dump())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]
    data = read_snapshot(path)
    assert data is not None and StateCache().load(data) == 5
    with pytest.raises(StoreError, match="cannot write state snapshot"):
        write_snapshot(tmp_path / "missing-dir" / "state.json", b"{}")
