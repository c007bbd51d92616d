"""The service lifecycle: READY after feeds start, watchdog only while feeds live, drain."""

from __future__ import annotations

import socket
from collections.abc import Iterator, Sequence
from pathlib import Path

import anyio
import msgspec
import pytest
import structlog
import structlog.testing
from anyio.abc import TaskStatus

from daemon import state as state_mod
from daemon.bus import Subscription
from daemon.clock import ManualClock
from daemon.config import BusSection, Config, DaemonSection, StateSection
from daemon.events import MARKET_CANDLE_CLOSED, FeedEvent, decode, encode
from daemon.sdnotify import Notifier
from daemon.service import Service
from daemon.sqlite import open_sqlite
from daemon.statedir import SNAPSHOT_FILE
from daemon.status import Status, read_status
from daemon.walkeeper import BACKSTOP_PAGES, KEEPER
from feeds.base import Feed, FeedHealth, Publish
from tests.threads import on_loop_calls


class ListFeed:
    """A finite feed that publishes a fixed list, beating on every event (``gap``
    seconds apart, so the status loop can turn in between)."""

    def __init__(self, name: str, events: list[FeedEvent], gap: float = 0.0) -> None:
        self.name = name
        self.events = events
        self.gap = gap

    async def run(
        self, publish: Publish, health: FeedHealth, *, task_status: TaskStatus[None]
    ) -> None:
        task_status.started()
        for e in self.events:
            health.beat()
            await publish(e)
            if self.gap:
                await anyio.sleep(self.gap)


class SilentFeed:
    """A feed that starts and then never hears from its source again."""

    name = "silent"

    async def run(
        self, publish: Publish, health: FeedHealth, *, task_status: TaskStatus[None]
    ) -> None:
        task_status.started()
        await anyio.sleep_forever()


class NeverStartsFeed:
    """A feed waiting for its source before it reports started (Coinbase unreachable
    waits up to its startup timeout)."""

    name = "never"

    async def run(
        self, publish: Publish, health: FeedHealth, *, task_status: TaskStatus[None]
    ) -> None:
        await anyio.sleep_forever()
        task_status.started()  # pragma: no cover


def candle(i: int) -> FeedEvent:
    close_ms = 1_700_000_000_000 + 60_000 * (i + 1)
    return FeedEvent(
        event_id=f"t:BTC-USD:1m:{close_ms}",
        ts="2023-11-14T22:14:20.000Z",
        source="t",
        topic=MARKET_CANDLE_CLOSED,
        symbol="BTC-USD",
        timeframe="1m",
        payload={
            "open": 100.0 + i,
            "high": 102.0 + i,
            "low": 99.0 + i,
            "close": 101.0 + i,
            "volume": 1.0,
            "openTimeMs": close_ms - 60_000,
            "closeTimeMs": close_ms,
            "openTime": "",
            "closeTime": "",
        },
    )


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[tuple[socket.socket, dict[str, str]]]:
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.setblocking(False)
    yield sock, {"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "100000"}
    sock.close()


def drain(sock: socket.socket) -> list[str]:
    out = []
    while True:
        try:
            out.append(sock.recv(4096).decode())
        except BlockingIOError:
            return out


def make_config(tmp_path: Path, **daemon: object) -> Config:
    section = msgspec.convert({"state_dir": str(tmp_path / "state"), **daemon}, DaemonSection)
    return Config(daemon=section)


async def test_finite_feeds_run_to_end_record_and_notify(
    tmp_path: Path, notify_socket: tuple[socket.socket, dict[str, str]]
) -> None:
    """READY then STOPPING reach systemd; every event is recorded and reaches the state cache."""
    sock, env = notify_socket
    events = [candle(i) for i in range(30)]
    rec = tmp_path / "rec.jsonl"

    def feeds(_: Config) -> Sequence[Feed]:
        return [ListFeed("list", events)]

    svc = Service(make_config(tmp_path), feeds, record_path=rec, notifier=Notifier(env))
    with anyio.fail_after(5):
        status = await svc.run()
    msgs = drain(sock)
    assert msgs[0].startswith("READY=1")
    assert msgs[-1] == "STOPPING=1"
    assert [decode(line) for line in rec.read_bytes().splitlines()] == events
    assert svc.state.statistics()["candles_held"] == 30
    assert status.bus.published == 30 and not status.running
    on_disk = read_status(tmp_path / "state")  # the typed reader `marketwake status` uses
    assert on_disk.feeds[0].finished is True and on_disk.bus == status.bus


async def test_a_recording_past_its_bound_moves_aside_and_a_new_one_starts(
    tmp_path: Path,
) -> None:
    """``[daemon] record_max_mb``: the full file becomes ``<name>.1`` (the one before
    it dropped), so the disk holds at most twice the bound; the two replay in order."""
    events = [candle(i) for i in range(60)]
    size = len(encode(events[0])) + 1  # the shortest line (the others are a byte longer)
    rec = tmp_path / "rec.jsonl"

    def feeds(_: Config) -> Sequence[Feed]:
        return [ListFeed("list", events)]

    cfg = make_config(tmp_path, record_max_mb=25 * size / 1024 / 1024)
    with anyio.fail_after(5):
        await Service(cfg, feeds, record_path=rec).run()
    kept = tmp_path / "rec.jsonl.1"
    lines = kept.read_bytes().splitlines() + rec.read_bytes().splitlines()
    # 25 lines a file: the first 25 were dropped at the second move, 25..49 kept, then 10
    assert [decode(line) for line in lines] == events[25:]
    assert 25 * size <= kept.stat().st_size < 26 * size  # moved once it reached the bound
    # where it cannot be moved aside (a directory in the way), it records on, all kept
    rec.unlink()
    kept.unlink()
    kept.mkdir()
    with anyio.fail_after(5):
        await Service(cfg, feeds, record_path=rec).run()
    assert [decode(line) for line in rec.read_bytes().splitlines()] == events


async def test_a_finite_feed_ending_first_does_not_stop_a_daemon_with_a_live_feed(
    tmp_path: Path,
) -> None:
    """A replay that ends before the next feed has even started (an empty one): the
    daemon serves on for the live feed, and stops when asked."""

    def feeds(_: Config) -> Sequence[Feed]:
        return [ListFeed("empty", []), SilentFeed()]

    svc = Service(make_config(tmp_path), feeds)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(svc.run)
            await anyio.sleep(0.5)
            assert not svc._stop.is_set(), "it stopped with a live feed running"
            assert svc.finished == {"empty"} and not svc.feeds_finished()
            svc.request_stop()


async def test_watchdog_withheld_while_a_feed_is_stalled(
    tmp_path: Path, notify_socket: tuple[socket.socket, dict[str, str]]
) -> None:
    """A silent feed stops the WATCHDOG=1 pings so systemd can restart a zombie.

    The stall timer and the ping interval run on a manual clock: the test moves
    time, it does not wait for it (the short real waits only let tasks run)."""
    sock, env = notify_socket  # WATCHDOG_USEC=100000: a ping every 0.05 s of clock time
    clock = ManualClock(1_000.0)
    svc = Service(
        make_config(tmp_path, stall_seconds=10),
        lambda _: [SilentFeed()],
        notifier=Notifier(env),
        clock=clock,
    )
    seen: list[str] = []

    async def pings() -> int:
        for _ in range(200):  # up to 2 s of real time for the loop to get its turn
            await anyio.sleep(0.01)
            seen.extend(drain(sock))
            if seen.count("WATCHDOG=1"):
                break
        n = seen.count("WATCHDOG=1")
        seen.clear()
        return n

    async with anyio.create_task_group() as tg:
        tg.start_soon(svc.run)
        assert await pings() >= 1  # the first ping right after READY
        clock.advance(0.05)
        assert await pings() == 1  # one interval later, one more: the feed is 0.05 s silent
        clock.advance(10.0)  # silent for 10.05 s > stall_seconds
        assert await pings() == 0
        assert svc.stalled_feeds() == ["silent"]
        svc.request_stop()


async def test_a_stall_and_its_recovery_are_logged_once_each(tmp_path: Path) -> None:
    """Silent past stall_seconds: one WARNING naming the feed (not one per check);
    heard again: one INFO. Time is a manual clock."""
    clock = ManualClock(1_000.0)
    svc = Service(make_config(tmp_path, stall_seconds=10), lambda _: [SilentFeed()], clock=clock)

    async def settle() -> None:
        for _ in range(20):  # let the monitor loop take its turns
            await anyio.sleep(0.005)

    with structlog.testing.capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            tg.start_soon(svc.run)
            with anyio.fail_after(10):
                await svc.ready.wait()  # a slow start (a loaded machine) must not race us
            await settle()
            for _ in range(30):  # 30 s of silence, checked every second
                clock.advance(1.0)
                await settle()
            svc.health["silent"].beat()
            clock.advance(1.0)
            await settle()
            svc.request_stop()
    events = [
        (e["log_level"], e["event"], e["feed"])
        for e in logs
        if e["event"].startswith(("feed stalled", "feed recovered"))
    ]
    assert events == [
        ("warning", "feed stalled: nothing heard from its source", "silent"),
        ("info", "feed recovered", "silent"),
    ]
    stalled = next(e for e in logs if e["event"].startswith("feed stalled"))
    assert stalled["stall_seconds"] == 10 and 10 < stalled["silent_seconds"] <= 12


async def test_state_cache_survives_a_restart(tmp_path: Path) -> None:
    """Indicators continue across runs: the snapshot is written at stop and read at start."""
    cfg = make_config(tmp_path)
    first = Service(cfg, lambda _: [ListFeed("a", [candle(i) for i in range(20)])])
    await first.run()
    second = Service(cfg, lambda _: [ListFeed("b", [candle(i) for i in range(20, 25)])])
    await second.run()
    series = second.state.series("BTC-USD", "1m")
    assert series is not None and len(series.candles) == 25


async def test_without_the_shared_state_nothing_is_kept_nor_warmed_from(tmp_path: Path) -> None:
    """[state] shared = false: the daemon's own cache stays empty, and a snapshot an
    earlier run left is removed at the stop (no later start warms up from it)."""
    cfg = make_config(tmp_path)
    await Service(cfg, lambda _: [ListFeed("a", [candle(i) for i in range(20)])]).run()
    snapshot = tmp_path / "state" / SNAPSHOT_FILE
    assert snapshot.exists()
    alone = msgspec.structs.replace(
        cfg,
        state=StateSection(shared=False),
        hooks=msgspec.structs.replace(cfg.hooks, run_agents=False),
    )
    second = Service(alone, lambda _: [ListFeed("b", [candle(i) for i in range(20, 25)])])
    status = await second.run()
    assert second.state.series("BTC-USD", "1m") is None and status.bus.published == 5
    assert status.bus.delivered == 0  # no subscriber: the cache took nothing
    assert not snapshot.exists()
    third = Service(cfg, lambda _: [ListFeed("c", [candle(i) for i in range(25, 27)])])
    await third.run()
    series = third.state.series("BTC-USD", "1m")
    assert series is not None and len(series.candles) == 2  # cold: only its own


async def test_status_is_live_over_the_control_socket(tmp_path: Path) -> None:
    """While the daemon runs, `status` asks it (not the minute-old file); the socket is
    the daemon user's only, a bad or silent client gets nothing and harms nothing,
    and the socket is gone after the stop."""
    from daemon.control import CONTROL_SOCKET, ask
    from daemon.copytrade.book import BookSnapshot, LiveBook

    svc = Service(make_config(tmp_path, status_interval_seconds=3600), lambda _: [SilentFeed()])
    path = tmp_path / "state" / CONTROL_SOCKET
    async with anyio.create_task_group() as tg:
        tg.start_soon(svc.run)
        with anyio.fail_after(10):
            while not path.exists():  # noqa: ASYNC110 - waiting for the daemon's start
                await anyio.sleep(0.01)
        assert oct(path.stat().st_mode & 0o777) == "0o600"
        silent = await anyio.connect_unix(str(path))  # sends nothing: cut after 2 s
        first = await anyio.to_thread.run_sync(ask, path, "status")
        assert first is not None
        live = msgspec.json.decode(first, type=Status)
        assert live.running and [f.name for f in live.feeds] == ["silent"]
        await anyio.sleep(0.05)
        second = await anyio.to_thread.run_sync(ask, path, "status")
        assert second is not None
        again = msgspec.json.decode(second, type=Status)
        assert again.written_at > live.written_at  # built per request, not the file
        async with await anyio.connect_unix(str(path)) as bad:
            await bad.send(b"\xff\x00 shutdown please\n")
            answer = await bad.receive()
        assert b"unknown request" in answer and b"'copytrade'" in answer
        book = await anyio.to_thread.run_sync(ask, path, "copytrade")
        assert book is not None
        assert msgspec.json.decode(book, type=LiveBook) == LiveBook(book=BookSnapshot())
        await silent.aclose()
        svc.request_stop()
    assert not path.exists()
    assert ask(path, "status") is None


async def test_a_stop_during_the_start_does_not_wait_for_a_feed_to_start(
    tmp_path: Path, notify_socket: tuple[socket.socket, dict[str, str]]
) -> None:
    """Ctrl-C while a feed is still starting: the daemon stops at once, and is never
    announced READY (to the log or to systemd)."""
    sock, env = notify_socket

    def feeds(_: Config) -> Sequence[Feed]:
        return [SilentFeed(), NeverStartsFeed()]

    svc = Service(make_config(tmp_path), feeds, notifier=Notifier(env))
    with structlog.testing.capture_logs() as logs, anyio.fail_after(3):
        async with anyio.create_task_group() as tg:
            tg.start_soon(svc.run)
            await anyio.sleep(0.3)
            assert "silent" in svc.health and not svc.ready.is_set()
            svc.request_stop()
    events = [entry["event"] for entry in logs]
    assert "stopped during the start" in events and "daemon ready" not in events
    assert not any(m.startswith("READY=1") for m in drain(sock))


class EndlessFeed:
    """Publishes candles until stopped, counting what each publish returned from."""

    name = "endless"

    def __init__(self) -> None:
        self.sent = 0

    async def run(
        self, publish: Publish, health: FeedHealth, *, task_status: TaskStatus[None]
    ) -> None:
        task_status.started()
        for i in range(1_000_000):
            health.beat()
            await publish(candle(i))
            self.sent += 1


async def test_a_stop_while_held_back_leaves_no_delivered_event_uncounted(tmp_path: Path) -> None:
    """A feed stopped while a slow subscriber holds it back has counted every event
    that subscriber got (a backtest's report counts the replay's events)."""
    feed = EndlessFeed()
    got = 0

    async def slow(sub: Subscription) -> None:
        nonlocal got
        async for _ in sub:
            got += 1
            await anyio.sleep(0.002)

    cfg = msgspec.structs.replace(make_config(tmp_path), bus=BusSection(queue_size=4))
    svc = Service(cfg, lambda _: [feed], consumers=[("slow", slow)])
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(svc.run)
            await anyio.sleep(0.2)
            svc.request_stop()
    assert feed.sent > 8 and got == feed.sent


async def test_a_state_dir_that_takes_no_status_or_snapshot_does_not_stop_the_daemon(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk made the first status write after READY raise out of the status loop,
    and the daemon stopped (its cause hidden behind the audit's error). Here the status
    temp file is a directory and the snapshot's disk is full: each failure is logged
    once and the run goes to its end."""
    state = tmp_path / "state"
    (state / "status.json.tmp").mkdir(parents=True)

    def full(path: Path, data: bytes) -> None:
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(state_mod, "write_atomic", full)
    events = [candle(i) for i in range(20)]
    svc = Service(
        make_config(tmp_path, status_interval_seconds=0.01),
        lambda _: [ListFeed("slow", events, gap=0.01)],
    )
    with structlog.testing.capture_logs() as logs, anyio.fail_after(10):
        status = await svc.run()
    assert status.bus.published == 20 and not status.running
    said = [e["event"] for e in logs if e["log_level"] in ("error", "warning")]
    assert said == [
        "status.json not written; `marketwake status` asks the running daemon",
        "state snapshot not written",
    ]
    assert not (state / "status.json").exists()


async def test_the_periodic_status_is_written_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """status.json's write and rename took 610 ms once on a busy disk, holding every
    feed and hook: the periodic writes happen in a worker thread (the first, before
    READY, and the last, at the stop, on the loop: nothing else runs then)."""
    from daemon import service as service_mod

    on_loop = on_loop_calls(monkeypatch, service_mod, "write_status")
    events = [candle(i) for i in range(20)]
    cfg = make_config(tmp_path, status_interval_seconds=0.05)
    svc = Service(cfg, lambda _: [ListFeed("list", events, gap=0.02)])
    with anyio.fail_after(10):
        await svc.run()
    assert len(on_loop) >= 4
    assert on_loop[0] and on_loop[-1] and not any(on_loop[1:-1])
    assert read_status(tmp_path / "state").bus.published == 20


async def test_the_service_checkpoints_its_durable_stores_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A durable store written on the loop only appends to its WAL while the service
    runs: the WAL keeper checkpoints it, and restarts the WAL, from a worker thread
    (docs/daemon.md, "Event loop stalls")."""
    monkeypatch.setattr(KEEPER, "interval", 0.05)
    db = open_sqlite(tmp_path / "x.sqlite3", "test store", schema="CREATE TABLE t (x);")
    pages: list[int] = []

    async def writer(sub: Subscription) -> None:
        async for _ in sub:
            db.execute("INSERT INTO t VALUES (1)")
            pages.append(db.execute("PRAGMA wal_autocheckpoint").fetchone()[0])

    kept = KEEPER.stats.restarts
    events = [candle(i) for i in range(30)]
    svc = Service(
        make_config(tmp_path),
        lambda _: [ListFeed("list", events, gap=0.02)],
        consumers=[("w", writer)],
    )
    with anyio.fail_after(10):
        await svc.run()
    assert pages == [BACKSTOP_PAGES] * 30  # (the store does not checkpoint itself)
    assert KEEPER.stats.restarts > kept
    assert db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 1000  # (stopped)
    db.close()


async def test_copytrade_status_reads_the_snapshot_when_the_daemon_gives_no_book(
    tmp_path: Path,
) -> None:
    """A daemon that answers the control socket with something other than a book (an
    older one: 'unknown request'; garbage) leaves `copytrade status` on the snapshot,
    as it would with no daemon at all."""
    from daemon.cli.copytrade import gather
    from daemon.control import CONTROL_SOCKET, serve_control
    from daemon.statedir import StateDirLock

    state = tmp_path / "state"
    state.mkdir()
    for answers in ({"status": lambda: b"{}"}, {"copytrade": lambda: b"\xff not json"}):
        with StateDirLock(state):
            async with anyio.create_task_group() as tg:
                await tg.start(serve_control, state / CONTROL_SOCKET, answers)
                data = await anyio.to_thread.run_sync(
                    lambda: gather(Config(), 0, state, tmp_path / "agents")
                )
                tg.cancel_scope.cancel()
        assert (data["positionsAsOf"], data["positions"]) == (None, [])  # no snapshot either
