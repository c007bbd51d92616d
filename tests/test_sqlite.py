"""daemon.sqlite: stores that do not sync group their statements into transactions,
and atomic writes inside or outside a batch."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from daemon.sqlite import BATCH_STATEMENTS, open_sqlite

SCHEMA = "CREATE TABLE IF NOT EXISTS t (n INTEGER PRIMARY KEY);"


def _count(path: Path) -> int:
    """Rows another connection sees (committed ones only)."""
    with sqlite3.connect(path) as other:
        (n,) = other.execute("SELECT COUNT(*) FROM t").fetchone()
    return int(n)


def test_a_store_that_skips_syncing_commits_in_batches_and_at_close(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"
    db = open_sqlite(path, "test store", schema=SCHEMA, synchronous="OFF", batch=True)
    for i in range(BATCH_STATEMENTS):
        db.execute("INSERT INTO t VALUES (?)", (i,))
    assert not db.in_transaction  # the first batch is committed
    for i in range(BATCH_STATEMENTS, BATCH_STATEMENTS + 10):
        db.execute("INSERT INTO t VALUES (?)", (i,))
    assert db.in_transaction  # the rest not yet
    (mine,) = db.execute("SELECT COUNT(*) FROM t").fetchone()
    assert mine == BATCH_STATEMENTS + 10  # the store itself reads its own writes
    db.close()
    assert _count(path) == BATCH_STATEMENTS + 10


def test_a_scratch_store_is_this_process_alone_while_open(tmp_path: Path) -> None:
    """Batching stores lock their file for the connection's life (no lock per
    statement); once closed, anyone reads them."""
    path = tmp_path / "s.sqlite3"
    db = open_sqlite(path, "test store", schema=SCHEMA, synchronous="OFF", batch=True)
    db.execute("INSERT INTO t VALUES (1)")
    other = sqlite3.connect(path, timeout=0.05)
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        other.execute("SELECT COUNT(*) FROM t").fetchone()
    other.close()
    db.close()
    assert _count(path) == 1


@pytest.mark.parametrize("batch", [False, True])
def test_an_atomic_write_is_all_or_nothing_batched_or_not(tmp_path: Path, batch: bool) -> None:
    """atomic(): a transaction of its own, or a savepoint inside the batch; an
    exception rolls back its statements only, and the batch never commits half of
    one (a batch full inside it commits after it)."""
    path = tmp_path / "s.sqlite3"
    db = open_sqlite(path, "test store", schema=SCHEMA, synchronous="OFF", batch=batch)
    db.execute("INSERT INTO t VALUES (0)")
    with pytest.raises(RuntimeError), db.atomic():
        db.execute("INSERT INTO t VALUES (1)")
        raise RuntimeError("broken")
    with db.atomic():
        for i in range(2, BATCH_STATEMENTS + 12):
            db.execute("INSERT INTO t VALUES (?)", (i,))
            assert db.in_transaction  # never committed half-way
    with pytest.raises(RuntimeError), db.atomic():
        with db.atomic():
            db.execute("INSERT INTO t VALUES (-1)")
        raise RuntimeError("the outer one fails")
    rows = {n for (n,) in db.execute("SELECT n FROM t")}
    assert rows == {0, *range(2, BATCH_STATEMENTS + 12)}
    db.close()
    assert _count(path) == len(rows)


def test_a_syncing_store_commits_every_statement(tmp_path: Path) -> None:
    """batch=True asks for batching only where it is allowed (synchronous OFF)."""
    path = tmp_path / "s.sqlite3"
    db = open_sqlite(path, "test store", schema=SCHEMA, synchronous="NORMAL", batch=True)
    for i in range(3):
        db.execute("INSERT INTO t VALUES (?)", (i,))
        assert _count(path) == i + 1
    db.close()


def test_a_batched_store_can_still_open_its_own_transaction(tmp_path: Path) -> None:
    """``with db:`` (as the hook store's pruning does) commits what is pending."""
    path = tmp_path / "s.sqlite3"
    db = open_sqlite(path, "test store", schema=SCHEMA, synchronous="OFF", batch=True)
    db.execute("INSERT INTO t VALUES (1)")
    with db:
        db.execute("INSERT INTO t VALUES (2)")
    assert not db.in_transaction
    db.close()
    assert _count(path) == 2


def test_closing_a_store_does_not_commit_its_own_open_transaction(tmp_path: Path) -> None:
    """Only batching commits at close; a transaction a store opened itself and did not
    finish is rolled back, as sqlite3 does."""
    path = tmp_path / "s.sqlite3"
    db = open_sqlite(path, "test store", schema=SCHEMA, synchronous="OFF")
    db.execute("BEGIN IMMEDIATE")
    db.execute("INSERT INTO t VALUES (1)")
    db.close()
    assert _count(path) == 0
