"""Agents do not change each other's trading: own accounts, the broker's own route."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
import structlog
import structlog.testing

from daemon.agents.pipeline import open_agents
from daemon.app import build_feeds
from daemon.cli.run import _render_status
from daemon.config import Config
from daemon.service import Service
from daemon.status import read_status
from feeds.synthetic import generate_candles
from tests.agents.test_pipeline import PacedFeed, audit, candle

EXAMPLE = Path(__file__).resolve().parents[2] / "agents" / "example"

# A wake-only neighbour, quicker than the example: it runs ahead of it through a replay.
QUICK_WAKER = """
def evaluate(event, state):
    return {"decision": "WAKE", "reason": "quick", "dedupeKey": "w:" + event["eventId"]}
"""


def replay_config(root: Path, agents: Path, csv: Path, speed: float = 0) -> Config:
    return msgspec.convert(
        {
            "daemon": {"state_dir": str(root / "state")},
            "hooks": {"agents_dir": str(agents), "reload_seconds": 60},
            "feeds": {
                "replay": {
                    "enabled": True, "path": str(csv), "symbol": "BTC-USD", "timeframe": "5m",
                    "speed": speed,
                }
            },
        },
        Config,
    )  # fmt: skip


def trading_rows(root: Path, agent: str) -> list[tuple[Any, ...]]:
    """The agent's risk verdicts and order states, without wall-clock fields."""
    out = []
    for r in audit(root):
        if r.get("agentId") != agent or r["type"] not in ("risk", "order"):
            continue
        reasons = tuple(x["code"] for x in r.get("reasons") or ())
        out.append(
            (r["type"], r.get("eventId"), r.get("approved"), reasons, r.get("clientOrderId"),
             r.get("status"), r.get("role"), r.get("price"))
        )  # fmt: skip
    return out


async def replay_example(root: Path, csv: Path, *, neighbour: bool) -> list[tuple[Any, ...]]:
    agents = root / "agents"
    shutil.copytree(EXAMPLE, agents / "example")
    if neighbour:
        (agents / "quick" / "hooks").mkdir(parents=True)
        (agents / "quick" / "agent.toml").write_text("[wake]\ndebounce_seconds = 0\n")
        (agents / "quick" / "hooks" / "wake_quick.py").write_text(QUICK_WAKER)
    svc = Service(replay_config(root, agents, csv), build_feeds, components=[open_agents])
    with anyio.fail_after(120):
        await svc.run()
    return trading_rows(root, "example")


async def test_example_trades_the_same_alone_and_beside_another_agent(tmp_path: Path) -> None:
    """The same replay: the example agent's verdicts, orders and fills are identical with
    and without a quicker wake-only neighbour, run after run."""
    csv = tmp_path / "btc_5m.csv"
    generate_candles(csv, seed=11, n=700, timeframe="5m", start_price=60_000.0)
    alone = await replay_example(tmp_path / "alone", csv, neighbour=False)
    beside = await replay_example(tmp_path / "beside", csv, neighbour=True)
    again = await replay_example(tmp_path / "again", csv, neighbour=True)
    assert any(r[0] == "order" and r[5] == "FILLED" for r in alone), "the data must trade"
    assert any(r[0] == "risk" and r[2] for r in alone)
    assert beside == alone
    assert again == alone


BUY_ONCE = """
def evaluate(event, state):
    mine = state["positions"]
    return {"decision": "TRADE_INTENT", "reason": "held " + str(sorted(mine)),
            "dedupeKey": "buy-once",
            "intent": {"action": "PLACE_MARKET_ORDER", "symbol": event["symbol"], "side": "buy",
                       "volume": 1.0, "stopLoss": 1.0}}
"""
CLOSE_EVERY = """
def evaluate(event, state):
    return {"decision": "TRADE_INTENT", "reason": "held " + str(sorted(state["positions"])),
            "dedupeKey": "close:" + event["eventId"],
            "intent": {"action": "CLOSE_POSITION", "symbol": event["symbol"]}}
"""


def two_agents(root: Path, a: str, b: str, b_toml: str = "") -> Path:
    agents = root / "agents"
    for agent_id, src, toml in (("alpha", a, ""), ("beta", b, b_toml)):
        (agents / agent_id / "hooks").mkdir(parents=True)
        (agents / agent_id / "agent.toml").write_text(toml)
        (agents / agent_id / "hooks" / "autotrade_x.py").write_text(src)
    return agents


def service(root: Path, agents: Path, n: int) -> Service:
    cfg = msgspec.convert(
        {"daemon": {"state_dir": str(root / "state")}, "hooks": {"agents_dir": str(agents)}},
        Config,
    )
    return Service(
        cfg, lambda _: [PacedFeed([candle(i) for i in range(n)])], components=[open_agents]
    )


async def test_state_positions_and_close_are_the_agents_own(tmp_path: Path) -> None:
    """alpha buys once; beta sees no position and its CLOSE_POSITIONs never touch alpha's."""
    agents = two_agents(tmp_path, BUY_ONCE, CLOSE_EVERY)
    with anyio.fail_after(60):
        await service(tmp_path, agents, 5).run()
    rows = audit(tmp_path)
    hooks = {a: [r["reason"] for r in rows if r["type"] == "hook" and r["agentId"] == a]
             for a in ("alpha", "beta")}  # fmt: skip
    assert hooks["alpha"] == ["held []"] + ["held ['BTC-USD']"] * 4
    assert hooks["beta"] == ["held []"] * 5
    beta_risk = [r for r in rows if r["type"] == "risk" and r["agentId"] == "beta"]
    assert len(beta_risk) == 5 and not any(r["approved"] for r in beta_risk)
    assert not [r for r in rows if r["type"] == "order" and r["agentId"] == "beta"]
    # The operator's view of both accounts, as the final status has them. The broker
    # marks at candle 1's close: the later test candles close above their high (their
    # range is inconsistent), so it ignores them.
    status = read_status(tmp_path / "state")
    alpha, beta = status.accounts["alpha"], status.accounts["beta"]
    assert (alpha.agents, beta.agents) == (["alpha"], ["beta"])
    [pos] = alpha.positions
    assert (pos.symbol, pos.quantity, pos.avg_price, pos.mark) == ("BTC-USD", 1.0, 101.0, 102.0)
    assert alpha.unrealized == pytest.approx(1.0) == pos.unrealized
    assert (alpha.fills, alpha.realized, alpha.working_orders) == (1, 0.0, 1)
    [stop] = alpha.orders
    assert (stop.role, stop.side, stop.price, stop.status) == ("stop_loss", "sell", 1.0, "OPEN")
    assert alpha.last_fill_ms == alpha.as_of_ms - 60_000  # filled at the first close
    assert (beta.positions, beta.fills, beta.working_orders) == ([], 0, 0)
    shown = _render_status(status, None)
    assert "account alpha (agent alpha)" in shown and "unrealized +1.00" in shown
    assert "    BTC-USD +1 @ 101.00, mark 102.00, unrealized +1.00" in shown
    assert "    working stop_loss sell 1 BTC-USD stop at 1.00 (OPEN; mw-" in shown


async def test_the_periodic_status_line_carries_each_account(tmp_path: Path) -> None:
    """The status line logged every status_interval_seconds (what journald keeps)
    has each account's PnL, positions and working orders."""
    agents = two_agents(tmp_path, BUY_ONCE, CLOSE_EVERY)
    cfg = msgspec.convert(
        {
            "daemon": {"state_dir": str(tmp_path / "state"), "status_interval_seconds": 0.05},
            "hooks": {"agents_dir": str(agents)},
        },
        Config,
    )
    feed = PacedFeed([candle(i) for i in range(3)], hold=True)
    svc = Service(cfg, lambda _: [feed], components=[open_agents])

    async def stop_once_logged() -> None:
        for _ in range(500):  # polled: the line comes from the daemon's own timer
            if any(e.get("accounts") for e in logs):
                break
            await anyio.sleep(0.02)
        feed.release.set()

    with structlog.testing.capture_logs() as logs, anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(stop_once_logged)
            await svc.run()
    line = next(e for e in logs if e["event"] == "status" and e.get("accounts"))
    alpha, beta = line["accounts"]["alpha"], line["accounts"]["beta"]
    assert (alpha["positions"], alpha["working_orders"]) == (1, 1)  # the buy and its stop
    assert (beta["positions"], beta["working_orders"], beta["realized"]) == (0, 0, 0.0)


async def test_a_shared_account_is_seen_and_closed_by_both(tmp_path: Path) -> None:
    """beta names alpha's account: it sees alpha's position and its close flattens it."""
    agents = two_agents(tmp_path, BUY_ONCE, CLOSE_EVERY, b_toml='account = "alpha"\n')
    with anyio.fail_after(60):
        await service(tmp_path, agents, 3).run()
    rows = audit(tmp_path)
    closes = [r for r in rows if r["type"] == "order" and r["agentId"] == "beta"]
    assert any(r["status"] == "FILLED" for r in closes)
    accounts = read_status(tmp_path / "state").accounts
    assert list(accounts) == ["alpha"] and accounts["alpha"].agents == ["alpha", "beta"]
    assert accounts["alpha"].positions == [] and accounts["alpha"].fills >= 2


REST_LOW = """
def evaluate(event, state):
    c = event["payload"]["close"]
    return {"decision": "TRADE_INTENT", "reason": "rest", "dedupeKey": "rest-once",
            "intent": {"action": "PLACE_LIMIT_ORDER", "symbol": event["symbol"], "side": "buy",
                       "volume": 1.0, "openPrice": c - 3, "stopLoss": c - 50}}
"""


@pytest.mark.parametrize("reload_seconds", [60.0, 0.0])
async def test_resting_orders_fill_with_no_agent_running(
    tmp_path: Path, reload_seconds: float
) -> None:
    """An order left resting fills in a later run that has no agents at all, with hot
    reload or without (then the shared route runs because that account has no agent)."""
    agents = tmp_path / "agents"
    (agents / "alpha" / "hooks").mkdir(parents=True)
    (agents / "alpha" / "hooks" / "autotrade_rest.py").write_text(REST_LOW)
    with anyio.fail_after(60):
        await service(tmp_path, agents, 1).run()  # close 101: a buy limit at 98 rests
    assert [r["status"] for r in audit(tmp_path) if r["type"] == "order"] == ["OPEN"]
    shutil.rmtree(agents / "alpha")
    falling = [msgspec.structs.replace(candle(i), payload={**candle(i).payload, "low": 90.0})
               for i in range(1, 3)]  # fmt: skip
    hooks = {"agents_dir": str(agents), "reload_seconds": reload_seconds}
    cfg = msgspec.convert(
        {"daemon": {"state_dir": str(tmp_path / "state")}, "hooks": hooks}, Config
    )
    svc = Service(cfg, lambda _: [PacedFeed(falling)], components=[open_agents])
    with anyio.fail_after(60):
        status = await svc.run()
    orders = [(r["role"], r["status"]) for r in audit(tmp_path) if r["type"] == "order"]
    assert ("entry", "FILLED") in orders and ("stop_loss", "OPEN") in orders
    assert status.components["broker"]["routes"] == 1  # the shared one, for that account


async def test_without_hot_reload_and_every_account_an_agents_there_is_no_shared_route(
    tmp_path: Path,
) -> None:
    """Agents loaded once and every account an agent's: each candle goes to the
    agent's account route only, and an agent added while running is not loaded."""
    agents = tmp_path / "agents"
    (agents / "alpha" / "hooks").mkdir(parents=True)
    (agents / "alpha" / "hooks" / "autotrade_rest.py").write_text(REST_LOW)
    hooks = {"agents_dir": str(agents), "reload_seconds": 0}
    cfg = msgspec.convert(
        {"daemon": {"state_dir": str(tmp_path / "state")}, "hooks": hooks}, Config
    )
    feed = PacedFeed([candle(i) for i in range(6)], gap=0.05)
    svc = Service(cfg, lambda _: [feed], components=[open_agents])

    async def add_an_agent() -> None:
        await feed.when(1).wait()
        (agents / "beta" / "hooks").mkdir(parents=True)
        (agents / "beta" / "hooks" / "autotrade_rest.py").write_text(REST_LOW)

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(add_an_agent)
            status = await svc.run()
    broker = status.components["broker"]
    assert broker["routes"] == 1 and broker["applied"] == 6
    assert {r["agentId"] for r in audit(tmp_path) if r["type"] == "hook"} == {"alpha"}
