"""The run store keeps ``keep_seconds`` of history, pruned as runs start."""

from __future__ import annotations

from pathlib import Path

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
