"""One agent leads, another follows: the leader's paper trades become signals the shipped
follower mirrors at half size (entry, add, partial close, close), and the leader's
record goes out as marketplace.strategy.updated."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from click.testing import CliRunner

from daemon.agents.pipeline import open_agents
from daemon.cli.copytrade import agents_dir_of
from daemon.cli.main import cli
from daemon.config import Config
from daemon.copytrade.relay import LEADER_STATS_FILE, MAX_LEADER_STATS_BYTES
from daemon.events import MARKET_CANDLE_CLOSED, FeedEvent, candle_event_id, decode, iso_ms
from daemon.service import Service
from tests.agents.test_pipeline import PacedFeed, audit

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_764_072_000_000
LEADER = """
def evaluate(event, state):
    c = event["payload"]["close"]
    step = int(c - 100)
    buy = {"action": "PLACE_MARKET_ORDER", "symbol": "BTC-USD", "side": "buy",
           "stopLoss": c * 0.9}
    if step == 3:
        return {"decision": "TRADE_INTENT", "reason": "enter", "intent": dict(buy, volume=0.004)}
    if step == 5:
        return {"decision": "TRADE_INTENT", "reason": "add", "intent": dict(buy, volume=0.002)}
    if step == 7:
        return {"decision": "TRADE_INTENT", "reason": "take half",
                "intent": {"action": "CLOSE_POSITION", "symbol": "BTC-USD", "volume": 0.003}}
    if step == 9:
        return {"decision": "TRADE_INTENT", "reason": "exit",
                "intent": {"action": "CLOSE_POSITION", "symbol": "BTC-USD"}}
    return {"decision": "IGNORE", "reason": "wait"}
"""


def candle(i: int) -> FeedEvent:
    close_ms = T0 + 60_000 * (i + 1)
    c = 100.0 + i
    return FeedEvent(
        event_id=candle_event_id("t", "BTC-USD", "1m", close_ms),
        ts=iso_ms(close_ms),
        source="t",
        topic=MARKET_CANDLE_CLOSED,
        symbol="BTC-USD",
        timeframe="1m",
        payload={
            "open": c, "high": c + 0.5, "low": c - 0.5, "close": c, "volume": 1.0,
            "openTimeMs": close_ms - 60_000, "closeTimeMs": close_ms,
            "openTime": iso_ms(close_ms - 60_000), "closeTime": iso_ms(close_ms),
        },
    )  # fmt: skip


async def test_a_leader_agents_trades_are_mirrored_by_a_follower(tmp_path: Path) -> None:
    agents = tmp_path / "agents"
    (agents / "leader" / "hooks").mkdir(parents=True)
    (agents / "leader" / "agent.toml").write_text('topics = ["market.candle.closed"]\n')
    (agents / "leader" / "hooks" / "autotrade_steps.py").write_text(LEADER)
    shutil.copytree(ROOT / "agents" / "follower", agents / "follower")
    toml = agents / "follower" / "agent.toml"
    toml.write_text(toml.read_text().replace("enabled = false", "enabled = true"))
    cfg = msgspec.convert(
        {
            "daemon": {"state_dir": str(tmp_path / "state")},
            "hooks": {"agents_dir": str(agents)},
            "copytrade": {"leader_agents": ["leader"]},
        },
        Config,
    )
    # paced: each signal (published after the fill the next candle makes) and the
    # follower's order for it settle before the next step
    feed = PacedFeed([candle(i) for i in range(12)], gap=0.1, hold=True)
    record = tmp_path / "events.jsonl"
    svc = Service(cfg, lambda _: [feed], components=[open_agents], record_path=record)

    def follower_rows() -> list[dict[str, Any]]:
        return [r for r in audit(tmp_path) if r["type"] == "hook" and r["agentId"] == "follower"]

    async def stop_when_mirrored() -> None:
        while len(follower_rows()) < 4:  # noqa: ASYNC110 - polls the audit
            await anyio.sleep(0.05)
        feed.release.set()

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(stop_when_mirrored)
            await svc.run()

    events = [decode(line) for line in record.read_bytes().splitlines()]
    signals = [e for e in events if e.topic.startswith("copytrade.signal.")]
    assert [(e.topic.rsplit(".", 1)[-1], e.payload["quantity"]) for e in signals] == [
        ("opened", 0.004),
        ("opened", 0.002),
        ("closed", 0.003),
        ("closed", None),
    ]
    assert {e.payload["positionId"] for e in signals} == {signals[0].payload["positionId"]}
    assert signals[0].payload["stopLoss"] == 103 * 0.9 and signals[0].payload["leader"] == "leader"
    [stats] = [e.payload for e in events if e.topic == "marketplace.strategy.updated"]
    assert stats["closedPositions"] == 1 and stats["winRate"] == 1.0
    assert stats["realizedPnl"] > 0 and stats["maxDrawdown"] == 0
    # kept for the next run: the record continues across restarts
    kept = msgspec.json.decode((tmp_path / "state" / LEADER_STATS_FILE).read_bytes())
    assert kept == [stats]
    # ... and `copytrade status` lists the leader agent with that record
    cfg_file = tmp_path / "config.toml"
    cfg_file.write_text(
        f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n[hooks]\nagents_dir = "{agents}"\n'
        '[copytrade]\nleader_agents = ["leader"]\n'
    )
    shown = CliRunner().invoke(cli, ["copytrade", "status", "--config", str(cfg_file)])
    assert shown.exit_code == 0, shown.output
    assert (
        "  leader: an agent of this daemon: 1 closed position, win rate 100%, "
        f"realized PnL {stats['realizedPnl']:+.2f}, max drawdown 0.00; "
        f"4 signals, last at {signals[-1].ts}"
    ) in shown.output
    assert "none configured" not in shown.output
    # Each signal is in the audit log as the doors' are (no HTTP answer), and the status
    # lists them with no config: the state dir's status names the agents dir.
    rows = [r for r in audit(tmp_path) if r["type"] == "signal"]
    assert [(r["eventId"], r["eventTs"]) for r in rows] == [(e.event_id, e.ts) for e in signals]
    assert {(r["source"], r["leader"], r["status"], r["httpStatus"]) for r in rows} == {
        ("copytrade_leader", "leader", "accepted", None)
    }
    assert agents_dir_of(tmp_path / "state") == agents.absolute()
    bare = ["copytrade", "status", "--state-dir", str(tmp_path / "state")]
    shown = CliRunner().invoke(cli, bare)
    assert shown.exit_code == 0, shown.output
    last = shown.output.split("LAST SIGNALS\n", 1)[1].splitlines()
    assert len(last) == 4 and all("accepted (a leader agent)" in line for line in last)
    assert f"leader's time {signals[-1].ts}" in last[-1]
    missing = CliRunner().invoke(cli, ["copytrade", "status", "--state-dir", str(tmp_path / "no")])
    assert missing.exit_code == 1 and "no state dir at" in missing.output  # a typo says so
    # the leader's equity rides on its signals (capital + PnL) for equity-ratio sizing
    assert signals[0].payload["leaderEquity"] == 10_000.0
    assert signals[-1].payload["leaderEquity"] > 10_000.0  # after the gains of the add

    reasons = [r["reason"] for r in follower_rows()]
    assert reasons[0].startswith("mirror leader ") and reasons[1].startswith("mirror leader ")
    assert reasons[2:] == [
        f"close mirrored 0.0015 of {signals[0].payload['positionId']}",
        f"close mirrored 0.0015 of {signals[0].payload['positionId']}",
    ]
    fills = [
        (r["side"], r["volume"])
        for r in audit(tmp_path)
        if r["type"] == "order" and r["agentId"] == "follower" and r["status"] == "FILLED"
    ]
    assert fills == [("buy", 0.002), ("buy", 0.001), ("sell", 0.0015), ("sell", 0.0015)]


@pytest.mark.parametrize("bad", ["garbage", "huge", "fifo", "link"])
def test_status_survives_leader_records_it_cannot_read(tmp_path: Path, bad: str) -> None:
    """A records file that does not decode, is over 1 MiB, is a FIFO (never waited on)
    or a symlink: `copytrade status` says so on stderr and shows the rest; a good
    file beside a config naming no leader agent still lists its leader."""
    state = tmp_path / "state"
    state.mkdir()
    path = state / LEADER_STATS_FILE
    if bad == "garbage":
        path.write_bytes(b"\xff{not json")
    elif bad == "huge":
        path.write_bytes(b" " * (MAX_LEADER_STATS_BYTES + 1))
    elif bad == "fifo":
        os.mkfifo(path)
    else:
        (tmp_path / "elsewhere.json").write_text('[{"leader": "x"}]')
        path.symlink_to(tmp_path / "elsewhere.json")
    args = ["copytrade", "status", "--state-dir", str(state)]
    shown = CliRunner().invoke(cli, args)  # (a FIFO opened for reading would block here)
    assert shown.exit_code == 0, shown.output
    assert "warning: leader records not shown" in shown.stderr
    assert "LEADERS\n  none configured" in shown.stdout
    path.unlink()
    path.write_text('[{"leader": "trend", "closedPositions": 2, "winRate": 0.5}]')
    shown = CliRunner().invoke(cli, args)
    assert "  trend: an agent of this daemon: 2 closed positions, win rate 50%" in shown.stdout
