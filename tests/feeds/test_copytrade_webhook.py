"""The copy-trade webhook on loopback: signed requests in, events out, every refusal audited."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from daemon.audit.records import SignalRecord
from daemon.errors import ConfigError
from daemon.events import FeedEvent
from feeds.base import FeedHealth
from feeds.config import CopytradeWebhookSection
from feeds.copytrade import CopytradeWebhookFeed
from tests.feeds.copytrade_client import SECRET, post, signal, signed_headers
from tests.loopback import until_closed


def section(**changes: object) -> CopytradeWebhookSection:
    raw = {"enabled": True, "port": 0, "leaders": {"alice": {"secret": SECRET}}} | changes
    from daemon.config import decode_hook

    return msgspec.convert(raw, CopytradeWebhookSection, dec_hook=decode_hook)


class Harness:
    def __init__(self, state_dir: Path, cfg: CopytradeWebhookSection) -> None:
        self.events: list[FeedEvent] = []
        self.audit: list[SignalRecord] = []
        self.feed = CopytradeWebhookFeed(cfg, state_dir, audit=self.audit.append)
        self.block = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.feed.port}/copytrade/alice"

    async def publish(self, event: FeedEvent) -> None:
        if self.block:
            await anyio.sleep_forever()  # the bus never takes it: a stop comes first
        self.events.append(event)

    async def settle(self) -> None:
        await anyio.sleep(0.05)


@asynccontextmanager
async def running(state_dir: Path, **changes: object) -> AsyncIterator[Harness]:
    h = Harness(state_dir, section(**changes))
    async with anyio.create_task_group() as tg:
        await tg.start(h.feed.run, h.publish, FeedHealth("copytrade_webhook"))
        yield h
        tg.cancel_scope.cancel()


async def test_a_signed_signal_is_published_once_and_audited(tmp_path: Path) -> None:
    async with running(tmp_path) as h:
        status, answer = await post(h.url, signal("s1"))
        assert (status, answer) == (200, {"status": "accepted", "eventId": "copytrade:alice:s1"})
        await h.settle()
        assert [e.event_id for e in h.events] == ["copytrade:alice:s1"]
        assert h.events[0].topic == "copytrade.signal.opened"
        # the leader retries the same signal (fresh nonce, fresh signature): a no-op
        status, answer = await post(h.url, signal("s1"))
        assert (status, answer["status"]) == (200, "duplicate")
        await h.settle()
        assert len(h.events) == 1
    assert [(r.status, r.signal_id) for r in h.audit] == [
        ("accepted", "s1"),
        ("duplicate", "s1"),
    ]
    assert h.feed.statistics() == {"accepted": 1, "duplicate": 1, "rejected": 0, "unrecorded": 0}


async def test_every_bad_request_is_a_4xx_with_a_reason_an_audit_row_and_no_event(
    tmp_path: Path,
) -> None:
    raw = json.dumps(signal("s9")).encode()
    replayed = signed_headers(raw)
    forged = signed_headers(raw, secret="not-alices-secret-at-all")
    stale = signed_headers(raw, at=time.time() - 3600)
    async with running(tmp_path) as h:
        assert (await post(h.url, raw, replayed))[0] == 200  # the original
        cases: list[tuple[str, bytes | dict[str, Any], dict[str, str] | None, int, str]] = [
            (h.url, raw, replayed, 409, "replayed"),
            (h.url, raw, forged, 401, "bad signature"),
            (h.url, raw, stale, 401, "stale timestamp"),
            (h.url, raw, {"content-type": "application/json"}, 401, "missing"),
            (h.url.replace("alice", "mallory"), raw, None, 404, "unknown leader"),
            (h.url, b"{not json", None, 400, "not JSON"),
            (h.url, signal("s10", side="sideways"), None, 422, "side must be"),
            (h.url, b" " * 70_000, None, 413, "body over 65536 bytes"),
        ]
        for url, body, headers, want, says in cases:
            status, answer = await post(url, body, headers)
            assert status == want and says in answer["reason"], (want, answer)
        await h.settle()
        assert [e.event_id for e in h.events] == ["copytrade:alice:s9"]
    rejected = [r for r in h.audit if r.status == "rejected"]
    assert [r.http_status for r in rejected] == [c[3] for c in cases]
    assert all(r.reason and r.remote == "127.0.0.1" for r in rejected)


async def test_a_slow_or_silent_client_holds_no_socket_or_handler_for_long(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connection that sends no complete headers is closed after REQUEST_SECONDS; a
    body trickled in slower than that is answered 408 (audited), and the door still
    answers everyone else."""
    from feeds.copytrade import door

    monkeypatch.setattr(door, "REQUEST_SECONDS", 0.5)
    async with running(tmp_path) as h:
        port = h.feed.port
        silent = await anyio.connect_tcp("127.0.0.1", port)
        half = await anyio.connect_tcp("127.0.0.1", port)
        await half.send(b"POST /copytrade/alice HTTP/1.1\r\nHost: x\r\n")
        slow = await anyio.connect_tcp("127.0.0.1", port)
        await slow.send(
            b"POST /copytrade/alice HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nx"
        )
        with anyio.fail_after(5):
            for quiet in (silent, half):  # closed by the server, unanswered
                assert await until_closed(quiet) == b""
            answer = b""
            while b"\r\n\r\n" not in answer:  # 408 long before the body could end
                answer += await slow.receive()
        assert answer.startswith(b"HTTP/1.1 408 ")
        for stream in (silent, half, slow):
            await stream.aclose()
        status, _ = await post(h.url, signal("s1"))
        assert status == 200
    assert [(r.http_status, r.reason) for r in h.audit if r.status == "rejected"] == [
        (408, "body not received within 0.5 s")
    ]


async def test_past_max_connections_a_new_one_is_closed_and_the_door_recovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With MAX_CONNECTIONS open, the next connection is answered 503 and closed at once (a flood costs
    the door, not the daemon's file descriptors); once one closes, requests are
    served again."""
    from feeds.copytrade import door

    monkeypatch.setattr(door, "MAX_CONNECTIONS", 3)
    async with running(tmp_path) as h:
        held = [await anyio.connect_tcp("127.0.0.1", h.feed.port) for _ in range(3)]
        await anyio.sleep(0.1)  # each is made (and counted) on the server's side
        extra = await anyio.connect_tcp("127.0.0.1", h.feed.port)
        answer = await until_closed(extra)  # a busy server's answer, then the end
        assert answer.startswith(b"HTTP/1.1 503 ") and b"Retry-After: 1" in answer
        await extra.aclose()
        await held.pop().aclose()
        await anyio.sleep(0.1)
        status, _ = await post(h.url, signal("s1"))
        assert status == 200
        for stream in held:
            await stream.aclose()


async def test_a_signal_stored_but_not_published_is_published_at_the_next_start(
    tmp_path: Path,
) -> None:
    """The answer goes out once the signal is on disk; a stop before the bus took it
    (here: the bus never does) leaves it to the next start, under the same event id.
    Recent signals are delivered again at start (an agent may not have finished
    them); older published ones are not."""
    async with running(tmp_path) as h:
        h.block = True
        assert (await post(h.url, signal("s1")))[0] == 200
        assert (await post(h.url, signal("s2", "closed")))[0] == 200
        await h.settle()
        assert h.events == []
    async with running(tmp_path) as again:
        await again.settle()
        assert [e.event_id for e in again.events] == ["copytrade:alice:s1", "copytrade:alice:s2"]
        # and a redelivery of either is still a duplicate
        assert (await post(again.url, signal("s2", "closed")))[1]["status"] == "duplicate"
    async with running(tmp_path, redeliver_seconds=0) as third:
        await third.settle()
        assert third.events == []  # published, and none is recent enough to deliver again
    async with running(tmp_path) as fourth:  # the last 10 minutes' signals come again
        await fourth.settle()
        assert [e.event_id for e in fourth.events] == ["copytrade:alice:s1", "copytrade:alice:s2"]


async def test_a_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        h = Harness(tmp_path, section(port=port))
        with pytest.raises(ConfigError, match=f"cannot listen on 127.0.0.1:{port}"):
            await h.feed.run(h.publish, FeedHealth("x"), task_status=anyio.TASK_STATUS_IGNORED)


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"leaders": {}}, "no [feeds.copytrade_webhook.leaders"),
        ({"leaders": {"a/b": {"secret": SECRET}}}, "leader name 'a/b'"),
        ({"leaders": {"alice": {"secret": "short"}}}, "at least 16 characters"),
        ({"skew_seconds": 1}, ">= 5"),
    ],
)
def test_bad_settings_say_what_to_change(changes: dict[str, object], says: str) -> None:
    with pytest.raises(msgspec.ValidationError, match=None) as err:
        section(**changes)
    assert says in str(err.value)


async def test_a_reload_rebinds_the_port_and_applies_new_leaders(tmp_path: Path) -> None:
    """SIGHUP restarts the feeds: the old server lets go of the port before the new one
    binds it, and a leader added to the config is accepted at once."""
    from daemon import config as config_mod
    from daemon.app import build_feeds
    from daemon.service import Service

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = tmp_path / "c.toml"

    def write(leaders: str) -> None:
        path.write_text(
            f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n[hooks]\nenabled = false\n'
            f"[feeds.copytrade_webhook]\nenabled = true\nport = {port}\n{leaders}"
        )

    write(f'[feeds.copytrade_webhook.leaders.alice]\nsecret = "{SECRET}"\n')
    svc = Service(config_mod.load(path), build_feeds, config_path=path)
    url = f"http://127.0.0.1:{port}/copytrade/"
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(svc.run)
            while "copytrade_webhook" not in svc.health:  # noqa: ASYNC110
                await anyio.sleep(0.02)
            await anyio.sleep(0.1)
            assert (await post(url + "alice", signal("s1")))[0] == 200
            assert (await post(url + "bob", signal("b1", leader="bob")))[0] == 404
            write(
                f'[feeds.copytrade_webhook.leaders.alice]\nsecret = "{SECRET}"\n'
                f'[feeds.copytrade_webhook.leaders.bob]\nsecret = "{SECRET}"\n'
            )
            await svc.reload()
            assert svc.config.feeds.copytrade_webhook.leaders.keys() == {"alice", "bob"}
            await anyio.sleep(0.1)
            status, answer = await post(url + "bob", signal("b1", leader="bob"))
            assert (status, answer["status"]) == (200, "accepted")
            svc.request_stop()


async def test_a_flood_of_bad_requests_is_answered_but_recorded_only_so_often(
    tmp_path: Path,
) -> None:
    """Every bad request gets its 4xx; only the first 60 a minute get an audit row (the
    audit log is bounded: a flood must not rotate the real rows away)."""
    from feeds.copytrade.door import REFUSALS_RECORDED_PER_MINUTE

    async with running(tmp_path) as h:
        for _ in range(REFUSALS_RECORDED_PER_MINUTE + 15):
            assert (await post(h.url, b"{}", {"content-type": "application/json"}))[0] == 401
        assert (await post(h.url, signal("s1")))[0] == 200  # a good one still goes through
    assert [r.status for r in h.audit].count("rejected") == REFUSALS_RECORDED_PER_MINUTE
    assert h.audit[-1].status == "accepted"
    stats = h.feed.statistics()
    assert stats["rejected"] == REFUSALS_RECORDED_PER_MINUTE + 15 and stats["unrecorded"] == 15
