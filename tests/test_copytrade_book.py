"""The leaders' book: what each leader holds, as its signals (in any order) say."""

from __future__ import annotations

from typing import Any

from daemon.copytrade.book import LeaderBook
from daemon.events import COPYTRADE_SIGNAL_OPENED, FeedEvent, SignalPayload
from daemon.state import StateCache


def sig(signal_id: str, kind: str, position: str = "p1", **fields: Any) -> SignalPayload:
    base: dict[str, Any] = {
        "leader": "alice",
        "signal_id": signal_id,
        "kind": kind,
        "position_id": position,
        "symbol": "BTC-USD",
        "side": "long",
        "time": f"2026-11-25T12:00:0{len(signal_id) % 10}.000Z",
    }
    return SignalPayload(**(base | fields))


def held(book: LeaderBook) -> list[str]:
    return [s["signalId"] for s in book.export()["held"]]


def test_opened_modified_partial_close_and_close() -> None:
    book = LeaderBook()
    assert book.apply(sig("s1", "opened", quantity=1.0, stop_loss=90.0)) == "applied"
    assert book.apply(sig("s2", "modified", stop_loss=95.0, take_profit=130.0)) == "applied"
    assert book.apply(sig("s3", "closed", quantity=0.4)) == "applied"
    [p] = book.export()["leaders"]
    assert (p["quantity"], p["stopLoss"], p["takeProfit"]) == (0.6, 95.0, 130.0)
    assert p["signalIds"] == ["s1", "s2", "s3"] and p["positionId"] == "p1"
    assert book.apply(sig("s4", "closed")) == "applied"  # no size: all of it
    assert book.export() == {"leaders": [], "held": []}


def test_a_redelivered_signal_changes_nothing() -> None:
    book = LeaderBook()
    book.apply(sig("s1", "opened", quantity=1.0))
    book.apply(sig("s2", "closed", quantity=0.5))
    assert book.apply(sig("s2", "closed", quantity=0.5)) == "duplicate"
    assert book.export()["leaders"][0]["quantity"] == 0.5


def test_a_close_before_its_open_is_held_then_resolved() -> None:
    book = LeaderBook()
    assert book.apply(sig("s2", "modified", stop_loss=95.0)) == "held"
    assert book.apply(sig("s3", "closed")) == "held"
    assert held(book) == ["s2", "s3"] and book.export()["leaders"] == []
    assert book.apply(sig("s1", "opened", quantity=1.0)) == "resolved"
    assert book.export() == {"leaders": [], "held": []}  # opened, modified, closed


def test_an_edit_before_its_open_applies_when_it_opens() -> None:
    book = LeaderBook()
    book.apply(sig("s2", "modified", take_profit=150.0))
    assert book.apply(sig("s1", "opened", quantity=2.0)) == "resolved"
    [p] = book.export()["leaders"]
    assert (p["takeProfit"], p["quantity"], p["signalIds"]) == (150.0, 2.0, ["s1", "s2"])


def test_pyramiding_adds_to_the_same_position_and_positions_are_per_id() -> None:
    book = LeaderBook()
    book.apply(sig("s1", "opened", quantity=1.0))
    book.apply(sig("s2", "opened", quantity=0.5))
    book.apply(sig("s3", "opened", "p2", quantity=3.0, side="short", symbol="ETH-USD"))
    by_id = {p["positionId"]: p for p in book.export()["leaders"]}
    assert by_id["p1"]["quantity"] == 1.5 and by_id["p2"]["side"] == "short"


def test_the_book_is_bounded() -> None:
    book = LeaderBook(max_positions=2)
    for i in range(4):
        book.apply(sig(f"s{i}", "opened", f"p{i}", quantity=1.0))
    assert [p["positionId"] for p in book.export()["leaders"]] == ["p2", "p3"]
    assert book.dropped == 2


def test_the_state_cache_keeps_the_book_across_a_restart() -> None:
    cache = StateCache()
    event = FeedEvent(
        event_id="copytrade:alice:s1",
        ts="2026-11-25T12:00:00.000Z",
        source="copytrade_webhook",
        topic=COPYTRADE_SIGNAL_OPENED,
        symbol="BTC-USD",
        payload={
            "leader": "alice",
            "signalId": "s1",
            "kind": "opened",
            "positionId": "p1",
            "symbol": "BTC-USD",
            "side": "long",
            "time": "2026-11-25T12:00:00.000Z",
            "quantity": 1.0,
        },
    )
    assert cache.apply(event) and not cache.apply(event)  # the second time: a duplicate
    cache.copytrade.apply(sig("s9", "closed", "p9"))  # held, kept too
    again = StateCache()
    again.load(cache.dump())
    assert again.copytrade.export() == cache.copytrade.export()
    assert not again.apply(event)  # what it had applied, it still knows
    bad = FeedEvent(event_id="x", ts=event.ts, source="t", topic=event.topic, payload={"kind": 1})
    assert not again.apply(bad) and again.statistics()["malformed"] == 1
