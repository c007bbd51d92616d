"""A leader account's events as signals (sans-I/O): a stop moved, a flip, other accounts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from daemon.copytrade.relay import LeaderRelay
from daemon.events import (
    ACCOUNT_ORDER_FILLED,
    ACCOUNT_ORDER_MODIFIED,
    ACCOUNT_POSITION_CLOSED,
    ACCOUNT_POSITION_OPENED,
    FeedEvent,
)


def ev(topic: str, key: str, payload: dict[str, Any], account: str = "lead") -> FeedEvent:
    return FeedEvent(
        event_id=f"paper:{key}",
        ts="2026-11-25T12:00:00.000Z",
        source="paper",
        topic=topic,
        payload=payload,
        symbol="BTC-USD",
        account_id=account,
    )


def kinds(out: list[FeedEvent]) -> list[tuple[str, Any, Any]]:
    return [
        (e.topic.rsplit(".", 1)[-1], e.payload.get("side"), e.payload.get("quantity")) for e in out
    ]


def test_a_moved_stop_is_a_modified_and_a_flip_closes_then_opens() -> None:
    relay = LeaderRelay({"lead": "alice"})
    relay.seed("lead", "BTC-USD", 0.5, 1000)  # held at start
    moved = ev(ACCOUNT_ORDER_MODIFIED, "c1:sl:modified:x", {"role": "stop_loss", "stopPrice": 95.0})
    [m] = relay.on_event(moved)
    assert m.topic == "copytrade.signal.modified" and m.payload["stopLoss"] == 95.0
    assert (
        m.payload["positionId"] == "BTC-USD:1000"
        and m.event_id == "copytrade:alice:c1:sl:modified:x"
    )
    # a sell of 1.0 flips the long 0.5: the fill itself says nothing, the position events do
    fill = {"role": "entry", "side": "sell", "volume": 1.0, "fillPrice": 100.0, "stopLoss": 110.0}
    assert relay.on_event(ev(ACCOUNT_ORDER_FILLED, "c2:filled", fill)) == []
    closed = {"quantity": 0.5, "openedMs": 1000, "closePrice": 100.0, "realizedPnl": -2.5}
    out = relay.on_event(ev(ACCOUNT_POSITION_CLOSED, "closed:c2", closed))
    assert kinds(out) == [("closed", "long", None), ("updated", None, None)]
    assert out[1].payload == {
        "leader": "alice", "closedPositions": 1, "wins": 0, "winRate": 0.0,
        "realizedPnl": -2.5, "maxDrawdown": 2.5, "peakPnl": 0.0,
    }  # fmt: skip
    opened = {"quantity": -0.5, "avgPrice": 100.0, "openedMs": 2000}
    [o] = relay.on_event(ev(ACCOUNT_POSITION_OPENED, "opened:c2", opened))
    assert kinds([o]) == [("opened", "short", 0.5)]
    assert o.payload["stopLoss"] == 110.0 and o.payload["positionId"] == "BTC-USD:2000"


def test_other_accounts_are_not_relayed() -> None:
    relay = LeaderRelay({"lead": "alice"})
    opened = {"quantity": 1.0, "avgPrice": 100.0, "openedMs": 1}
    assert relay.on_event(ev(ACCOUNT_POSITION_OPENED, "o", opened, account="someone")) == []


def test_an_account_event_of_another_shape_raises_a_value_error_the_pipeline_logs() -> None:
    """The pipeline's relay task skips (and logs) what it cannot read: the relay raises
    one of the errors it catches, never something else."""
    import pytest

    relay = LeaderRelay({"lead": "alice"})
    for payload in ({}, {"quantity": "x", "openedMs": 1}, {"quantity": None, "openedMs": 1}):
        with pytest.raises((KeyError, TypeError, ValueError)):
            relay.on_event(ev(ACCOUNT_POSITION_OPENED, "o", payload))


def test_signals_carry_the_leaders_equity_for_equity_ratio_sizing() -> None:
    equity = {"lead": 12_000.0}
    relay = LeaderRelay({"lead": "alice"}, equity=lambda account: equity[account])
    opened = {"quantity": 1.0, "avgPrice": 100.0, "openedMs": 1}
    [o] = relay.on_event(ev(ACCOUNT_POSITION_OPENED, "o", opened))
    assert o.payload["leaderEquity"] == 12_000.0
    equity["lead"] = 11_500.0  # after a loss
    closed = {"quantity": 1.0, "openedMs": 1, "closePrice": 95.0, "realizedPnl": -500.0}
    c, _ = relay.on_event(ev(ACCOUNT_POSITION_CLOSED, "c", closed))
    assert c.payload["leaderEquity"] == 11_500.0


def test_the_records_continue_from_what_was_kept() -> None:
    first = LeaderRelay({"lead": "alice"})
    opened = {"quantity": 1.0, "avgPrice": 100.0, "openedMs": 1}
    closed = {"quantity": 1.0, "openedMs": 1, "closePrice": 110.0, "realizedPnl": 10.0}
    first.on_event(ev(ACCOUNT_POSITION_OPENED, "o1", opened))
    first.on_event(ev(ACCOUNT_POSITION_CLOSED, "c1", closed))
    again = LeaderRelay({"lead": "alice", "other": "bob"})
    again.load_stats(first.dump_stats())
    again.on_event(ev(ACCOUNT_POSITION_OPENED, "o2", opened | {"openedMs": 2}))
    lost = closed | {"openedMs": 2, "realizedPnl": -4.0}
    [_, record] = again.on_event(ev(ACCOUNT_POSITION_CLOSED, "c2", lost))
    assert record.payload == {
        "leader": "alice", "closedPositions": 2, "wins": 1, "winRate": 0.5,
        "realizedPnl": 6.0, "maxDrawdown": 4.0, "peakPnl": 10.0,
    }  # fmt: skip
    assert again.stats["bob"].closed_positions == 0


def test_kept_records_that_are_not_a_small_regular_file_start_from_zero(tmp_path: Path) -> None:
    """A FIFO (never waited on), a link, an oversized or broken file: a warning and
    fresh records; the daemon goes on."""
    import os

    from daemon.agents.pipeline import load_leader_stats
    from daemon.copytrade.relay import MAX_LEADER_STATS_BYTES

    good = LeaderRelay({"lead": "alice"})
    good.stats["alice"].closed_positions = 3
    kept = tmp_path / "kept.json"
    kept.write_bytes(good.dump_stats())
    fifo, link, big, bad = (tmp_path / n for n in ("fifo", "link", "big", "bad"))
    os.mkfifo(fifo)
    link.symlink_to(kept)
    big.write_bytes(b" " * (MAX_LEADER_STATS_BYTES + 1))
    bad.write_bytes(b'[{"leader": "alice", "closedPositions": "many"}]')
    for path in (fifo, link, big, bad, tmp_path / "missing"):
        relay = LeaderRelay({"lead": "alice"})
        load_leader_stats(relay, path)
        assert relay.stats["alice"].closed_positions == 0, path
    relay = LeaderRelay({"lead": "alice"})
    load_leader_stats(relay, kept)
    assert relay.stats["alice"].closed_positions == 3
