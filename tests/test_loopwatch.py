"""Event loop stalls: counted, kept for status, logged at most once per quiet period."""

from __future__ import annotations

import importlib
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest
import structlog.testing

from daemon.bus import Subscription
from daemon.cli.run import _render_status
from daemon.config import Config
from daemon.errors import StoreError
from daemon.loopwatch import LoopWatch
from daemon.service import Service
from daemon.status import read_status
from feeds.base import Feed
from tests.test_service import ListFeed, candle, make_config


class Done(Exception):
    """The fake sleep's script has ended."""


class Clocks:
    def __init__(self) -> None:
        self.mono = 100.0
        self.wall = 1_764_000_000.0


def test_a_late_wake_is_a_stall_and_the_warnings_are_spaced() -> None:
    c = Clocks()
    watch = LoopWatch(threshold=0.25, quiet=60, now=lambda: c.mono, wall=lambda: c.wall)
    with structlog.testing.capture_logs() as logs:
        watch.observe(0.249, 0.2)  # under the threshold: not a stall
        watch.observe(0.8, 0.79)
        c.mono += 10
        watch.observe(0.3, 0.3)  # within the quiet period: counted, not logged
        c.mono += 10
        c.wall += 20
        watch.observe(0.5, 0.5)
        c.mono += 45  # 65 s after the first warning
        watch.observe(0.26, 0.01)
    warnings = [e for e in logs if e["event"].startswith("event loop stalled")]
    logged = [(e["stalled_ms"], e["loop_cpu_ms"], e["stalls_not_logged"]) for e in warnings]
    assert logged == [(800, 790, 0), (260, 10, 2)]
    assert all(e["log_level"] == "warning" and e["threshold_ms"] == 250 for e in warnings)
    assert all(e["at"] == "unknown" for e in warnings)  # (observed without the sampler)
    st = watch.status()
    assert (st.stalls, st.longest_ms, st.last_ms) == (4, 800.0, 260.0)
    assert st.last_at == "2025-11-24T16:00:20.000Z"
    assert LoopWatch().status().last_at == ""  # no stall yet: no time


async def test_the_watch_measures_its_own_wakes() -> None:
    """run(): each sleep's lateness beyond its interval is what it observes."""
    c = Clocks()
    lateness = iter([0.0, 0.02, 0.7])

    async def sleep(seconds: float) -> None:
        late = next(lateness, None)
        if late is None:
            raise Done
        c.mono += seconds + late
        await anyio.lowlevel.checkpoint()

    watch = LoopWatch(interval=0.1, now=lambda: c.mono, sleep=sleep, sample=False)
    with pytest.raises(Done):
        await watch.run()
    assert watch.stalls == 1 and round(watch.longest, 3) == 0.7


async def test_a_consumer_that_blocks_the_loop_shows_in_the_log_and_the_status(
    tmp_path: Path,
) -> None:
    """A real service: a subscriber that holds the loop 0.6 s (a synchronous call)
    is one stall, logged, in status.json and in `marketwake status`."""
    events = [candle(i) for i in range(12)]

    def feeds(_: Config) -> Sequence[Feed]:
        return [ListFeed("list", events, gap=0.05)]

    async def blocking(sub: Subscription) -> None:
        n = 0
        async for _ in sub:
            n += 1
            if n == 6:  # ~0.3 s in: the watch is measuring by then
                time.sleep(0.6)  # noqa: ASYNC251 - the point of the test

    svc = Service(make_config(tmp_path), feeds, consumers=[("blocking", blocking)])
    with structlog.testing.capture_logs() as logs, anyio.fail_after(10):
        await svc.run()
    warned = [e for e in logs if e["event"].startswith("event loop stalled")]
    assert len(warned) == 1 and warned[0]["stalled_ms"] >= 300
    assert warned[0]["loop_cpu_ms"] < 200  # time.sleep() holds the loop without CPU
    # Where the loop was, innermost first: the subscriber that blocked it.
    assert warned[0]["at"].startswith("tests/test_loopwatch.py:"), warned[0]["at"]
    assert " blocking < " in warned[0]["at"]
    st = read_status(tmp_path / "state")
    assert st.loop is not None and st.loop.stalls == 1 and st.loop.longest_ms >= 300
    shown = _render_status(st, None)
    assert "event loop: 1 stall of 250 ms or more" in shown


async def test_a_stall_in_an_import_names_the_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A module imported on the loop (an SDK's was, at a first run): the warning
    names it, not the import system's own frames."""
    (tmp_path / "slow_to_import.py").write_text("import time\n\ntime.sleep(0.6)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "slow_to_import", raising=False)
    watch = LoopWatch()
    with structlog.testing.capture_logs() as logs, anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch.run)
            await anyio.sleep(0.3)
            importlib.import_module("slow_to_import")
            await anyio.sleep(0.3)
            tg.cancel_scope.cancel()
    (warned,) = [e for e in logs if e["event"].startswith("event loop stalled")]
    at = warned["at"].split(" < ")
    assert at[0].endswith("slow_to_import.py:3 <module>") and at[1] == "import slow_to_import"
    assert not any("<frozen" in frame for frame in at)


async def test_a_status_files_loop_part_that_is_not_one_is_refused_or_shown_escaped(
    tmp_path: Path,
) -> None:
    """`loop` as status.json has it, edited by hand or damaged: a wrong type is refused
    naming the field; control characters in `last_at` are shown escaped."""
    events = [candle(i) for i in range(3)]
    await Service(make_config(tmp_path), lambda _: [ListFeed("list", events)]).run()
    path = tmp_path / "state" / "status.json"
    written = json.loads(path.read_bytes())
    written["loop"] = {"threshold_ms": "nope"}
    path.write_text(json.dumps(written))
    with pytest.raises(StoreError, match=r"\$\.loop\.threshold_ms"):
        read_status(tmp_path / "state")
    written["loop"] = {"threshold_ms": 250, "stalls": 2, "last_at": "\x1b[2Jgone"}
    path.write_text(json.dumps(written))
    shown = _render_status(read_status(tmp_path / "state"), None)
    assert "\x1b" not in shown and "\\x1b[2Jgone" in shown
