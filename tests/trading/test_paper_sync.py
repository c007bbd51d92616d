"""The paper store synced off the event loop: a NORMAL store's commits do not sync,
and the broker's account events wait for a sync in a worker thread, in commit order
(``PaperBroker(sync_before_emit=True)``, what the daemon runs)."""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest
import structlog.testing

from daemon.errors import StoreError
from daemon.events import FeedEvent
from daemon.trading.paper import PaperBroker
from tests.trading.test_paper import T0, request


class Log(list[str]):
    """What happened, in order: syncs and published events."""

    async def publish(self, event: FeedEvent) -> None:
        order = re.search(r"mw-[0-9a-f]+", event.event_id)  # (the client order id)
        self.append(f"{event.topic.removeprefix('account.')} {order and order[0]}")
        await anyio.lowlevel.checkpoint()  # (as the outbox: a cancellation lands here)


@pytest.fixture
def log() -> Log:
    return Log()


@pytest.fixture
def broker(tmp_path: Path, log: Log) -> Iterator[PaperBroker]:
    b = PaperBroker(tmp_path, log.publish, synchronous="NORMAL", sync_before_emit=True)
    yield b
    b.close()


def slow_syncs(broker: PaperBroker, log: Log, *seconds: float) -> list[bool]:
    """Replace the store's sync with one taking ``seconds`` (then 0) that logs itself;
    returns, per call, whether it ran on the main (the loop's) thread."""
    on_main: list[bool] = []
    real = broker._store.sync
    delays = iter(seconds)

    def sync() -> None:
        on_main.append(threading.current_thread() is threading.main_thread())
        time.sleep(next(delays, 0.0))
        real()
        log.append("sync")

    broker._store.sync = sync  # type: ignore[method-assign]
    return on_main


async def test_events_wait_for_a_sync_in_a_worker_thread_and_the_loop_runs_meanwhile(
    broker: PaperBroker, log: Log
) -> None:
    on_main = slow_syncs(broker, log, 0.3)
    await broker.on_tick("BTC", 100.0, T0)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await anyio.sleep(0.01)
            ticks += 1

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        order = await broker.submit(request("k1"))
        tg.cancel_scope.cancel()
    oid = order.client_order_id
    assert log == ["sync", f"order.placed {oid}", f"order.filled {oid}", f"position.opened {oid}"]
    assert on_main == [False] and ticks >= 10  # (the loop ran during the 0.3 s sync)
    assert order.status == "FILLED" and broker.syncs == 1


async def test_events_leave_in_commit_order_when_a_later_commit_syncs_faster(
    broker: PaperBroker, log: Log
) -> None:
    await broker.on_tick("BTC", 100.0, T0)
    resting = await broker.submit(request("k0", action="PLACE_LIMIT_ORDER", openPrice=90.0))
    log.clear()
    slow_syncs(broker, log, 0.3, 0.0)  # the first commit's sync is the slow one
    async with anyio.create_task_group() as tg:
        tg.start_soon(broker.submit, request("k1"))
        await anyio.sleep(0.05)  # k1 committed, its sync under way
        await broker.cancel(resting.client_order_id)
    k1 = request("k1").client_order_id
    assert log == [
        "sync",
        f"order.placed {k1}",
        f"order.filled {k1}",
        f"position.opened {k1}",
        "sync",
        f"order.canceled {resting.client_order_id}",
    ]


async def test_a_caller_cancelled_during_the_sync_still_has_its_events_published(
    broker: PaperBroker, log: Log
) -> None:
    slow_syncs(broker, log, 0.3)
    await broker.on_tick("BTC", 100.0, T0)
    with anyio.move_on_after(0.05) as scope:
        await broker.submit(request("k1"))
    assert scope.cancel_called
    k1 = request("k1").client_order_id
    assert log == ["sync", f"order.placed {k1}", f"order.filled {k1}", f"position.opened {k1}"]
    assert broker.get_order(k1) is not None


async def test_the_store_sync_is_an_fdatasync_of_its_wal(
    broker: PaperBroker, log: Log, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[str] = []
    real = os.fdatasync

    def spy(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fdatasync", spy)
    await broker.on_tick("BTC", 100.0, T0)
    assert synced == []  # (a tick with nothing to fill tells nobody anything)
    await broker.submit(request("k1"))
    assert synced == [str(broker._store.path) + "-wal"]
    assert len(log) == 3


async def test_a_sync_that_fails_is_logged_once_and_the_events_still_leave(
    broker: PaperBroker, log: Log
) -> None:
    def failing() -> None:
        raise StoreError("paper.sqlite3: cannot sync the orders: [Errno 5] EIO")

    broker._store.sync = failing  # type: ignore[method-assign]
    await broker.on_tick("BTC", 100.0, T0)
    with structlog.testing.capture_logs() as logs:
        await broker.submit(request("k1"))
        await broker.submit(request("k2"))
    assert [e.split()[0] for e in log].count("order.filled") == 2
    assert [(e["log_level"], e["event"]) for e in logs] == [("error", "paper store not synced")]


async def test_a_fifo_in_the_wals_place_fails_the_sync_and_never_hangs_it(
    broker: PaperBroker, log: Log
) -> None:
    """A state dir that is not what the daemon wrote: opening a FIFO to read waits
    for a writer, which would hold every order's events (and the stop) for ever."""
    await broker.on_tick("BTC", 100.0, T0)
    wal = f"{broker._store.path}-wal"
    os.rename(wal, f"{wal}.aside")  # (the store keeps writing the file it has open)
    os.mkfifo(wal)
    with structlog.testing.capture_logs() as logs, anyio.fail_after(5):
        order = await broker.submit(request("k1"))
    assert order.status == "FILLED" and len(log) == 3
    assert [(e["log_level"], e["event"]) for e in logs] == [("error", "paper store not synced")]
