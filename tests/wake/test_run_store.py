"""The run store keeps ``keep_seconds`` of history, pruned as runs start."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon.errors import StoreError
from daemon.wake.leftovers import ProcessMark
from daemon.wake.store import PRUNE_EVERY_SECONDS, RunStore


def test_history_older_than_keep_seconds_is_dropped_as_runs_start(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "wake.sqlite3", keep_seconds=100.0)
    try:
        store.record_start("a", "r0", "wake", 0.0)
        store.record_start("a", "r1", "wake", 50.0)
        assert store.starts_since("a", -1.0) == [0.0, 50.0]
        # pruning is at most once per PRUNE_EVERY_SECONDS of start times (a wake a
        # candle must not scan the table each time)
        late = PRUNE_EVERY_SECONDS + 60.0
        store.record_start("a", "r2", "wake", late)
        assert store.starts_since("a", -1.0) == [late]
    finally:
        store.close()


def test_a_queued_run_is_started_and_unqueued_in_one_transaction(tmp_path: Path) -> None:
    """Either both or neither: a crash between the two writes lost the run (no longer
    queued, never started). A failing second write rolls the first back."""
    store = RunStore(tmp_path / "wake.sqlite3")
    try:
        store.save_pending("a", "r1", 10.0, b"{}")
        store.record_start("a", "r1", "wake", 10.0, queued=True)
        assert store.pending("a") == [] and store.starts_since("a", 0.0) == [10.0]
        store.save_pending("a", "r2", 20.0, b"{}")
        store._db.execute(
            "CREATE TRIGGER refuse BEFORE DELETE ON wake_pending"
            " BEGIN SELECT RAISE(ABORT, 'disk says no'); END"
        )
        with pytest.raises(StoreError, match="disk says no"):
            store.record_start("a", "r2", "wake", 20.0, queued=True)
        assert [r[0] for r in store.pending("a")] == ["r2"]  # still queued...
        assert store.starts_since("a", 0.0) == [10.0]  # ...and not started
    finally:
        store.close()


def test_a_store_from_before_runs_kept_their_wakes_gets_the_column(tmp_path: Path) -> None:
    """An older store (no usage, no body) opens: its runs read with no body, new runs
    keep theirs."""
    import sqlite3

    old = sqlite3.connect(tmp_path / "wake.sqlite3")
    old.execute(
        "CREATE TABLE wake_runs (run_id TEXT PRIMARY KEY, agent_id TEXT NOT NULL,"
        " kind TEXT NOT NULL, started_at REAL NOT NULL, finished_at REAL,"
        " status TEXT NOT NULL DEFAULT 'started')"
    )
    old.execute(
        "INSERT INTO wake_runs (run_id, agent_id, kind, started_at) VALUES ('r0','a','wake',1)"
    )
    old.commit()
    old.close()
    store = RunStore(tmp_path / "wake.sqlite3")
    try:
        store.record_start("a", "r1", "wake", 2.0, body=b'{"wakes":[],"earlier":{}}')
        store.record_process("r1", ProcessMark(4242, 987654, "b00t"))
        assert [(u.run_id, u.body, u.process) for u in store.unfinished("a")] == [
            ("r0", None, None),
            ("r1", b'{"wakes":[],"earlier":{}}', (4242, 987654, "b00t")),
        ]
        # its runs took a place in the hourly budget, as every run did then
        store.record_start("a", "r2", "wake", 3.0, counted=False)
        assert store.starts_since("a", 0.0) == [1.0, 2.0]
    finally:
        store.close()


def test_a_damaged_process_mark_reads_as_none(tmp_path: Path) -> None:
    """A pid column holding text (a damaged or edited store) closes the run all the same,
    with no process to stop, instead of failing the start."""
    store = RunStore(tmp_path / "wake.sqlite3")
    try:
        store.record_start("a", "r1", "wake", 2.0)
        store._exec("UPDATE wake_runs SET pid = 'abc', pid_started = 3.5 WHERE run_id = 'r1'")
        # ...and its usage as none when a count is not a number
        store._exec("UPDATE wake_runs SET cost = 0.5, tokens_in = 'many' WHERE run_id = 'r1'")
        (u,) = store.unfinished("a")
        assert u.run_id == "r1" and u.process is None and u.usage == (0.0, 0, 0)
    finally:
        store.close()


def test_a_finished_run_drops_its_wakes_and_two_days_are_kept(tmp_path: Path) -> None:
    """Only a run a stop cut is read back for its wakes: a finished run's row keeps its
    times and usage, not its ~1 KB of wakes, and the history goes back two days (the
    cost cap reads to 00:00 UTC, the budget an hour), so the file stays small at a
    high run rate (a soak of 5,000 runs an hour grew it 81 KiB a minute)."""
    store = RunStore(tmp_path / "wake.sqlite3")
    body = b'{"wakes":[' + b'{"eventId":"x"},' * 60 + b'{}],"earlier":{}}'
    try:
        store.record_start("a", "done", "wake", 10.0, body=body)
        store.record_finish("done", 11.0, "succeeded", (0.25, 900, 40))
        store.record_start("a", "cut", "wake", 12.0, body=body)
        store.record_finish("cut", 12.0, "interrupted", None)
        store.record_start("a", "open", "wake", 13.0, body=body)
        rows = store._exec("SELECT run_id, body IS NULL FROM wake_runs ORDER BY started_at")
        assert rows == [("done", 1), ("cut", 1), ("open", 0)]
        assert [u.body for u in store.unfinished("a")] == [body]
        assert store.usage_since("a", 0.0) == (3, 0.25, 900, 40)
        assert store.last_finish("a") == 13.0
        day, late = 86400.0, 13.0 + 2 * 86400.0 + PRUNE_EVERY_SECONDS
        store.record_start("a", "day_old", "wake", late - day)
        store.record_start("a", "now", "wake", late)
        assert store.starts_since("a", -1.0) == [late - day, late]
    finally:
        store.close()
