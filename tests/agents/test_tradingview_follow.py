"""TradingView alerts through the real daemon: the shipped follower copies a
strategy's entry (with its own stop, the alert has none) and its exit."""

from __future__ import annotations

import shutil
from pathlib import Path

import anyio
import msgspec
from click.testing import CliRunner

from daemon.agents.pipeline import open_agents
from daemon.audit.records import SignalRecord
from daemon.cli.main import cli
from daemon.config import Config, decode_hook
from daemon.service import Service
from feeds.copytrade import TradingViewFeed
from tests.agents.test_copytrade_signals import ROOT, evaluated, tick
from tests.agents.test_pipeline import PacedFeed, audit
from tests.feeds.tradingview_client import HOOK_ID, alert, post


async def test_a_tradingview_strategy_is_copied_by_the_shipped_follower(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "agents" / "follower", tmp_path / "agents" / "follower")
    toml = tmp_path / "agents" / "follower" / "agent.toml"
    toml.write_text(toml.read_text().replace("enabled = false", "enabled = true"))
    cfg = msgspec.convert(
        {
            "daemon": {"state_dir": str(tmp_path / "state")},
            "hooks": {"agents_dir": str(tmp_path / "agents")},
            "feeds": {
                "tradingview": {
                    "enabled": True,
                    "port": 0,
                    "allowed_ips": ["127.0.0.1"],
                    "hooks": {"tvbot": {"id": HOOK_ID, "symbols": {"BINANCE:BTCUSDT": "BTC-USD"}}},
                }
            },
        },
        Config,
        dec_hook=decode_hook,
    )

    def audit_sink(record: SignalRecord) -> None:
        if svc.audit is not None:
            svc.audit(record)

    feed = TradingViewFeed(cfg.feeds.tradingview, tmp_path / "state", audit=audit_sink)
    price = PacedFeed([tick(96500.0)], hold=True)
    svc = Service(cfg, lambda _: [feed, price], components=[open_agents])

    async def strategy() -> None:
        while not feed.port:  # noqa: ASYNC110 - the feed binds at start
            await anyio.sleep(0.02)
        url = f"http://127.0.0.1:{feed.port}/tv/{HOOK_ID}"
        entry = alert("buy", 1, "long", "flat", "Long", close=96500.0)
        assert (await post(url, entry))[0] == 200
        await evaluated(tmp_path, 1)
        exit_ = alert("sell", 1, "flat", "long", "Exit", timenow="2026-11-25T12:05:00Z")
        assert (await post(url, exit_))[0] == 200
        await evaluated(tmp_path, 2)
        svc.request_stop()

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(strategy)
            await svc.run()

    rows = audit(tmp_path)
    assert [(r["source"], r["status"]) for r in rows if r["type"] == "signal"] == [
        ("tradingview", "accepted")
    ] * 2
    filled = [
        (r["role"], r["side"], r["volume"])
        for r in rows
        if r["type"] == "order" and r["status"] == "FILLED" and r["role"] != "stop_loss"
    ]
    assert filled == [("entry", "buy", 0.01), ("close", "sell", 0.01)]  # capped at 0.01
    [risk] = [r for r in rows if r["type"] == "risk" and r["intent"]["action"] != "CLOSE_POSITION"]
    assert risk["approved"] and risk["intent"]["stopLoss"] == 94570.0  # 2 % under 96,500

    # copytrade status knows the TradingView leader and what it sent
    cfg_file = tmp_path / "config.toml"
    cfg_file.write_text(
        f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n'
        f'[hooks]\nagents_dir = "{tmp_path / "agents"}"\n'
        f'[feeds.tradingview.hooks.tvbot]\nid = "{HOOK_ID}"\n'
    )
    shown = CliRunner().invoke(cli, ["copytrade", "status", "--config", str(cfg_file)])
    assert shown.exit_code == 0, shown.output
    assert "tvbot: 2 signals, last copytrade:tvbot:Exit-" in shown.output, shown.output
