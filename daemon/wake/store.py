"""Run history and pending runs in SQLite, so budgets, cooldowns and queued wakes
survive a restart.

One row per run: started when the runner is called, finished when it returns.
A run the daemon never saw finish (a crash) counts as finished when it
started, so the cooldown is not skipped. Nothing reads further back than the
day's cost cap (00:00 UTC) and the hourly budget: rows older than
``keep_seconds`` (two days) are pruned as runs start, and a finished run's
wakes (its ``body``, ~1 KB: only a run a stop cut is read back for them) are
dropped as it finishes, so the file stays ~150 bytes a run of the last two
days.

A run that is still waiting (its wakes were recorded ``queued``) is written
through to ``wake_pending`` each time it changes and deleted just before it
starts (a crash in between loses that run rather than paying for it twice),
so a stop or a crash does not lose it. Writes are single small statements in
WAL mode (well under a millisecond), so they run inline.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any, Literal, NamedTuple

from daemon.errors import StoreError
from daemon.sqlite import add_columns, open_sqlite
from daemon.wake.context import Usage
from daemon.wake.leftovers import ProcessMark

FILE_NAME = "wake.sqlite3"
PRUNE_EVERY_SECONDS = 3600.0  # of run start times (event time in a replay)
KEEP_SECONDS = 2 * 86400.0  # run history kept (older rows pruned, the next hour's prune)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS wake_runs (
    run_id TEXT PRIMARY KEY,
    agent_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    started_at REAL NOT NULL,
    finished_at REAL,
    status TEXT NOT NULL DEFAULT 'started',
    cost REAL NOT NULL DEFAULT 0,
    tokens_in INTEGER NOT NULL DEFAULT 0,
    tokens_out INTEGER NOT NULL DEFAULT 0,
    body BLOB,
    pid INTEGER,
    pid_started INTEGER,
    pid_boot TEXT,
    counted INTEGER NOT NULL DEFAULT 1
);
CREATE INDEX IF NOT EXISTS wake_runs_agent ON wake_runs (agent_id, kind, started_at);
CREATE INDEX IF NOT EXISTS wake_runs_started ON wake_runs (started_at);
CREATE TABLE IF NOT EXISTS wake_pending (
    run_id TEXT PRIMARY KEY,
    agent_id TEXT NOT NULL,
    due_at REAL NOT NULL,
    body BLOB NOT NULL
);
"""


class Unfinished(NamedTuple):
    """A run the store shows started and never finished."""

    run_id: str
    started_at: float
    kind: str
    body: bytes | None  # its wakes (None: not kept, an older store or an audit run)
    process: ProcessMark | None = None  # its command runner's program, while it ran
    usage: Usage = (0.0, 0, 0)  # what it had spent when it was cut, as far as reported


class RunStore:
    """Persisted run starts and finishes of every agent."""

    def __init__(
        self,
        path: Path,
        *,
        keep_seconds: float = KEEP_SECONDS,
        synchronous: Literal["OFF", "NORMAL"] = "NORMAL",
    ) -> None:
        self.path = Path(path)
        self.keep_seconds = keep_seconds
        # Not durable (a backtest's scratch dir): queued runs are written at a clean
        # stop only, not as they queue and start (a crash may lose them anyway).
        self.durable = synchronous != "OFF"
        self._lock = threading.Lock()
        self._pruned_at = float("-inf")  # history is dropped at most once per PRUNE_EVERY
        self._db = open_sqlite(
            self.path, "wake run store", schema=_SCHEMA, synchronous=synchronous, batch=True
        )
        self._add_columns()

    def _add_columns(self) -> None:
        """Columns older stores lack: the usage (from before LLM runs; zeros), the
        body (from before runs kept their wakes; NULL: the run's wakes are unknown),
        the program's process (NULL: none known) and whether the run took a place in
        the hourly budget (1: every run did)."""
        zero = "NOT NULL DEFAULT 0"
        columns = {
            "cost": f"REAL {zero}",
            "tokens_in": f"INTEGER {zero}",
            "tokens_out": f"INTEGER {zero}",
            "body": "BLOB",
            "pid": "INTEGER",
            "pid_started": "INTEGER",
            "pid_boot": "TEXT",
            "counted": "INTEGER NOT NULL DEFAULT 1",
        }
        try:
            with self._lock:
                add_columns(self._db, "wake_runs", columns)
        except sqlite3.Error as exc:
            raise StoreError(f"wake run store {self.path}: {exc}") from None

    @classmethod
    def in_dir(cls, state_dir: Path, synchronous: Literal["OFF", "NORMAL"] = "NORMAL") -> RunStore:
        """The store under a daemon state directory."""
        return cls(Path(state_dir) / FILE_NAME, synchronous=synchronous)

    def _exec(self, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
        try:
            with self._lock:
                return self._db.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"wake run store {self.path}: {exc}") from None

    def record_start(
        self,
        agent_id: str,
        run_id: str,
        kind: str,
        started_at: float,
        queued: bool = False,
        body: bytes | None = None,
        counted: bool = True,
    ) -> None:
        """A run began (``queued``: and leaves the queued runs, in the same transaction,
        so a crash leaves it either queued or started, never neither), with ``body``
        (its wakes, as a pending run's: what a restart reads of a run a stop cut);
        ``counted``: it took a place in the hourly budget. Also drops history nobody
        needs any more."""
        start = (
            "INSERT OR REPLACE INTO wake_runs (run_id, agent_id, kind, started_at, body, counted)"
            " VALUES (?,?,?,?,?,?)"
        )
        row = (run_id, agent_id, kind, started_at, body, int(counted))
        try:
            with self._lock:
                if not queued:  # one statement: atomic by itself
                    self._db.execute(start, row)
                else:
                    with self._db.atomic():
                        self._db.execute(start, row)
                        self._db.execute("DELETE FROM wake_pending WHERE run_id = ?", (run_id,))
        except sqlite3.Error as exc:
            raise StoreError(f"wake run store {self.path}: {exc}") from None
        if abs(started_at - self._pruned_at) >= PRUNE_EVERY_SECONDS:
            self._pruned_at = started_at
            self._exec(
                "DELETE FROM wake_runs WHERE started_at < ?", (started_at - self.keep_seconds,)
            )

    def record_finish(
        self,
        run_id: str,
        finished_at: float,
        status: str,
        usage: Usage | None = (0.0, 0, 0),
    ) -> None:
        """A run ended with ``status``, having used ``usage`` = (cost, tokens in, out);
        None keeps what :meth:`record_usage` reported (a run a stop cut). Its wakes
        are dropped: only an unfinished run is read back for them."""
        if usage is None:
            self._exec(
                "UPDATE wake_runs SET finished_at = ?, status = ?, body = NULL WHERE run_id = ?",
                (finished_at, status, run_id),
            )
            return
        self._exec(
            "UPDATE wake_runs SET finished_at = ?, status = ?, body = NULL, cost = ?,"
            " tokens_in = ?, tokens_out = ? WHERE run_id = ?",
            (finished_at, status, *usage, run_id),
        )

    def record_usage(self, run_id: str, usage: Usage) -> None:
        """What a run in flight has spent so far: a kill before its end leaves it
        counted (``max_cost_per_day`` reads the store at a start)."""
        self._exec(
            "UPDATE wake_runs SET cost = ?, tokens_in = ?, tokens_out = ? WHERE run_id = ?",
            (*usage, run_id),
        )

    def record_process(self, run_id: str, process: ProcessMark) -> None:
        """The run's program started as ``process`` (what a restart after a kill stops
        if it is still running)."""
        self._exec(
            "UPDATE wake_runs SET pid = ?, pid_started = ?, pid_boot = ? WHERE run_id = ?",
            (process.pid, process.started, process.boot, run_id),
        )

    def unfinished(self, agent_id: str) -> list[Unfinished]:
        """The agent's runs that started and never finished (a stop during them),
        oldest first."""
        rows = self._exec(
            "SELECT run_id, started_at, kind, body, pid, pid_started, pid_boot, cost, tokens_in,"
            " tokens_out FROM wake_runs WHERE agent_id = ? AND finished_at IS NULL"
            " ORDER BY started_at",
            (agent_id,),
        )
        return [
            Unfinished(
                str(r[0]),
                float(r[1]),
                str(r[2]),
                None if r[3] is None else bytes(r[3]),
                # (a value that is not an integer, in a damaged store: no process known)
                ProcessMark(r[4], r[5], str(r[6] or ""))
                if type(r[4]) is int and type(r[5]) is int
                else None,
                _usage(r[7], r[8], r[9]),
            )
            for r in rows
        ]

    def usage_since(self, agent_id: str, since: float) -> tuple[int, float, int, int]:
        """(runs, cost, tokens in, tokens out) of the agent's runs started after ``since``."""
        rows = self._exec(
            "SELECT COUNT(*), COALESCE(SUM(cost), 0), COALESCE(SUM(tokens_in), 0),"
            " COALESCE(SUM(tokens_out), 0) FROM wake_runs WHERE agent_id = ? AND started_at >= ?",
            (agent_id, since),
        )
        runs, cost, tin, tout = rows[0]
        return int(runs), float(cost), int(tin), int(tout)

    def starts_since(self, agent_id: str, since: float, kind: str = "wake") -> list[float]:
        """Start times of the ``kind`` runs after ``since`` that took a place in the
        hourly budget, oldest first."""
        rows = self._exec(
            "SELECT started_at FROM wake_runs WHERE agent_id = ? AND kind = ? AND started_at > ?"
            " AND counted = 1 ORDER BY started_at",
            (agent_id, kind, since),
        )
        return [float(r[0]) for r in rows]

    def last_finish(self, agent_id: str, kind: str = "wake") -> float | None:
        """When the agent's latest ``kind`` run ended (its start, if it never ended)."""
        rows = self._exec(
            "SELECT MAX(COALESCE(finished_at, started_at)) FROM wake_runs"
            " WHERE agent_id = ? AND kind = ?",
            (agent_id, kind),
        )
        return None if rows[0][0] is None else float(rows[0][0])

    def last_start(self, agent_id: str) -> float | None:
        """When any run of the agent last started."""
        rows = self._exec("SELECT MAX(started_at) FROM wake_runs WHERE agent_id = ?", (agent_id,))
        return None if rows[0][0] is None else float(rows[0][0])

    def save_pending(self, agent_id: str, run_id: str, due_at: float, body: bytes) -> None:
        """Write (or overwrite) a run that is waiting to start."""
        self._exec(
            "INSERT OR REPLACE INTO wake_pending (run_id, agent_id, due_at, body) VALUES (?,?,?,?)",
            (run_id, agent_id, due_at, body),
        )

    def drop_pending(self, run_id: str) -> None:
        """The run started or was dropped: forget it."""
        self._exec("DELETE FROM wake_pending WHERE run_id = ?", (run_id,))

    def pending(self, agent_id: str) -> list[tuple[str, float, bytes]]:
        """The agent's waiting runs as (run_id, due_at, body), in due order."""
        rows = self._exec(
            "SELECT run_id, due_at, body FROM wake_pending WHERE agent_id = ?"
            " ORDER BY due_at, rowid",
            (agent_id,),
        )
        return [(str(r[0]), float(r[1]), bytes(r[2])) for r in rows]

    def clear_pending(self) -> int:
        """Forget every waiting run (a replay started over); returns how many."""
        n = self._exec("SELECT COUNT(*) FROM wake_pending")[0][0]
        self._exec("DELETE FROM wake_pending")
        return int(n)

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._db.close()


def _usage(cost: object, tokens_in: object, tokens_out: object) -> Usage:
    """A row's usage; a value of another type (a damaged store) reads as none."""
    if isinstance(cost, int | float) and type(tokens_in) is int and type(tokens_out) is int:
        return float(cost), tokens_in, tokens_out
    return 0.0, 0, 0
