"""The WAL keeper: the durable stores' checkpoints, and the WAL restarts that follow
them, happen in its thread, so a store's commit on the event loop only appends."""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from pathlib import Path

import anyio
import msgspec
import pytest
import structlog
import structlog.testing

from daemon.cli.run import _render_status
from daemon.errors import StoreError
from daemon.sqlite import Connection, open_sqlite
from daemon.status import BusStatus, Status, read_status
from daemon.walkeeper import BACKSTOP_PAGES, CHECKPOINT_FAILED, KEEPER, WalKeeper


def wal_header(path: Path) -> bytes:
    """The WAL's checkpoint sequence and salts: they change when, and only when, a
    commit restarts the WAL (and syncs the new header)."""
    with open(f"{path}-wal", "rb") as f:
        return f.read(24)[12:24]


def store(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, factory=Connection)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("CREATE TABLE IF NOT EXISTS t (x)")
    return db


def write(db: sqlite3.Connection, n: int = 20) -> None:
    for i in range(n):
        db.execute("INSERT INTO t VALUES (?)", (i,))


def autocheckpoint(db: sqlite3.Connection) -> int:
    return int(db.execute("PRAGMA wal_autocheckpoint").fetchone()[0])


def test_a_store_commit_after_a_checkpoint_restarts_the_wal_unless_the_keeper_did(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.sqlite3"
    db = store(path)
    write(db)
    # What SQLite does alone: after a complete checkpoint, the next commit (on the
    # loop, for a store written from it) restarts the WAL and syncs its header.
    other = sqlite3.connect(path, isolation_level=None)
    assert other.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[0] == 0
    before = wal_header(path)
    write(db, 1)
    assert wal_header(path) != before
    other.close()

    keeper = WalKeeper()
    keeper.register(db, path, "NORMAL")
    write(db)
    keeper.keep(keeper.targets())
    assert (keeper.stats.checkpoints, keeper.stats.restarts) == (1, 1)
    restarted = wal_header(path)
    write(db)  # the store's commits after the keeper's pass only append
    assert wal_header(path) == restarted
    assert db.execute("SELECT count(*) FROM t").fetchone()[0] == 61

    keeper.keep(keeper.targets())  # they are checkpointed, and the WAL restarted, again
    assert keeper.stats.restarts == 2
    again = wal_header(path)
    assert again != restarted
    keeper.keep(keeper.targets())  # nothing written since: nothing to do
    assert keeper.stats.checkpoints == 2
    write(db, 1)
    assert wal_header(path) == again
    keeper.keep({})
    db.close()


def test_a_store_that_is_writing_keeps_its_restart_and_the_pass_does_not_wait(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.sqlite3"
    db, writer = store(path), store(path)
    write(db)
    keeper = WalKeeper()
    keeper.register(db, path, "NORMAL")
    writer.execute("BEGIN IMMEDIATE")  # a store's transaction, open across the pass
    started = time.monotonic()
    keeper.keep(keeper.targets())
    assert time.monotonic() - started < 1.0  # (busy_timeout 0: no wait for the lock)
    assert (keeper.stats.checkpoints, keeper.stats.restarts, keeper.stats.busy) == (1, 0, 1)
    writer.execute("INSERT INTO t VALUES (1)")
    writer.execute("COMMIT")
    assert db.execute("SELECT count(*) FROM t").fetchone()[0] == 21
    keeper.keep({})
    for conn in (db, writer):
        conn.close()


def test_a_store_that_cannot_be_kept_is_logged_and_the_others_are_kept(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"
    db = store(path)
    write(db)
    keeper = WalKeeper()
    keeper.register(db, path, "NORMAL")
    broken = tmp_path / "dir.sqlite3"
    broken.mkdir()  # (not a database: the keeper's connection cannot open it)
    with structlog.testing.capture_logs() as logs:
        for _ in range(3):
            write(db, 1)
            keeper.keep({broken: "NORMAL", **keeper.targets()})
        failing = keeper.status()
        broken.rmdir()
        store(broken).close()  # fixed
        keeper.keep({broken: "NORMAL", **keeper.targets()})
    assert (keeper.stats.errors, keeper.stats.restarts) == (3, 3)  # (the good one each time)
    assert keeper.status().failing == {}  # (fixed)
    assert list(failing.failing) == [str(broken)] and failing.restarts == 3
    shown = _render_status(
        Status(1, 0.0, 0.0, False, BusStatus(0, 0, 0, ()), [], {}, wal=failing), live_pid=None
    )
    assert f"WAL CHECKPOINTS FAILING: {broken}: " in shown
    said = [(e["log_level"], e["event"], e["store"]) for e in logs]
    assert said == [  # once when it starts failing, once when it works again
        ("warning", CHECKPOINT_FAILED, str(broken)),
        ("info", "WAL checkpoints work again", str(broken)),
    ]
    keeper.keep({})
    db.close()


async def test_while_the_keeper_runs_the_stores_do_not_checkpoint_themselves(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.sqlite3"
    db = store(path)
    keeper = WalKeeper(interval=0.05)
    keeper.register(db, path, "NORMAL")
    assert autocheckpoint(db) == 1000  # (SQLite's default, until a keeper runs)
    async with anyio.create_task_group() as tg:
        tg.start_soon(keeper.run)
        await anyio.sleep(0.01)
        assert autocheckpoint(db) == BACKSTOP_PAGES
        late = store(path)  # a store opened while it runs is kept at once
        keeper.register(late, path, "NORMAL")
        assert autocheckpoint(late) == BACKSTOP_PAGES
        write(db, 200)
        with anyio.fail_after(5):
            while keeper.stats.restarts == 0:  # noqa: ASYNC110 (a worker thread counts)
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    assert autocheckpoint(db) == autocheckpoint(late) == 1000
    assert not keeper._sides  # its own connections closed with it
    for conn in (db, late):
        conn.close()


async def test_two_runners_share_the_keeper_until_the_last_one_stops(tmp_path: Path) -> None:
    """(Two services in one process.) The stores checkpoint themselves again only when
    no runner is left."""
    path = tmp_path / "s.sqlite3"
    db = store(path)
    keeper = WalKeeper(interval=0.02)
    keeper.register(db, path, "NORMAL")
    async with anyio.create_task_group() as tg:
        first, second = anyio.CancelScope(), anyio.CancelScope()

        async def runner(scope: anyio.CancelScope) -> None:
            with scope:
                await keeper.run()

        tg.start_soon(runner, first)
        tg.start_soon(runner, second)
        await anyio.sleep(0.05)
        first.cancel()
        with anyio.fail_after(5):  # (it may be in a pass, in a worker thread: not cut)
            while keeper._runners != 1:  # noqa: ASYNC110 (a counter, no event to wait on)
                await anyio.sleep(0.01)
        assert autocheckpoint(db) == BACKSTOP_PAGES and keeper._runners == 1
        write(db)
        with anyio.fail_after(5):
            while keeper.stats.restarts == 0:  # noqa: ASYNC110 (a worker thread counts)
                await anyio.sleep(0.01)
        second.cancel()
    assert autocheckpoint(db) == 1000 and keeper._runners == 0 and not keeper._sides
    db.close()


def test_durable_stores_are_given_to_the_keeper_and_scratch_ones_are_not(
    tmp_path: Path,
) -> None:
    durable = open_sqlite(tmp_path / "d.sqlite3", "durable", schema="CREATE TABLE t (x);")
    scratch = open_sqlite(
        tmp_path / "s.sqlite3", "scratch", schema="CREATE TABLE t (x);", synchronous="OFF"
    )
    assert KEEPER.targets().get(tmp_path / "d.sqlite3") == "NORMAL"
    assert tmp_path / "s.sqlite3" not in KEEPER.targets()
    durable.close()
    scratch.close()
    assert tmp_path / "d.sqlite3" not in KEEPER.targets()


def test_passes_from_two_threads_take_turns_while_the_store_writes(tmp_path: Path) -> None:
    """A pass is plain blocking code run in worker threads (two services in one
    process each run the keeper): each of its connections serves one pass at a time."""
    path = tmp_path / "s.sqlite3"
    db = store(path)
    keeper = WalKeeper()
    keeper.register(db, path, "NORMAL")
    errors: list[BaseException] = []

    def passes() -> None:
        try:
            for _ in range(20):
                keeper.keep(keeper.targets())
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=passes) for _ in range(2)]
    for t in threads:
        t.start()
    for _ in range(200):
        write(db, 1)
    for t in threads:
        t.join()
    assert not errors and keeper.stats.errors == 0
    assert db.execute("SELECT count(*) FROM t").fetchone()[0] == 200
    keeper.keep({})
    db.close()


@pytest.fixture(autouse=True)
def _no_stray_keeper_state() -> None:
    assert KEEPER._runners == 0


def test_a_store_made_anew_at_its_path_is_kept_and_a_vanished_one_is_not_made_again(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.sqlite3"
    keeper = WalKeeper()
    for restarts in (1, 2):  # the second store is a new file where the first was
        db = store(path)
        keeper.register(db, path, "NORMAL")
        write(db)
        written = wal_header(path)
        keeper.keep(keeper.targets())
        assert keeper.stats.restarts == restarts
        restarted = wal_header(path)
        assert restarted != written  # (this store's WAL, not the one deleted)
        write(db, 1)
        assert wal_header(path) == restarted
        db.close()
        for leftover in tmp_path.iterdir():
            leftover.unlink()
    keeper.keep({path: "NORMAL"})  # (a close it has not seen yet)
    assert not path.exists() and keeper.stats.errors == 1
    keeper.keep({})


def test_a_fifo_in_a_stores_place_fails_its_pass_saying_so(tmp_path: Path) -> None:
    """A state dir that is not what the daemon wrote: the pass fails at once, naming
    what is wrong (SQLite alone said 'disk I/O error'), and never waits on the FIFO."""
    path = tmp_path / "s.sqlite3"
    db = store(path)
    keeper = WalKeeper()
    keeper.register(db, path, "NORMAL")
    os.rename(path, tmp_path / "aside.sqlite3")
    os.mkfifo(path)
    done = threading.Event()

    def one_pass() -> None:
        keeper.keep(keeper.targets())
        done.set()

    passes = threading.Thread(target=one_pass, daemon=True)
    passes.start()
    assert done.wait(5), "the pass hangs on the FIFO"
    assert keeper.stats.errors == 1 and "not a regular file" in keeper.status().failing[str(path)]
    keeper.keep({})
    db.close()


def test_a_status_files_wal_part_that_is_not_one_is_refused_or_shown_escaped(
    tmp_path: Path,
) -> None:
    """`wal` as status.json has it, edited by hand or damaged: a wrong type is refused
    naming the field; control characters in a store or an error are shown escaped."""
    status = Status(1, 0.0, 0.0, False, BusStatus(0, 0, 0, ()), [], {})
    state = tmp_path / "state"
    state.mkdir()
    written = msgspec.to_builtins(status)
    written["wal"] = {"failing": ["not", "a", "map"]}
    (state / "status.json").write_text(json.dumps(written))
    with pytest.raises(StoreError, match=r"\$\.wal\.failing"):
        read_status(state)
    written["wal"] = {"failing": {"/s\x1b[2J.sqlite3": "disk\x07gone"}}
    (state / "status.json").write_text(json.dumps(written))
    shown = _render_status(read_status(state), None)
    assert "\x1b" not in shown and "\x07" not in shown
    assert "WAL CHECKPOINTS FAILING: /s\\x1b[2J.sqlite3: disk\\x07gone" in shown
