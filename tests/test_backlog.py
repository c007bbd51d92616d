"""An agent's overflow on disk, and its CPU budget: nobody waits for a slow agent."""

from __future__ import annotations

import io
from pathlib import Path

import anyio
import pytest

from daemon.agents.budget import CpuBudget
from daemon.backlog import Backlog
from daemon.bus import Bus
from daemon.events import MARKET_CANDLE_CLOSED, MARKET_PRICE_TICK, encode
from tests.test_bus import ev

pytestmark = pytest.mark.anyio


def test_backlog_is_a_fifo_that_empties_its_file_and_survives_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "b" / "alpha.jsonl"
    log = Backlog(path, max_bytes=10_000)
    for i in range(5):
        log.append(ev(MARKET_CANDLE_CLOSED, "a", i))
    assert len(log) == 5 and [e.sequence for e in log.take(2)] == [0, 1]
    log.close()
    again = Backlog(path, max_bytes=10_000)  # a restart: what was not read yet is there
    assert len(again) == 5  # read positions are not kept: at least once (marks dedupe)
    assert [e.sequence for e in again.take(10)] == [0, 1, 2, 3, 4]
    assert len(again) == 0 and path.stat().st_size == 0  # emptied: the file is truncated
    again.append(ev(MARKET_CANDLE_CLOSED, "a", 9))
    assert [e.sequence for e in again.take(10)] == [9]
    again.close(delete=True)
    assert not path.exists()


def test_a_torn_or_bad_line_is_skipped_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "alpha.jsonl"
    good = encode(ev(MARKET_CANDLE_CLOSED, "a", 1))
    path.write_bytes(good + b"\n" + b'{"not": "an event"}\n' + good[:20])  # crash mid-write
    log = Backlog(path, max_bytes=10_000)
    assert [e.sequence for e in log.take(10)] == [1]
    assert log.unreadable == 2 and len(log) == 0
    log.close()


def test_a_full_backlog_says_so(tmp_path: Path) -> None:
    log = Backlog(tmp_path / "x.jsonl", max_bytes=200)
    while not log.full:
        log.append(ev(MARKET_CANDLE_CLOSED, "a", len(log)))
    assert len(log) >= 1
    log.close()


async def test_a_full_queue_spills_instead_of_blocking_and_order_is_kept(tmp_path: Path) -> None:
    """Capacity 2 and nobody reading: 50 candle closes are published at once (a slow
    agent would have blocked the publisher at the third); the reader then gets all
    of them in order, ticks still coalesce in memory, and the file ends empty."""
    bus = Bus(queue_size=2)
    path = tmp_path / "alpha.jsonl"
    slow = bus.subscribe(">", overflow=Backlog(path, max_bytes=1 << 20))
    with anyio.fail_after(2):
        for i in range(50):
            await bus.publish(ev(MARKET_CANDLE_CLOSED, "c", i))
            await bus.publish(ev(MARKET_PRICE_TICK, "t", i))
    stats = slow.statistics()
    # the queue holds candle 0 and a tick; candles 1-49 went to disk
    assert stats.blocked_publishes == 0 and stats.backlog == 49 and stats.spilled == 49
    assert stats.coalesced > 0
    got = []
    while (e := slow.receive_nowait()) is not None:
        got.append(e)
    candles = [e.sequence for e in got if e.topic == MARKET_CANDLE_CLOSED]
    assert candles == list(range(50))
    tick_events = [e for e in got if e.topic == MARKET_PRICE_TICK]
    ticks = [e.sequence for e in tick_events if e.sequence is not None]
    assert (
        len(ticks) == len(tick_events) and ticks == sorted(ticks) and ticks[-1] == 49
    )  # the newest price is never lost
    assert slow.backlog == 0 and path.stat().st_size == 0
    bus.close()
    slow.release()


async def test_an_ordered_subscription_keeps_publish_order_across_partitions(
    tmp_path: Path,
) -> None:
    """Event time: an agent and its account's broker route step together, so both
    must see candles and ticks in one order. An ordered subscription never coalesces
    a tick nor lets it overtake the candles waiting on disk; without a backlog its
    ticks wait for room like everything else."""
    bus = Bus(queue_size=2)
    ordered = bus.subscribe(
        ">", overflow=Backlog(tmp_path / "a.jsonl", max_bytes=1 << 20), ordered=True
    )
    published = []
    with anyio.fail_after(2):
        for i in range(30):
            for event in (ev(MARKET_CANDLE_CLOSED, "c", i), ev(MARKET_PRICE_TICK, "t", i)):
                published.append(event.event_id)
                await bus.publish(event)
    assert ordered.statistics().coalesced == 0 and ordered.backlog == 58
    got = []
    while (e := ordered.receive_nowait()) is not None:
        got.append(e.event_id)
    assert got == published
    ordered.release()

    bare = Bus(queue_size=1)
    sub = bare.subscribe(">", ordered=True)
    await bare.publish(ev(MARKET_PRICE_TICK, "t", 0))
    with anyio.move_on_after(0.2) as waited:
        await bare.publish(ev(MARKET_PRICE_TICK, "t", 1))
    assert waited.cancelled_caught and sub.statistics().coalesced == 0


async def test_a_stop_drains_through_the_backlog_and_a_cut_leaves_it_for_the_next_start(
    tmp_path: Path,
) -> None:
    path = tmp_path / "alpha.jsonl"
    bus = Bus(queue_size=1)
    sub = bus.subscribe(">", overflow=Backlog(path, max_bytes=1 << 20))
    for i in range(3):
        await bus.publish(ev(MARKET_CANDLE_CLOSED, "c", i))
    sub.close()  # a stop: the agent drains what it holds, disk included
    assert [e.sequence async for e in sub] == [0, 1, 2] and path.stat().st_size == 0

    bus = Bus(queue_size=4)
    sub = bus.subscribe(">", overflow=Backlog(path, max_bytes=1 << 20))
    for i in range(3, 9):  # 3-6 in memory, 7-8 on disk
        await bus.publish(ev(MARKET_CANDLE_CLOSED, "c", i))
    sub.close()
    # the queue, then 7 read back with 8: the file is emptied (all of it was read)
    got = [sub.receive_nowait() for _ in range(5)]
    assert path.stat().st_size == 0
    assert [e.sequence for e in got if e is not None] == [3, 4, 5, 6, 7]
    sub.release()  # the drain is cut while the agent is on 7
    bus = Bus(queue_size=1)  # the next start
    sub = bus.subscribe(">", overflow=Backlog(path, max_bytes=1 << 20))
    await bus.publish(ev(MARKET_CANDLE_CLOSED, "c", 9))  # queued behind what waited on disk
    left = []
    while (e := sub.receive_nowait()) is not None:
        left.append(e.sequence)
    # 7 was not finished (marks skip it if it was), 8 was only in memory:
    # both are written back at the stop, in order
    assert left == [7, 8, 9] and path.stat().st_size == 0
    bus.close()
    sub.release()


def test_cpu_budget_makes_an_agent_wait_until_the_window_lets_it_in() -> None:
    now = [0.0]
    cpu = CpuBudget(share=0.5, window_seconds=10, clock=lambda: now[0])  # 5 s per 10 s
    assert cpu.delay("a") == 0
    for t in range(6):  # 6 evaluations of 1 s each, one per second
        now[0] = float(t)
        cpu.record("a", 1000)
    assert cpu.spent("a") == 6000 and cpu.delay("a") == pytest.approx(5.0)  # at t=10
    assert cpu.delay("b") == 0  # another agent is not affected
    now[0] = 10.0
    assert cpu.spent("a") == 5000 and cpu.delay("a") == 0
    cpu.forget("a")
    assert cpu.spent("a") == 0


async def test_a_backlog_that_cannot_be_written_makes_the_publisher_wait(tmp_path: Path) -> None:
    """Disk full: no publish fails, no event is lost; the publisher waits for the
    reader, as without a backlog."""

    class FullDisk(io.BytesIO):
        def write(self, _data: object) -> int:
            raise OSError(28, "No space left on device")

    bus = Bus(queue_size=1)
    backlog = Backlog(tmp_path / "x.jsonl", max_bytes=1 << 20)
    backlog.close()
    backlog._fh = FullDisk()  # type: ignore[assignment]
    sub = bus.subscribe(">", overflow=backlog)
    got: list[int] = []

    async def read() -> None:
        async for e in sub:
            got.append(e.sequence or 0)

    async with anyio.create_task_group() as tg:
        tg.start_soon(read)
        with anyio.fail_after(5):
            for i in range(5):
                await bus.publish(ev(MARKET_CANDLE_CLOSED, "c", i))
        bus.close()
    assert got == [0, 1, 2, 3, 4] and sub.statistics().blocked_publishes > 0


@pytest.mark.parametrize("kind", ["fifo", "symlink", "directory"])
def test_a_special_backlog_path_is_refused_at_once(tmp_path: Path, kind: str) -> None:
    """Never blocks on a FIFO, never follows a link: a clear StoreError; where an
    agent's or an account's backlog goes, that one runs without (logged), nothing
    else stops."""
    import os

    from daemon.backlog import open_backlog
    from daemon.errors import StoreError

    path = tmp_path / "alpha.jsonl"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "symlink":
        path.symlink_to(tmp_path / "elsewhere.jsonl")
    else:
        path.mkdir()
    with pytest.raises(StoreError, match="backlog"):
        Backlog(path, max_bytes=1 << 20)
    assert open_backlog(path, 1 << 20, "account alpha") is None
    assert not (tmp_path / "elsewhere.jsonl").exists()


@pytest.mark.parametrize("kind", ["fifo", "symlink"])
async def test_a_special_file_where_the_write_back_goes_is_refused_not_waited_on(
    tmp_path: Path, kind: str
) -> None:
    """The write-back at a cut stop goes through ``<backlog>.tmp``: a FIFO there (no
    reader) or a link is refused at once, logged; the stop goes on."""
    import os

    path = tmp_path / "alpha.jsonl"
    tmp = tmp_path / "alpha.jsonl.tmp"
    if kind == "fifo":
        os.mkfifo(tmp)
    else:
        (tmp_path / "elsewhere").write_text("keep")
        tmp.symlink_to(tmp_path / "elsewhere")
    bus = Bus(queue_size=4)
    sub = bus.subscribe(">", overflow=Backlog(path, max_bytes=1 << 20))
    for i in range(3):
        await bus.publish(ev(MARKET_CANDLE_CLOSED, "c", i))
    assert sub.receive_nowait() is not None
    sub.release()  # without O_NONBLOCK, opening a FIFO for writing blocks (pytest-timeout)
    if kind == "symlink":
        assert (tmp_path / "elsewhere").read_text() == "keep"
    bus.close()
