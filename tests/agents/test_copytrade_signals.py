"""A leader's signed signal reaches a follower's copytrade hooks through the real daemon,
and becomes exactly one follower order, whatever hooks, redeliveries and restarts do."""

from __future__ import annotations

import json
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import msgspec
from click.testing import CliRunner

from daemon.agents.pipeline import open_agents
from daemon.audit.records import SignalRecord
from daemon.cli.copytrade import gather
from daemon.cli.main import cli
from daemon.config import Config, decode_hook
from daemon.events import MARKET_PRICE_TICK, FeedEvent, iso_ms, now_ms
from daemon.service import Service
from daemon.status import Status
from feeds.base import Feed
from feeds.copytrade import CopytradeWebhookFeed
from tests.agents.test_pipeline import PacedFeed, audit
from tests.feeds.copytrade_client import SECRET, post, signal
from tests.test_alerts import serve

ROOT = Path(__file__).resolve().parents[2]

# Two hooks mirror the same signal at half size: one order, not two.
MIRROR = """
def evaluate(event, state):
    s = event["payload"]
    if s["kind"] != "opened":
        return {"decision": "IGNORE", "reason": "only entries"}
    return {
        "decision": "TRADE_INTENT",
        "reason": "mirror " + s["leader"] + " " + s["signalId"],
        "intent": {
            "action": "PLACE_LIMIT_ORDER",
            "symbol": s["symbol"],
            "side": "buy" if s["side"] == "long" else "sell",
            "volume": s["quantity"] / 2,
            "openPrice": s["price"],
            "stopLoss": s["stopLoss"],
        },
    }
"""


def tick(price: float) -> FeedEvent:
    at = now_ms()
    return FeedEvent(
        event_id=f"t:BTC-USD:{at}",
        ts=iso_ms(at),
        source="t",
        topic=MARKET_PRICE_TICK,
        symbol="BTC-USD",
        payload={"price": price},
    )


def config(
    root: Path, alert_webhook: str = "", reconcile_seconds: float = 60.0, participation: float = 0
) -> Config:
    return msgspec.convert(
        {
            "daemon": {"state_dir": str(root / "state")},
            "copytrade": {"reconcile_seconds": reconcile_seconds},
            "trading": {"paper_max_participation": participation},
            "hooks": {"agents_dir": str(root / "agents"), "alert_webhook": alert_webhook},
            "feeds": {
                "copytrade_webhook": {
                    "enabled": True,
                    "port": 0,
                    "leaders": {"alice": {"secret": SECRET}},
                }
            },
        },
        Config,
        dec_hook=decode_hook,
    )


def hook_rows(root: Path) -> list[dict[str, Any]]:
    return [r for r in audit(root) if r["type"] == "hook" and r["topic"].startswith("copytrade")]


async def run_daemon(
    root: Path,
    leader: Callable[[str], Awaitable[None]],
    alert_webhook: str = "",
    reconcile_seconds: float = 60.0,
    *,
    market: Feed | None = None,
    participation: float = 0.0,
) -> Status:
    """One daemon run with the webhook and ``market`` (a BTC-USD price by default);
    ``leader(url)`` posts, then the run stops; its final status."""
    cfg = config(root, alert_webhook, reconcile_seconds, participation)
    assert not cfg.event_time  # a live feed: agents on the wall clock

    def audit_sink(record: SignalRecord) -> None:
        if svc.audit is not None:
            svc.audit(record)

    feed = CopytradeWebhookFeed(cfg.feeds.copytrade_webhook, root / "state", audit=audit_sink)
    # the follower's risk engine needs a price
    price = market if market is not None else PacedFeed([tick(96500.0)], hold=True)
    svc = Service(cfg, lambda _: [feed, price], components=[open_agents])

    async def script() -> None:
        while not feed.port:  # noqa: ASYNC110 - the feed binds at start
            await anyio.sleep(0.02)
        await leader(f"http://127.0.0.1:{feed.port}/copytrade/alice")
        svc.request_stop()

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(script)
            status = await svc.run()
    return status


async def evaluated(root: Path, n: int) -> None:
    """Until ``n`` copytrade hook rows are in the audit."""
    while len(hook_rows(root)) < n:  # noqa: ASYNC110 - polls the audit
        await anyio.sleep(0.05)


async def test_one_signal_two_hooks_a_redelivery_and_a_restart_make_one_follower_order(
    tmp_path: Path,
) -> None:
    hooks = tmp_path / "agents" / "follower" / "hooks"
    hooks.mkdir(parents=True)
    (hooks.parent / "agent.toml").write_text('topics = ["copytrade.signal.*"]\n')
    (hooks / "copytrade_mirror.py").write_text(MIRROR)
    (hooks / "copytrade_mirror_again.py").write_text(MIRROR)

    async def first(url: str) -> None:
        entry: dict[str, Any] = {"quantity": 0.02, "price": 96500.0, "stopLoss": 94000.0}
        assert (await post(url, signal("s1", **entry)))[0] == 200
        assert (await post(url, signal("s1", **entry)))[1]["status"] == "duplicate"
        assert (await post(url, b"{}"))[0] == 422
        # a signal the follower's risk limits refuse (notional 0.5 BTC > 1000)
        big = entry | {"quantity": 1.0, "positionId": "p2"}
        assert (await post(url, signal("s2", **big)))[0] == 200
        await evaluated(tmp_path, 4)

    async def restart(url: str) -> None:
        await anyio.sleep(1.0)  # the redelivered signals, if evaluated, would be by now
        # `copytrade status` asks the running daemon for its book (not the snapshot)
        live = await anyio.to_thread.run_sync(
            lambda: gather(Config(), 0, tmp_path / "state", tmp_path / "agents")
        )
        assert live["positionsAsOf"] == "now"
        assert [p["positionId"] for p in live["positions"]] == ["p1", "p2"]

    runner, alert_url, alerts = await serve(200)
    try:
        await run_daemon(tmp_path, first, alert_url)
        # The restart delivers the signals again (they are recent): skipped as evaluated.
        await run_daemon(tmp_path, restart, alert_url)
    finally:
        await runner.cleanup()
    # the refused copy is one alert, though both hooks asked; after the restart the
    # reconciliation at start finds the position still unmirrored: one drift alert
    assert [(a["eventId"], a["reason"].split(":")[0]) for a in alerts] == [
        ("copytrade:alice:s2", "copy refused (ORDER_NOTIONAL, POSITION_LIMIT, TOTAL_EXPOSURE)"),
        ("copytrade.reconcile:alice:p2", "copy drift"),
    ]

    rows = audit(tmp_path)
    signals = [(r["status"], r["httpStatus"]) for r in rows if r["type"] == "signal"]
    assert signals == [("accepted", 200), ("duplicate", 200), ("rejected", 422), ("accepted", 200)]
    assert sorted((r["eventId"], r["hookId"]) for r in hook_rows(tmp_path)) == [
        ("copytrade:alice:s1", "copytrade_mirror"),
        ("copytrade:alice:s1", "copytrade_mirror_again"),
        ("copytrade:alice:s2", "copytrade_mirror"),
        ("copytrade:alice:s2", "copytrade_mirror_again"),
    ]  # each once, across the restart
    entries = [r for r in rows if r["type"] == "order" and r["role"] == "entry"]
    assert len({r["clientOrderId"] for r in entries}) == 1, entries  # one follower order
    assert [r["status"] for r in entries] == ["OPEN", "FILLED"]
    assert entries[0]["volume"] == 0.01 and entries[0]["side"] == "buy"
    checked = [r for r in rows if r["type"] == "risk" and r["eventId"] == "copytrade:alice:s1"]
    assert len(checked) == 1 and checked[0]["approved"]  # the second hook's: a known order
    refused = [r for r in rows if r["type"] == "risk" and r["eventId"] == "copytrade:alice:s2"]
    assert refused and not any(r["approved"] for r in refused)
    assert "ORDER_NOTIONAL" in {c["code"] for c in refused[0]["reasons"]}

    # what an operator sees: the leader, both positions open, one mirrored, one drifting
    cfg_file = tmp_path / "config.toml"
    cfg_file.write_text(
        f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n'
        f'[hooks]\nagents_dir = "{tmp_path / "agents"}"\n'
        f'[feeds.copytrade_webhook.leaders.alice]\nsecret = "{SECRET}"\n'
        '[feeds.copytrade_webhook.leaders.bob]\nsecret = "bob-secret-0123456789"\n'
    )
    shown = CliRunner().invoke(cli, ["copytrade", "status", "--config", str(cfg_file)])
    assert shown.exit_code == 0, shown.output
    out = shown.output
    assert "alice: 2 signals, last copytrade:alice:s2 (opened)" in out, out
    assert "bob: no signals yet" in out
    assert "alice/p1: long 0.02 BTC-USD (signals s1); mirrored: follower 0.01" in out
    # (read from the state snapshot, written now and then: the header says when)
    snapshot = tmp_path / "state" / "state_cache.json"
    when = iso_ms(int(snapshot.stat().st_mtime * 1000))
    assert f"OPEN LEADER POSITIONS (the state snapshot of {when}, the daemon's last" in out
    assert "follower on alice/p2: holds 0 BTC-USD, target 0.5" in out  # ratio 0.5 of 1.0
    assert "alice/s1 duplicate (200)" in out and "alice/? rejected (422)" in out
    data = json.loads(
        CliRunner().invoke(cli, ["copytrade", "status", "--config", str(cfg_file), "--json"]).output
    )
    assert [p["positionId"] for p in data["positions"]] == ["p1", "p2"]
    assert data["positionsAsOf"] == when
    assert data["positions"][0]["followers"]["follower"]["orders"]["s1"]["status"] == "FILLED"
    # --state-dir reads another state (and its audit log) with the same leaders
    moved = tmp_path / "elsewhere"
    shutil.copytree(tmp_path / "state", moved)
    shutil.rmtree(tmp_path / "state")
    args = ["copytrade", "status", "--config", str(cfg_file), "--state-dir", str(moved)]
    assert CliRunner().invoke(cli, args).output == out
    # no snapshot (a daemon stopped before its first): said, not "none" alone
    (moved / "state_cache.json").unlink()
    early = CliRunner().invoke(cli, args).output
    assert "OPEN LEADER POSITIONS (no state snapshot: " in early


async def test_the_shipped_follower_mirrors_entry_edit_partial_and_full_close(
    tmp_path: Path,
) -> None:
    """agents/follower at half size: the entry, a new stop-loss moved onto its stop
    order, a partial close of the same fraction, the close of exactly the rest; a
    close that arrives before its open leaves nothing to mirror, then or later."""
    shutil.copytree(ROOT / "agents" / "follower", tmp_path / "agents" / "follower")
    toml = tmp_path / "agents" / "follower" / "agent.toml"
    toml.write_text(toml.read_text().replace("enabled = false", "enabled = true"))
    sl: dict[str, Any] = {"stopLoss": 94000.0}
    steps = [
        signal("s1", quantity=0.01, price=96500.0, **sl),
        signal("s2", "modified", stopLoss=95000.0),
        signal("s3", "closed", quantity=0.004),
        signal("s4", "closed"),
        signal("s5", "closed", positionId="p2"),  # before its open
        signal("s6", positionId="p2", quantity=0.01, **sl),
    ]

    async def leader(url: str) -> None:
        for i, body in enumerate(steps, 1):
            assert (await post(url, body))[0] == 200
            await evaluated(tmp_path, i)

    await run_daemon(tmp_path, leader)
    reasons = [r["reason"] for r in hook_rows(tmp_path)]
    assert reasons == [
        "mirror alice s1 to 0.005",
        "follow stopLoss to 95000.0",
        "close mirrored 0.002 of p1",
        "close mirrored 0.003 of p1",
        "not in the leaders' book yet: p2",
        "already closed by the leader: p2",
    ]
    rows = audit(tmp_path)
    filled = [
        (r["role"], r["side"], r["volume"])
        for r in rows
        if r["type"] == "order" and r["status"] == "FILLED"
    ]
    assert filled == [("entry", "buy", 0.005), ("close", "sell", 0.002), ("close", "sell", 0.003)]
    assert all(r["approved"] for r in rows if r["type"] == "risk")
