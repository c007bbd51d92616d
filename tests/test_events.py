"""The envelope, topic patterns and the import name."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec
import pytest

import daemon
from daemon import events

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def test_daemon_import_name_is_this_project() -> None:
    """`daemon` must resolve to our package, not python-daemon."""
    root = Path(__file__).resolve().parent.parent
    assert Path(daemon.__file__).resolve().parent == root / "daemon"


def test_feedevent_wire_is_camel_case_and_omits_unset() -> None:
    """Optional fields vanish from the wire; names are camelCase."""
    ev = events.FeedEvent(
        event_id="e1",
        ts="2026-02-17T03:05:00.000Z",
        source="test",
        topic=events.MARKET_CANDLE_CLOSED,
        payload={"close": 1.5},
        partition_key="p",
    )
    wire = events.encode(ev)
    assert b'"eventId":"e1"' in wire and b'"partitionKey":"p"' in wire
    assert b"symbol" not in wire
    assert events.decode(wire) == ev


@pytest.mark.parametrize(
    ("pattern", "topic", "ok"),
    [
        ("market.candle.*", "market.candle.closed", True),
        ("market.candle.*", "market.candle", False),
        ("market.>", "market.candle.closed", True),
        ("market.>", "market", False),
        ("market.price.tick", "market.price.tick", True),
        ("*.order.*", "account.order.filled", True),
        ("account.*", "account.order.filled", False),
    ],
)
def test_topic_matches(pattern: str, topic: str, ok: bool) -> None:
    """NATS-style wildcards: * is one token, > is the rest (at least one)."""
    assert events.topic_matches(pattern, topic) is ok


@pytest.mark.parametrize("bad", ["", "a..b", "a.>.b", "a.b*"])
def test_validate_pattern_rejects(bad: str) -> None:
    """Malformed patterns are rejected up front."""
    with pytest.raises(ValueError, match="pattern"):
        events.validate_pattern(bad)


def test_iso_round_trip_and_nanoseconds() -> None:
    """Coinbase sends nanosecond timestamps; we keep milliseconds."""
    assert events.iso_ms(1_700_000_000_123) == "2023-11-14T22:13:20.123Z"
    assert events.parse_iso_ms("2023-11-14T22:13:20.123456789Z") == 1_700_000_000_123
    assert events.parse_iso_ms("2023-11-14T22:13:20Z") == 1_700_000_000_000


def test_our_times_parse_back_exactly_and_bad_ones_are_refused() -> None:
    """``iso_ms`` and ``parse_iso_ms`` are exact inverses (no float rounding: the old
    path read some times 1 ms short); the fast path refuses what the slow one does."""
    import random

    rng = random.Random(5)
    for ms in [
        0,
        1,
        999,
        253_402_300_799_999,
        *(rng.randrange(-(10**12), 4 * 10**12) for _ in range(5000)),
    ]:
        assert events.parse_iso_ms.__wrapped__(events.iso_ms(ms)) == ms
        as_datetime = EPOCH + timedelta(milliseconds=ms)
        assert events.iso_ms(ms) == as_datetime.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"
    assert events.parse_iso_ms("2024-01-01T00:00:00.000+01:00") == 1_704_063_600_000
    for bad in (
        "2024-01-01T24:00:00.000Z",
        "2024-02-30T00:00:00.000Z",
        "2024-01-01T00:00:60.000Z",
        "2024-01-01T0\u0663:00:00.000Z",  # a non-ASCII digit
        "2024-01-01T+1:00:00.000Z",
        "2024/01/01T00:00:00.000Z",
    ):
        with pytest.raises(ValueError):
            events.parse_iso_ms(bad)


def test_a_candle_event_ids_close_time_is_read_back() -> None:
    """`why` narrows its search by the close time a candle's id names; any other id
    (a tick's, a signal's, a trace's, lookalikes) names none."""
    from feeds.candles.protocol import updated_event

    closed = events.candle_event_id("binance", "BTC-USD", "5m", 1_771_297_500_000)
    assert events.candle_close_of(closed) == 1_771_297_500_000
    candle = events.Candle(
        open_time_ms=1_771_297_200_000, close_time_ms=1_771_297_500_000,
        open=1.0, high=2.0, low=0.5, close=1.5, volume=3.0,
    )  # fmt: skip
    updated = updated_event(candle, source="binance", symbol="BTC-USD", timeframe="5m",
                            received_ms=1_771_297_400_000)  # fmt: skip
    assert events.candle_close_of(updated.event_id) == 1_771_297_500_000
    for other in (
        "coinbase:tick:BTC-USD:2026-02-17T03:05:00.123456Z:7:0",
        "leader:abc:signal-1",
        "0123456789abcdef",
        "a:b:5m:１２３",  # digits, not ASCII ones
        "a:b:5m:1234567890123456",  # past the year 9999
        "a:b:5m:12:closed:ff",
        "copytrade:leader:x:1771297500000",  # a signal id holding a colon
        "copytrade:leader:5m:1771297500001",  # ... shaped as a 5m candle, off its boundary
        "",
    ):
        assert events.candle_close_of(other) is None, other


def test_candle_event_id_is_stable() -> None:
    """The same candle always gets the same id; trace ids are deterministic."""
    a = events.candle_event_id("coinbase", "BTC-USD", "5m", 1)
    assert a == events.candle_event_id("coinbase", "BTC-USD", "5m", 1)
    assert events.trace_id_for(a) == events.trace_id_for(a)
    assert events.trace_id_for(a) != events.trace_id_for(a + "x")


def test_one_candle_type_round_trips_through_its_payload() -> None:
    """The poller's, the state cache's and the broker's candle is one Struct: its
    payload parses back to itself; malformed payloads parse to None."""
    from daemon.events import Candle, candle_of

    c = Candle(open=1, high=2, low=0.5, close=1.5, volume=3,
               open_time_ms=1_700_000_000_000, close_time_ms=1_700_000_300_000)  # fmt: skip
    payload = c.payload()
    assert payload["closeTime"] == "2023-11-14T22:18:20.000Z"
    assert candle_of(payload) == c and c.consistent
    assert not Candle(**{**msgspec.structs.asdict(c), "high": 1.0}).consistent
    for bad in ({**payload, "close": float("nan")}, {**payload, "closeTimeMs": 10**18},
                {**payload, "open": "1"}, [payload], {"open": 1}):  # fmt: skip
        assert candle_of(bad) is None, bad


def test_tick_payload_names_are_the_coinbase_feed_names() -> None:
    """TickPayload and the Coinbase feed's payload agree field for field."""
    from daemon.events import TickPayload, tick_of
    from feeds.coinbase_ws.protocol import TICKER_FIELDS

    names = [f.encode_name for f in msgspec.structs.fields(TickPayload)]
    assert names == [name for _, name in TICKER_FIELDS] + ["staleAfterReconnect"]
    tick = tick_of({"price": 101.5, "bestBid": None, "staleAfterReconnect": True})
    assert tick is not None and tick.price == 101.5 and tick.stale_after_reconnect
    assert [tick_of(p) for p in ({"price": 0}, {"price": "1"}, {}, None)] == [None] * 4


def test_a_payload_is_parsed_once_and_an_equal_one_again() -> None:
    """candle_of remembers payload objects (the service, the broker and each agent's
    caches ask about the same one); an equal but other dict is parsed on its own,
    and the memo holds no more than its size."""
    from daemon.events import IdentityMemo

    calls: list[object] = []

    def parse(x: dict[str, int]) -> int:
        calls.append(x)
        return x["n"] * 2

    memo = IdentityMemo(parse, 2)
    a, b, c = {"n": 1}, {"n": 1}, {"n": 3}
    assert (memo(a), memo(a), memo(b)) == (2, 2, 2)
    assert calls == [a, b]
    assert memo(c) == 6 and memo(a) == 2  # a was the oldest: forgotten, parsed again
    assert len(calls) == 4
    payload = events.Candle(
        open=1.0, high=2.0, low=0.5, close=1.5, volume=3.0,
        open_time_ms=0, close_time_ms=300_000,
    ).payload()  # fmt: skip
    assert events.candle_of(payload) is events.candle_of(payload)
    assert events.candle_of(dict(payload)) == events.candle_of(payload)
