"""Recorded Coinbase Advanced Trade messages replay as the ticks the live feed published."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import anyio
import click
import msgspec
import pytest

from daemon.errors import FeedProtocolError, ReplayError
from daemon.events import FeedEvent, iso_ms, parse_iso_ms
from feeds.base import FeedHealth
from feeds.candles.protocol import closed_event, parse_candles
from feeds.coinbase_ws.feed import CoinbaseWsFeed
from feeds.coinbase_ws.recording import Recording, is_coinbase_message, parse_recorded
from feeds.config import ReplaySection
from tests.coinbase_fake import TS, WAIT, fake_server, ticker
from tests.feeds.test_coinbase_ws_pool import settings
from tests.feeds.test_replay import feed_for, recording, replay, write_jsonl


def message(seq: int, *prices: tuple[str, str], ts: str = TS, kind: str = "update") -> str:
    tickers = [ticker(p, price) for p, price in prices]
    events = [{"type": kind, "tickers": tickers}]
    body = {"channel": "ticker", "timestamp": ts, "sequence_num": seq, "events": events}
    return json.dumps(body)


def without_receive_time(events: list[FeedEvent]) -> list[FeedEvent]:
    return [msgspec.structs.replace(e, received_ts=None) for e in events]


async def test_a_recording_of_the_wire_replays_as_the_live_feed_published_it(
    tmp_path: Path,
) -> None:
    """Ticks taken live from a loopback Coinbase, then its messages replayed from a file:
    the same events (ids, times, payloads), the heartbeats and acks left out."""
    live: list[FeedEvent] = []
    async with fake_server() as (fake, url):
        feed = CoinbaseWsFeed(settings(url, ["BTC-USD", "ETH-USD"]))
        send, receive = anyio.create_memory_object_stream[FeedEvent](100)
        async with send, receive, anyio.create_task_group() as tg:
            with anyio.fail_after(WAIT):
                await tg.start(feed.run, send.send, FeedHealth("coinbase_ws"))
                await fake.wait_for(lambda: len(fake.sent_by(0)) == 2)
                await fake.heartbeat(0, 7)
                await fake.update(0, ("BTC-USD", "65001.5"), ("ETH-USD", "1900.25"))
                await fake.update(0, ("BTC-USD", "65002"))
                while len(live) < 5:  # the snapshot's two, then three updates
                    live.append(await receive.receive())
            tg.cancel_scope.cancel()
    path = tmp_path / "coinbase.jsonl"
    path.write_text("".join(f + "\n" for f in fake.frames))
    replayed_feed = feed_for(path)
    assert replayed_feed.format() == "coinbase"
    replayed, _ = await replay(replayed_feed)
    assert without_receive_time(replayed) == without_receive_time(live)
    assert [e.symbol for e in replayed] == ["BTC-USD", "ETH-USD", "BTC-USD", "ETH-USD", "BTC-USD"]
    # two subscription acks and the heartbeat carry no tick
    assert replayed_feed.statistics()["other_messages_left_out"] == 3
    assert all(e.received_ts == e.ts for e in replayed)  # no receive time recorded


def test_a_wrapped_line_keeps_its_receive_time() -> None:
    """``{"recv_ts", "raw"}`` lines (cryptofeed-style) give the same tick, received then."""
    raw = message(6, ("BTC-USD", "65086.18"), kind="snapshot")
    bare = parse_recorded(raw).events
    wrapped = parse_recorded(json.dumps({"recv_ts": 1_778_051_289.5, "raw": raw})).events
    assert [t for t, _ in bare] == [t for t, _ in wrapped]
    (at, event), (_, again) = bare[0], wrapped[0]
    assert event.event_id == f"coinbase:tick:BTC-USD:{TS}:6:0"
    assert event.ts == iso_ms(at) == "2026-05-06T07:08:09.123Z"
    assert again.received_ts == "2026-05-06T07:08:09.500Z"
    assert msgspec.structs.replace(again, received_ts=event.received_ts) == event


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ("{not json", "not a Coinbase message"),
        ('{"type": "ticker", "product_id": "BTC-USD", "price": "1"}', "older Exchange feed"),
        ('{"recv_ts": 1e15, "raw": "{}"}', "not epoch seconds"),
        ('{"channel": "ticker", "events": [{"type": "update", "tickers": []}]}', ""),
        ('{"foo": 1}', "without channel"),
        ('{"eventId": "e", "topic": "market.price.tick"}', "replay it as format jsonl"),
    ],
)
def test_lines_that_are_not_advanced_trade_messages_are_named(line: str, error: str) -> None:
    if not error:  # a ticker message with no tickers and no time: nothing, not an error
        assert parse_recorded(line).events == []
        return
    with pytest.raises(FeedProtocolError, match=error):
        parse_recorded(line)


def test_a_ticker_without_any_time_is_an_error() -> None:
    untimed = json.loads(message(1, ("BTC-USD", "1")))
    del untimed["timestamp"]
    with pytest.raises(FeedProtocolError, match="without a timestamp"):
        parse_recorded(json.dumps(untimed))
    wrapped = parse_recorded(json.dumps({"recv_ts": 1_778_051_289.0, "raw": json.dumps(untimed)}))
    assert [e.ts for _, e in wrapped.events] == ["2026-05-06T07:08:09.000Z"]


def test_the_formats_are_told_apart_by_their_first_line(tmp_path: Path) -> None:
    assert is_coinbase_message(message(1, ("BTC-USD", "1")))
    assert is_coinbase_message('{"recv_ts": 1.0, "raw": "{}"}')
    assert not is_coinbase_message(msgspec.json.encode(recording()[0]))
    assert not is_coinbase_message("open_time_ms,open")
    ours = write_jsonl(tmp_path / "ours.jsonl", recording())
    theirs = tmp_path / "theirs.jsonl.gz"
    theirs.write_bytes(gzip.compress(("\n" + message(1, ("BTC-USD", "1")) + "\n").encode()))
    assert feed_for(ours).format() == "jsonl"
    assert feed_for(theirs).format() == "coinbase"


async def test_a_bad_line_names_its_place_and_a_cut_off_last_line_is_skipped(
    tmp_path: Path,
) -> None:
    good = message(1, ("BTC-USD", "100"))
    cut = tmp_path / "cut.jsonl"
    cut.write_text(good + "\n" + good[:30])
    feed = feed_for(cut)
    events, _ = await replay(feed)
    assert len(events) == 1 and feed.statistics()["skipped_lines"] == 1
    bad = tmp_path / "bad.jsonl"
    bad.write_text(good + "\n" + '{"type": "ticker", "time": "x"}\n' + good + "\n")
    with pytest.raises(ReplayError, match=rf"{bad}:2: .*older Exchange feed"):
        await replay(feed_for(bad))


def test_a_recording_of_ticks_plots_their_prices(tmp_path: Path) -> None:
    """Without candles, the report's price line is the symbol's tick prices."""
    path = tmp_path / "ticks.jsonl"
    lines = [
        message(1, ("BTC-USD", "100"), ("ETH-USD", "5")),
        message(2, ("BTC-USD", "101.5"), ts="2026-05-06T07:08:10Z"),
    ]
    path.write_text("\n".join(lines) + "\n")
    got = list(feed_for(path).closes("BTC-USD"))
    assert [p for _, p in got] == [100.0, 101.5]
    assert got[1][0] - got[0][0] == 877  # .123 -> 10.000


def test_hooks_test_takes_its_event_and_state_from_a_raw_or_gzipped_recording(
    tmp_path: Path,
) -> None:
    """``hooks test --recording`` reads what the replay reads: raw Coinbase messages
    (the ticks before the event in its state) and a gzipped ``--record`` JSONL."""
    from daemon.cli.hooks import replay_state

    raw = tmp_path / "coinbase.jsonl"
    raw.write_text(
        message(1, ("BTC-USD", "100"), kind="snapshot")
        + "\n"
        + message(2, ("BTC-USD", "101.5"), ts="2026-05-06T07:08:10Z")
        + "\n"
    )
    event, state = replay_state(
        [ReplaySection(path=str(raw))], "coinbase:tick:BTC-USD:2026-05-06T07:08:10Z:2:0", 50
    )
    assert event.payload["price"] == 101.5
    assert state["ticks"]["BTC-USD"]["price"] == 101.5
    packed = write_jsonl(tmp_path / "rec.jsonl.gz", recording())
    event, _ = replay_state([ReplaySection(path=str(packed))], recording()[1].event_id, 50)
    assert event == recording()[1]  # as recorded: its own receivedTs
    csv = tmp_path / "candles.csv"  # CSV candles too (tests/sandbox/test_pool.py), named
    csv.write_text("open_time_ms,open,high,low,close,volume\n")
    with pytest.raises(click.BadParameter, match=r"feeds\.replay\.symbol must be set"):
        replay_state([ReplaySection(path=str(csv))], "x", 50)
    with pytest.raises(click.BadParameter, match="no event with id 'x'"):
        replay_state([ReplaySection(path=str(csv), symbol="BTC-USD", timeframe="5m")], "x", 50)


# --- the candles channel ----------------------------------------------------------

B0 = 1_786_279_500  # a five-minute boundary (epoch s)
AT = iso_ms((B0 + 1500) * 1000 + 48_228)  # when the messages came: after every bucket


def bucket(
    product: str, start: int, close: str, *, high: str = "", low: str = ""
) -> dict[str, str]:
    return {
        "start": str(start), "open": "100", "high": high or max(close, "100", key=float),
        "low": low or min(close, "100", key=float), "close": close, "volume": "1.5",
        "product_id": product,
    }  # fmt: skip


def candles(seq: int, *buckets: object, kind: str = "update", ts: str = AT) -> str:
    events = [{"type": kind, "candles": list(buckets)}]
    body = {"channel": "candles", "timestamp": ts, "sequence_num": seq, "events": events}
    return json.dumps(body)


def test_candles_close_once_a_later_bucket_starts_with_the_pollers_ids() -> None:
    """A snapshot closes every bucket but each product's newest; updates of the forming
    bucket close nothing until the next one starts, which closes it at its last values;
    a snapshot again (a reconnect) closes nothing twice. Ids and payloads are the REST
    poller's for the same bucket."""
    rec = Recording()
    snap = rec.parse(candles(
        1, bucket("BTC-USD", B0, "101"), bucket("BTC-USD", B0 + 300, "102"),
        bucket("ETH-USD", B0 + 300, "5"), bucket("BTC-USD", B0 + 600, "103"),
        bucket("ETH-USD", B0, "4", high="100", low="3"), kind="snapshot",
    ))  # fmt: skip
    assert snap.events == [] and not snap.other  # history: held for the next line
    history = rec.finish()
    closed = [(e.symbol, e.payload["close"]) for _, e in history]
    assert closed == [("BTC-USD", 101.0), ("ETH-USD", 4.0), ("BTC-USD", 102.0)]  # time order
    assert [t for t, _ in history] == [(B0 + 300) * 1000, (B0 + 300) * 1000, (B0 + 600) * 1000]
    rest = parse_candles(json.dumps({"candles": [bucket("BTC-USD", B0, "101")]}).encode(), "5m")
    same = closed_event(rest[0], source="coinbase", symbol="BTC-USD", timeframe="5m",
                        received_ms=parse_iso_ms(AT))  # fmt: skip
    assert history[0][1] == same
    assert same.event_id == f"coinbase:BTC-USD:5m:{(B0 + 300) * 1000}"
    assert rec.parse(candles(2, bucket("BTC-USD", B0 + 600, "104"))).events == []
    assert rec.parse(candles(3, bucket("BTC-USD", B0 + 600, "105.5"))).events == []
    [(_, btc)] = rec.parse(candles(4, bucket("BTC-USD", B0 + 900, "106"))).events
    assert (btc.payload["openTimeMs"], btc.payload["close"]) == ((B0 + 600) * 1000, 105.5)
    rec.parse(candles(
        1, bucket("BTC-USD", B0 + 600, "105.5"), bucket("BTC-USD", B0 + 900, "107"),
        bucket("BTC-USD", B0 + 1200, "108"), kind="snapshot",
    ))  # fmt: skip
    [(_, late)] = rec.finish()  # only the bucket not closed before, at the snapshot's values
    assert (late.payload["openTimeMs"], late.payload["close"]) == ((B0 + 900) * 1000, 107.0)


def test_candles_that_fail_the_pollers_checks_are_left_out() -> None:
    """Inconsistent high/low, a start off the five-minute grid or in ms, a price that is
    not a number, no product, a missing field, not an object: skipped; the good bucket
    still closes."""
    bad = [
        bucket("BTC-USD", B0, "101", high="99"),
        bucket("BTC-USD", B0 + 7, "101"),
        bucket("BTC-USD", B0 * 1000, "101"),
        {**bucket("BTC-USD", B0, "101"), "close": "NaN"},
        bucket("", B0, "101"),
        {k: v for k, v in bucket("BTC-USD", B0, "101").items() if k != "low"},
        [1, 2],
    ]
    line = candles(1, *bad, bucket("BTC-USD", B0 + 300, "1"), bucket("BTC-USD", B0 + 600, "2"))
    [(_, event)] = Recording().parse(line).events
    assert event.payload["close"] == 1.0


def test_snapshots_of_several_products_replay_merged_in_time_order() -> None:
    """Coinbase sends each product's snapshot (hours of history) back to back: their
    buckets come out merged by time with the next line that is not a snapshot (a
    heartbeat in between holds nothing back), so event time never jumps back."""
    rec = Recording()
    eth = [bucket("ETH-USD", B0 + 300 * i, str(10 + i)) for i in range(4)]
    btc = [bucket("BTC-USD", B0 + 300 * i, str(200 + i)) for i in range(4)]
    assert rec.parse(candles(1, *eth, kind="snapshot")).events == []
    heartbeat = json.dumps({"channel": "heartbeats", "timestamp": AT, "events": []})
    assert rec.parse(heartbeat).other
    assert rec.parse(candles(2, *btc, kind="snapshot")).events == []
    got = rec.parse(message(3, ("BTC-USD", "205"), ts=AT)).events
    times = [t for t, _ in got]
    assert times == sorted(times) and len(got) == 3 + 3 + 1
    assert [e.symbol for _, e in got[:6]] == ["ETH-USD", "BTC-USD"] * 3
    assert got[-1][1].topic == "market.price.tick"
    assert rec.finish() == []


def test_snapshots_are_held_up_to_a_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past MAX_HISTORY held buckets a snapshot line hands them on (in time order)
    rather than holding a whole file of snapshots in memory."""
    monkeypatch.setattr("feeds.coinbase_ws.recording.MAX_HISTORY", 5)
    rec = Recording()
    first = [bucket("ETH-USD", B0 + 300 * i, "10") for i in range(4)]
    assert rec.parse(candles(1, *first, kind="snapshot")).events == []  # 3 held
    more = [bucket("BTC-USD", B0 + 300 * i, "200") for i in range(4)]
    got = rec.parse(candles(2, *more, kind="snapshot")).events  # 6 > 5: handed on
    assert len(got) == 6 and [t for t, _ in got] == sorted(t for t, _ in got)
    assert rec.finish() == []


async def test_a_recording_of_candles_replays_them_beside_ticks(tmp_path: Path) -> None:
    """A file of candles messages between ticker messages: each closed bucket once, the
    forming one at the end left out, the ticks as before."""
    path = tmp_path / "mixed.jsonl"
    lines = [
        candles(1, bucket("BTC-USD", B0, "101"), bucket("BTC-USD", B0 + 300, "102"),
                kind="snapshot"),
        message(1, ("BTC-USD", "102.5"), ts=AT),
        candles(2, bucket("BTC-USD", B0 + 600, "103")),
        candles(3, bucket("BTC-USD", B0 + 600, "104")),  # still forming at the end
    ]  # fmt: skip
    path.write_text("".join(line + "\n" for line in lines))
    feed = feed_for(path)
    events, _ = await replay(feed)
    assert [(e.topic, e.payload.get("close") or e.payload.get("price")) for e in events] == [
        ("market.candle.closed", 101.0),
        ("market.price.tick", 102.5),
        ("market.candle.closed", 102.0),
    ]
    assert feed.statistics()["other_messages_left_out"] == 0
