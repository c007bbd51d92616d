"""The hook store: dedupe retention, cooldown scope, pauses and resume requests."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from daemon.agents.store import AGENT_WIDE, PRUNE_EVERY, HookStore

DAY = 86_400_000


def test_dedupe_keys_persist_and_expire_by_event_time(tmp_path: Path) -> None:
    """A key is remembered across reopen and pruned once older than the retention."""
    store = HookStore(tmp_path / "h.sqlite3", dedupe_days=1)
    store.mark("a", "k1", 0)
    store.close()
    store = HookStore(tmp_path / "h.sqlite3", dedupe_days=1)
    assert store.seen("a", "k1") and not store.seen("b", "k1")
    for i in range(PRUNE_EVERY + 1):  # the sweep runs every PRUNE_EVERY marks
        store.mark("a", f"new{i}", 2 * DAY)
    assert not store.seen("a", "k1")
    assert store.seen("a", "new0")


def test_cooldown_is_per_hook_and_scope(tmp_path: Path) -> None:
    """A cooldown covers one hook and one symbol, until its end (event time)."""
    store = HookStore(tmp_path / "h.sqlite3")
    store.start_cooldown("a", "h1", "BTC-USD", until_ms=1000)
    assert store.cooling("a", "h1", "BTC-USD", 999)
    assert not store.cooling("a", "h1", "BTC-USD", 1000)
    assert not store.cooling("a", "h1", "ETH-USD", 500)
    assert not store.cooling("a", "h2", "BTC-USD", 500)


def test_a_claim_is_one_write_and_cooldowns_are_read_once(tmp_path: Path) -> None:
    """claim = seen + mark in one statement; a cooldown is read from the file once
    per (agent, hook, scope) and written through, and survives a reopen."""
    store = HookStore(tmp_path / "h.sqlite3")
    assert store.claim("a", "k", 5) and not store.claim("a", "k", 6) and store.seen("a", "k")
    assert store.claim("b", "k", 5)  # per agent
    assert not store.cooling("a", "h1", "*", 10)  # read once: none
    store.start_cooldown("a", "h1", "*", until_ms=100)
    assert store.cooling("a", "h1", "*", 99)  # the write went through the cache
    statements: list[str] = []
    store._db.set_trace_callback(statements.append)
    assert store.cooling("a", "h1", "*", 50) and not store.cooling("a", "h1", "*", 100)
    assert statements == []  # answered from memory
    store.close()
    again = HookStore(tmp_path / "h.sqlite3")
    assert again.cooling("a", "h1", "*", 99) and again.seen("a", "k")


def test_a_key_and_a_cooldown_are_their_owners_own_until_a_replay_starts_over(
    tmp_path: Path,
) -> None:
    """A decision evaluated again after a crash (its audit rows lost) finds the key and
    the cooldown it took as its own, across a reopen; another hook or event does
    not; forgetting the marks (a replay started over) disowns them all."""
    store = HookStore(tmp_path / "h.sqlite3")
    assert store.claim("a", "k", 5, owner="h1 e1")
    store.start_cooldown("a", "h1", "*", until_ms=100, owner="e1")
    store.close()
    store = HookStore(tmp_path / "h.sqlite3")
    assert store.claim("a", "k", 5, owner="h1 e1")  # its own: again
    assert not store.claim("a", "k", 5, owner="h2 e1")  # another hook, same key
    assert not store.claim("a", "k", 6, owner="h1 e2") and not store.claim("a", "k", 6)
    assert not store.seen("a", "k", owner="h1 e1") and store.seen("a", "k", owner="h1 e2")
    assert not store.cooling("a", "h1", "*", 5, owner="e1")  # not in its own way
    assert store.cooling("a", "h1", "*", 6, owner="e2") and store.cooling("a", "h1", "*", 6)
    store.reset_applied()
    assert not store.claim("a", "k", 5, owner="h1 e1")
    assert store.cooling("a", "h1", "*", 5, owner="e1")
    store.close()


def test_a_store_from_before_owners_gets_the_column(tmp_path: Path) -> None:
    """An existing state dir's keys and cooldowns carry over, owned by nobody."""
    path = tmp_path / "h.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(
        "CREATE TABLE dedupe (agent TEXT NOT NULL, key TEXT NOT NULL,"
        " event_ms INTEGER NOT NULL, PRIMARY KEY (agent, key));"
        "CREATE TABLE cooldown (agent TEXT NOT NULL, hook TEXT NOT NULL,"
        " scope TEXT NOT NULL, until_ms INTEGER NOT NULL, PRIMARY KEY (agent, hook, scope));"
        "INSERT INTO dedupe VALUES ('a', 'k', 5); INSERT INTO cooldown VALUES ('a', 'h1', '*', 100);"
    )
    db.close()
    store = HookStore(path)
    assert not store.claim("a", "k", 5, owner="h1 e1") and store.seen("a", "k", owner="h1 e1")
    assert store.cooling("a", "h1", "*", 5, owner="e1")
    assert store.claim("a", "k2", 5, owner="h1 e1") and store.claim("a", "k2", 5, owner="h1 e1")
    store.close()


def test_pause_resume_round_trip(tmp_path: Path) -> None:
    """A CLI resume deletes the pause and leaves one request for the daemon."""
    store = HookStore(tmp_path / "h.sqlite3")
    store.pause("a", "h1", "boom")
    store.pause("a", AGENT_WIDE, "2 hooks paused")
    assert store.request_resume("a", "h1") is True
    assert store.request_resume("a", "h9") is False
    assert [(a, h) for a, h, _, _ in store.pauses()] == [("a", AGENT_WIDE)]
    assert sorted(store.take_resume_requests()) == [("a", "h1"), ("a", "h9")]
    assert store.take_resume_requests() == []


def test_dedupe_keys_are_bounded_per_agent_oldest_first(tmp_path: Path) -> None:
    """Unique keys forever cannot grow the store past the cap; the oldest go first and
    another agent's keys are untouched."""
    store = HookStore(tmp_path / "h.sqlite3", dedupe_max_keys=100)
    store.mark("calm", "keep-me", 1)
    for i in range(PRUNE_EVERY + 2):
        store.mark("flood", f"k{i}", 1_000 + i)
    (n,) = store._db.execute("SELECT COUNT(*) FROM dedupe WHERE agent='flood'").fetchone()
    assert n <= 100 + PRUNE_EVERY
    assert store.prune_dedupe("flood", 2_000) >= 0
    (n,) = store._db.execute("SELECT COUNT(*) FROM dedupe WHERE agent='flood'").fetchone()
    assert n == 100
    assert not store.seen("flood", "k0") and store.seen("flood", f"k{PRUNE_EVERY + 1}")
    assert store.seen("calm", "keep-me")
    store.close()


def test_the_cooldown_cache_is_bounded_and_stays_right(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("daemon.agents.store.MAX_COOLDOWNS_CACHED", 4)
    store = HookStore(tmp_path / "h.sqlite3")
    store.start_cooldown("a", "h", "S0", until_ms=100)
    for i in range(1, 10):  # scopes a signal feed could invent
        assert not store.cooling("a", "h", f"S{i}", 50)
        assert len(store._cooldowns) <= 4
    assert store.cooling("a", "h", "S0", 50)  # read again from the table


def test_cooldowns_that_ended_past_the_retention_are_pruned(tmp_path: Path) -> None:
    """A cooldown row per hook and symbol: a signal feed naming ever new symbols must not
    grow the table for good. A cooldown that ended over ``dedupe_days`` ago goes with
    the sweep; a recent or running one stays (and still suppresses)."""
    store = HookStore(tmp_path / "h.sqlite3", dedupe_days=1)
    for i in range(50):
        store.start_cooldown("a", "h1", f"SYM{i}", until_ms=1000)
    store.start_cooldown("a", "h1", "RECENT", until_ms=2 * DAY)
    store.start_cooldown("a", "h1", "RUNNING", until_ms=10 * DAY)
    store.start_cooldown("b", "h1", "SYM0", until_ms=1000)  # another agent's: its own sweep
    for i in range(PRUNE_EVERY + 1):
        store.mark("a", f"k{i}", 3 * DAY)
    rows = store._db.execute("SELECT agent, scope FROM cooldown ORDER BY agent, scope").fetchall()
    assert rows == [("a", "RECENT"), ("a", "RUNNING"), ("b", "SYM0")]
    store.close()
    store = HookStore(tmp_path / "h.sqlite3", dedupe_days=1)
    assert store.cooling("a", "h1", "RUNNING", 3 * DAY)
    assert not store.cooling("a", "h1", "SYM3", 3 * DAY)
    store.close()
