"""Sans-I/O tests of the Coinbase Advanced Trade parser and subscription state."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from daemon.backoff import backoff_delays
from daemon.errors import FeedProtocolError
from feeds.coinbase_ws.protocol import (
    CounterTracker,
    ErrorFrame,
    HeartbeatFrame,
    OtherFrame,
    SubscriptionBook,
    SubscriptionsFrame,
    TickerFrame,
    diff,
    parse_frame,
    parse_number,
    subscribe_message,
    unsubscribe_message,
)

TWO_EVENTS = (
    b'{"channel":"ticker","client_id":"","timestamp":"2026-03-04T05:06:07.891234567Z",'
    b'"sequence_num":41,"events":['
    b'{"type":"snapshot","tickers":[{"type":"ticker","product_id":"AAA-USD","price":"101.5",'
    b'"volume_24_h":"12.25","low_24_h":"99","high_24_h":"102","low_52_w":"50","high_52_w":"150",'
    b'"price_percent_chg_24_h":"-1.75","best_bid":"101.4","best_ask":"101.6",'
    b'"best_bid_quantity":"0.5","best_ask_quantity":"0.25"},'
    b'{"type":"ticker","product_id":"BBB-USD","price":"7","volume_24_h":""}]},'
    b'{"type":"update","tickers":[{"type":"ticker","product_id":"AAA-USD","price":"101.75"}]}]}'
)


def test_ticker_frame_flattens_events_and_tickers_in_order() -> None:
    """Several events with several tickers come out as one ordered, indexed list."""
    frame = parse_frame(TWO_EVENTS)
    assert isinstance(frame, TickerFrame)
    assert frame.sequence_num == 41
    assert frame.timestamp == "2026-03-04T05:06:07.891234567Z"
    assert frame.ts_ms == 1772600767891
    assert [(t.product_id, t.event_type, t.index, t.price) for t in frame.tickers] == [
        ("AAA-USD", "snapshot", 0, 101.5),
        ("BBB-USD", "snapshot", 1, 7.0),
        ("AAA-USD", "update", 2, 101.75),
    ]


def test_ticker_fields_map_to_camel_case_payload() -> None:
    """String numbers become floats under the payload names; "" and absent are None."""
    frame = parse_frame(TWO_EVENTS.decode())
    assert isinstance(frame, TickerFrame)
    assert frame.tickers[0].payload_fields() == {
        "price": 101.5,
        "volume24h": 12.25,
        "percentChange24h": -1.75,
        "high24h": 102.0,
        "low24h": 99.0,
        "low52w": 50.0,
        "high52w": 150.0,
        "bestBid": 101.4,
        "bestAsk": 101.6,
        "bestBidQuantity": 0.5,
        "bestAskQuantity": 0.25,
    }
    second = frame.tickers[1].payload_fields()
    assert second["price"] == 7.0
    assert second["volume24h"] is None
    assert second["bestBid"] is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("65086.18", 65086.18),
        ("126296", 126296.0),
        (" -0.5 ", -0.5),
        ("", None),
        ("abc", None),
        ("NaN", None),
        ("Infinity", None),
        ("1e999", None),
        (None, None),
        (3, 3.0),
        (True, None),
    ],
)
def test_parse_number(text: str | int | None, expected: float | None) -> None:
    """Wire numbers parse through Decimal; empty, garbage and non-finite are None."""
    assert parse_number(text) == expected


def test_tickers_without_product_or_price_are_skipped_and_counted() -> None:
    """All-empty tickers (seen from Coinbase) are not delivered but counted; so is a
    price of zero or less (no trade is at it), or a product id with a control
    character."""
    frame = parse_frame(
        '{"channel":"ticker","timestamp":"2026-03-04T05:06:07Z","sequence_num":1,"events":'
        '[{"type":"update","tickers":[{"product_id":"","price":""},'
        '{"product_id":"AAA-USD","price":""},{"product_id":"AAA-USD","price":"2"},'
        '{"product_id":"AAA-USD","price":"0"},{"product_id":"AAA-USD","price":"-5"},'
        '{"product_id":"AAA-USD","price":"-0.0"},{"product_id":"A\\u001b[2J","price":"2"}]}]}'
    )
    assert isinstance(frame, TickerFrame)
    assert frame.skipped == 6
    assert [(t.index, t.price) for t in frame.tickers] == [(2, 2.0)]


def test_error_frame_without_channel() -> None:
    """The flat error frame has no channel and is returned as ErrorFrame."""
    frame = parse_frame(b'{"type":"error","message":"failure to subscribe"}')
    assert frame == ErrorFrame(message="failure to subscribe")


def test_heartbeats_counter_is_a_string_and_events_have_no_type() -> None:
    """Heartbeat events carry a string counter and a Go-style time string."""
    frame = parse_frame(
        '{"channel":"heartbeats","client_id":"","timestamp":"2026-03-04T05:06:07.1Z",'
        '"sequence_num":9,"events":[{"current_time":"2026-03-04 05:06:07.1 +0000 UTC m=+1.2",'
        '"heartbeat_counter":"3049"},{"heartbeat_counter":"oops"}]}'
    )
    assert frame == HeartbeatFrame(sequence_num=9, counters=(3049,))


def test_subscriptions_ack() -> None:
    """A subscriptions message reports what the connection is subscribed to."""
    frame = parse_frame(
        '{"channel":"subscriptions","client_id":"","timestamp":"2026-03-04T05:06:07Z",'
        '"sequence_num":2,"events":[{"subscriptions":{"ticker":["AAA-USD"],'
        '"heartbeats":["heartbeats"]}}]}'
    )
    assert isinstance(frame, SubscriptionsFrame)
    assert frame.subscriptions == {"ticker": ["AAA-USD"], "heartbeats": ["heartbeats"]}
    assert frame.sequence_num == 2


def test_unknown_channel_is_other_frame() -> None:
    """Channels we do not handle parse as OtherFrame and keep their sequence_num."""
    frame = parse_frame('{"channel":"status","sequence_num":5,"events":[{"type":"snapshot"}]}')
    assert frame == OtherFrame(channel="status", sequence_num=5)


@pytest.mark.parametrize(
    "data",
    [
        b"{not json",
        b"\xff\xfe",
        b"[1, 2]",
        b'"ticker"',
        b'{"channel":"ticker","events":"nope"}',
        b'{"channel":"ticker","sequence_num":"7","events":[]}',
        b'{"channel":"ticker","events":[{"type":"update","tickers":[{"product_id":5}]}]}',
        b'{"channel":"ticker","timestamp":"yesterday","events":[]}',
        b'{"channel":"heartbeats","events":[{"heartbeat_counter":[1]}]}',
        b'{"type":"subscribe"}',
        b'{"channel":7}',
    ],
)
def test_malformed_frames_raise_protocol_error(data: bytes) -> None:
    """Anything that is not the documented shape is a FeedProtocolError, nothing else."""
    with pytest.raises(FeedProtocolError):
        parse_frame(data)


def test_control_messages_carry_one_channel_each() -> None:
    """Subscribe/unsubscribe frames name one channel and a sorted product list."""
    assert json.loads(subscribe_message("ticker", ["ETH-USD", "BTC-USD"])) == {
        "type": "subscribe",
        "product_ids": ["BTC-USD", "ETH-USD"],
        "channel": "ticker",
    }
    assert json.loads(subscribe_message("heartbeats", [])) == {
        "type": "subscribe",
        "product_ids": [],
        "channel": "heartbeats",
    }
    assert json.loads(unsubscribe_message("ticker", ["ETH-USD"]))["type"] == "unsubscribe"


def test_diff_moves_wire_to_wanted() -> None:
    """diff returns only what must be added and what must be removed."""
    assert diff({"A", "B"}, {"B", "C"}) == (["A"], ["C"])
    assert diff({"A"}, {"A"}) == ([], [])


def test_book_refcounts_products_across_subscribers() -> None:
    """A product is new on its first holder and gone only when its last holder leaves."""
    book: SubscriptionBook[str] = SubscriptionBook()
    assert book.add("a", ["BTC-USD"]) == ["BTC-USD"]
    assert book.add("b", ["BTC-USD", "ETH-USD"]) == ["ETH-USD"]
    assert book.refcount("BTC-USD") == 2
    assert book.holders("BTC-USD") == {"a", "b"}
    assert book.remove("b") == ["ETH-USD"]
    assert book.wanted() == {"BTC-USD"}
    assert book.remove("a") == ["BTC-USD"]
    assert book.remove("a") == []
    assert len(book) == 0
    with pytest.raises(ValueError, match="already"):
        book.add("c", ["X-Y"])
        book.add("c", ["X-Y"])


def test_counter_tracker_counts_jumps_not_repeats() -> None:
    """A jump > 1 is a gap; equal or smaller values are ignored."""
    tracker = CounterTracker()
    assert [tracker.observe(v) for v in (0, 1, 2, 5, 5, 3, 6, 10)] == [0, 0, 0, 2, 0, 0, 0, 3]
    assert (tracker.gaps, tracker.missed) == (2, 5)


def test_backoff_doubles_up_to_the_cap_with_full_jitter() -> None:
    """With jitter factor 1 the caps double and saturate; real jitter stays in [0, cap]."""
    assert list(itertools.islice(backoff_delays(1.0, 10.0, lambda: 1.0), 6)) == [
        1.0,
        2.0,
        4.0,
        8.0,
        10.0,
        10.0,
    ]
    rng = random.Random(7)
    delays = list(itertools.islice(backoff_delays(0.5, 4.0, rng.random), 2000))
    caps = [min(4.0, 0.5 * 2 ** min(i, 10)) for i in range(2000)]
    assert all(0.0 <= d <= c for d, c in zip(delays, caps, strict=True))
    assert len(set(delays)) > 1900
    assert max(delays[100:]) > 3.0 and min(delays[100:]) < 1.0
    with pytest.raises(ValueError):
        next(backoff_delays(0.0, 1.0))
