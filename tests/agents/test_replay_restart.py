"""Replay restarts: resume after what the agents applied; --from-start starts over."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import anyio
import msgspec
import pytest

from daemon.agents.pipeline import open_agents
from daemon.app import build_feeds
from daemon.config import Config
from daemon.errors import StoreError
from daemon.service import Service
from feeds.synthetic import generate_candles
from tests.agents.test_pipeline import WAKE_EVERY, audit, workspace


def config(root: Path, agents: Path, csv: Path, speed: float) -> Config:
    return msgspec.convert(
        {
            "daemon": {"state_dir": str(root / "state")},
            "hooks": {"agents_dir": str(agents), "reload_seconds": 60},
            "feeds": {
                "replay": {"enabled": True, "path": str(csv), "symbol": "BTC-USD",
                           "timeframe": "1m", "speed": speed}
            },
        },
        Config,
    )  # fmt: skip


def hook_rows(root: Path) -> list[dict[str, object]]:
    return [r for r in audit(root) if r["type"] == "hook"]


async def run(cfg: Config, *, stop_after: int | None = None, from_start: bool = False) -> Service:
    svc = Service(cfg, build_feeds, components=[open_agents], from_start=from_start)
    root = Path(cfg.daemon.state_dir).parent

    async def stop() -> None:
        while len(hook_rows(root)) < (stop_after or 0):  # noqa: ASYNC110 (polls the audit file)
            await anyio.sleep(0.02)
        svc.request_stop()

    async with anyio.create_task_group() as tg:
        if stop_after is not None:
            tg.start_soon(stop)
        with anyio.fail_after(60):
            await svc.run()
        tg.cancel_scope.cancel()
    return svc


async def test_a_stopped_replay_resumes_and_from_start_starts_over(tmp_path: Path) -> None:
    csv = tmp_path / "c.csv"
    generate_candles(csv, seed=3, n=40, timeframe="1m")
    agents = workspace(tmp_path, {"wake_every.py": WAKE_EVERY})
    paced = config(tmp_path, agents, csv, speed=1200)  # 50 ms a candle

    await run(paced, stop_after=10)  # a SIGTERM part-way
    first = hook_rows(tmp_path)
    assert 10 <= len(first) < 40

    svc = await run(paced)  # resumes: fast-forwards what was applied, paces the rest
    rows = hook_rows(tmp_path)
    counts = Counter(r["eventId"] for r in rows)
    assert len(counts) == 40 and set(counts.values()) == {1}, "each candle evaluated once"
    assert [r["reason"] for r in rows] == [f"seen {i + 1}" for i in range(40)]
    stats = svc.status(running=False).feeds[0].stats
    assert stats["fast_forwarded"] == len(first)
    assert len({r["daemonRun"] for r in rows}) == 2

    await run(config(tmp_path, agents, csv, speed=0), from_start=True)
    again = hook_rows(tmp_path)[40:]
    assert [r["reason"] for r in again] == [f"seen {i + 1}" for i in range(40)]


async def test_a_different_replay_file_starts_over(tmp_path: Path) -> None:
    """The state dir remembers which file it replayed; another one resets state first."""
    agents = workspace(tmp_path, {"wake_every.py": WAKE_EVERY})
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    generate_candles(a, seed=1, n=10, timeframe="1m")
    generate_candles(b, seed=2, n=10, timeframe="1m")
    await run(config(tmp_path, agents, a, speed=0))
    await run(config(tmp_path, agents, b, speed=0))
    reasons = [r["reason"] for r in hook_rows(tmp_path)]
    assert reasons == [f"seen {i + 1}" for i in range(10)] * 2


async def test_a_cut_marker_does_not_start_over(tmp_path: Path) -> None:
    """A replay marker left empty or cut short (a kill -9 while an older version wrote
    it in place) does not name another file: the replay resumes. It had started
    over, re-evaluating every event against the agents' newer state. A FIFO in its
    place is not waited on, and is replaced."""
    agents = workspace(tmp_path, {"wake_every.py": WAKE_EVERY})
    csv = tmp_path / "a.csv"
    generate_candles(csv, seed=1, n=10, timeframe="1m")
    cfg = config(tmp_path, agents, csv, speed=0)
    await run(cfg)
    marker = tmp_path / "state" / "replay_source"
    for cut in ("", marker.read_text()[:12]):
        marker.write_text(cut)
        await run(cfg)
        assert len(hook_rows(tmp_path)) == 10, f"started over on {cut!r}"
    assert marker.read_text().startswith(str(csv.resolve()))
    marker.unlink()
    os.mkfifo(marker)  # a reader that opened it blocking would wait for a writer forever
    await run(cfg)
    assert len(hook_rows(tmp_path)) == 10 and marker.is_file()
    # A directory in its place: the start is refused saying so (it was a traceback).
    marker.unlink()
    marker.mkdir()
    svc = Service(cfg, build_feeds, components=[open_agents])
    with pytest.raises(StoreError, match="replay_source: cannot record the replay file"):
        await svc.run()


COUNT = """
def evaluate(event, state):
    prev = state["lastOutputs"].get("wake_count")
    n = (prev["data"]["n"] if prev else 0) + 1
    return {"decision": "IGNORE", "reason": "count " + str(n), "data": {"n": n}}
"""


async def test_last_outputs_carry_over_a_restart_and_replay_from_the_audit(
    tmp_path: Path,
) -> None:
    """A hook that counts through its own lastOutputs counts on after a SIGTERM as if
    never stopped (the outputs come back from the audit); --from-start counts from 1;
    `hooks test --from-audit` gives a hook the lastOutputs it had live."""
    from click.testing import CliRunner

    from daemon.cli.main import cli

    csv = tmp_path / "c.csv"
    generate_candles(csv, seed=5, n=30, timeframe="1m")
    agents = workspace(tmp_path, {"wake_count.py": COUNT})
    paced = config(tmp_path, agents, csv, speed=1200)
    paced = msgspec.structs.replace(
        paced, daemon=msgspec.structs.replace(paced.daemon, record=str(tmp_path / "rec.jsonl"))
    )
    await run(paced, stop_after=8)
    assert 8 <= len(hook_rows(tmp_path)) < 30
    await run(paced)
    rows = hook_rows(tmp_path)
    assert [r["reason"] for r in rows] == [f"count {i + 1}" for i in range(30)]
    assert rows[4]["output"] == {"decision": "IGNORE", "reason": "count 5", "data": {"n": 5}}

    cfg_file = tmp_path / "c.toml"
    cfg_file.write_text(
        f'[daemon]\nstate_dir = "{tmp_path / "state"}"\nrecord = "{tmp_path / "rec.jsonl"}"\n'
    )
    event_id = str(rows[20]["eventId"])
    args = ["hooks", "test", str(agents / "alpha"), "--from-audit", event_id,
            "--config", str(cfg_file)]  # fmt: skip
    # The CLI runs its own event loop: in a thread of its own, away from the test's.
    res = await anyio.to_thread.run_sync(lambda: CliRunner().invoke(cli, args))
    assert res.exit_code == 0, res.output
    (line,) = [msgspec.json.decode(ln) for ln in res.stdout.splitlines()]
    assert line["decision"]["reason"] == "count 21", "the state it had live"

    await run(config(tmp_path, agents, csv, speed=0), from_start=True)
    assert [r["reason"] for r in hook_rows(tmp_path)[30:]] == [f"count {i + 1}" for i in range(30)]


async def test_old_redeliveries_do_not_push_unmarked_evaluations_out_of_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a kill, the applied marks lag the audit rows; the events of that gap are
    known from the audit tail (a bounded window). A resumed replay re-publishes every
    event from the file's start: the old ones, already covered by the marks, must not
    take the window's places, or the gap is evaluated twice (seen under kill -9)."""
    from daemon.agents import dispatcher, manager
    from daemon.agents.store import HookStore
    from daemon.events import parse_iso_ms

    csv = tmp_path / "c.csv"
    generate_candles(csv, seed=6, n=30, timeframe="1m")
    agents = workspace(tmp_path, {"wake_every.py": WAKE_EVERY})
    cfg = config(tmp_path, agents, csv, speed=0)
    await run(cfg)
    rows = hook_rows(tmp_path)
    assert len(rows) == 30
    # As after a kill -9: the marks saved up to event 20, the audit holds all 30.
    store = HookStore(tmp_path / "state" / "hooks.sqlite3")
    ((partition, _),) = store.applied("alpha").items()
    mark = rows[19]
    store.save_applied(
        [("alpha", partition, parse_iso_ms(str(mark["eventTs"])), str(mark["eventId"]))]
    )
    store.close()
    for module in (dispatcher, manager):
        monkeypatch.setattr(module, "RECENT_EVENTS", 12)  # the window: events 19-30
    await run(cfg)
    counts = Counter(r["eventId"] for r in hook_rows(tmp_path))
    assert len(counts) == 30 and set(counts.values()) == {1}, "nothing evaluated twice"
