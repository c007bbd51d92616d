"""A leader account's events as signals (sans-I/O): a stop moved, a flip, other accounts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from daemon.audit.records import SignalRecord
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
        "signals": 2, "lastSignalAt": "2026-11-25T12:00:00.000Z",  # modified, closed
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
        "signals": 4, "lastSignalAt": "2026-11-25T12:00:00.000Z",  # two each run
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


@pytest.mark.parametrize("cancelled", [False, True])
async def test_signal_counts_are_kept_without_a_close_by_the_end_of_the_relay(
    tmp_path: Path, cancelled: bool
) -> None:
    """Records are kept at each close, and the signal counts within a second of a
    signal or when the relay ends (drained or cancelled), so ``copytrade status``
    counts a leader agent's signals before its first close."""
    import anyio

    from daemon.agents.pipeline import _relay
    from daemon.copytrade.relay import decode_stats

    opened = {"quantity": 1.0, "avgPrice": 100.0, "openedMs": 1}
    path = tmp_path / "kept.json"
    relay, rows = LeaderRelay({"lead": "alice"}), list[SignalRecord]()
    send, receive = anyio.create_memory_object_stream[FeedEvent](10)
    relayed, end = anyio.Event(), anyio.Event()

    async def events() -> Any:
        yield ev(ACCOUNT_POSITION_OPENED, "o1", opened)
        relayed.set()
        await end.wait()  # the drain closes the subscription

    async with anyio.create_task_group() as tg:
        tg.start_soon(_relay, events(), relay, send, path, rows.append)
        await relayed.wait()
        await anyio.sleep(0.05)
        assert not path.exists(), "a second late at most: not yet"
        if cancelled:
            tg.cancel_scope.cancel()
        else:
            end.set()
    [kept] = decode_stats(path.read_bytes())
    assert (kept.signals, kept.closed_positions, len(rows)) == (1, 0, 1)
    assert receive.receive_nowait().topic == "copytrade.signal.opened"
    send.close()
    receive.close()
