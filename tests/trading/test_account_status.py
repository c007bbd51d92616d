"""The account part of ``marketwake status``: positions at their marks, working
orders, PnL (realized net of fees, today's on the broker's clock), fees, fills."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from types import SimpleNamespace

import pytest
import structlog.testing

from daemon.agents.pipeline import _accounts
from daemon.status import MAX_ORDERS_SHOWN, render_accounts
from daemon.trading.account_status import DAY_MS, account_status
from daemon.trading.desk import TradeDesk
from daemon.trading.matching import FillCosts
from daemon.trading.paper import PaperBroker
from tests.trading.test_paper import T0, Sink, request

DAY0 = T0 - T0 % DAY_MS  # 00:00 UTC of T0's day


async def test_pnl_fees_positions_and_orders(tmp_path: Path) -> None:
    """Yesterday's round trip counts in realized, not today's; an open short marks to
    the last price; fees come off realized; resting orders are listed oldest first."""
    broker = PaperBroker(tmp_path, Sink(), costs=FillCosts(taker_fee_bps=10))
    try:
        await broker.on_tick("BTC", 100.0, DAY0 - 3_600_000)  # yesterday
        await broker.submit(request("in", volume=1.0))
        await broker.on_tick("BTC", 110.0, DAY0 - 1_800_000)
        await broker.submit(request("out", side="sell", volume=1.0))  # +10, fees 0.21
        await broker.on_tick("BTC", 120.0, DAY0 + 60_000)  # today
        await broker.submit(request("short", side="sell", volume=2.0, stopLoss=130.0))
        await broker.on_tick("BTC", 118.0, DAY0 + 120_000)
        for i in range(MAX_ORDERS_SHOWN + 2):
            limit = request(f"rest{i}", action="PLACE_LIMIT_ORDER", volume=0.5, openPrice=50.0 + i)
            await broker.submit(limit)
        a = account_status(broker, "agent", ["agent"])
    finally:
        broker.close()
    assert a.as_of_ms == DAY0 + 120_000
    assert a.fills == 3 and a.last_fill_ms == DAY0 + 60_000
    assert a.fees == pytest.approx(0.1 + 0.11 + 0.24)
    assert a.realized == pytest.approx(10.0 - 0.1 - 0.11 - 0.24)
    assert a.realized_today == pytest.approx(-0.24)  # only the short's entry fee
    [short] = a.positions
    assert (short.quantity, short.avg_price, short.mark) == (-2.0, 120.0, 118.0)
    assert short.unrealized == pytest.approx(4.0) == a.unrealized
    assert a.working_orders == MAX_ORDERS_SHOWN + 3  # the stop and the resting limits
    assert len(a.orders) == MAX_ORDERS_SHOWN
    assert a.orders[0].role == "stop_loss" and a.orders[0].price == 130.0
    assert [o.price for o in a.orders[1:3]] == [50.0, 51.0]

    text = "\n".join(render_accounts({"agent": a}))
    assert text.splitlines()[0] == (
        "account agent (agent agent) as of 2023-11-14 00:02:00: realized +9.55 (today -0.24), "
        "unrealized +4.00, fees 0.45, 3 fills, last 2023-11-14 00:01:00"
    )
    assert "    BTC -2 @ 120.00, mark 118.00, unrealized +4.00" in text
    assert "    working entry buy 0.5 BTC limit at 50.00 (OPEN; mw-" in text
    assert text.endswith("    ... and 3 more working orders")


async def test_an_account_no_agent_trades_and_small_prices(tmp_path: Path) -> None:
    """An account left by a removed agent is named as such; prices below 1 keep their
    significant digits."""
    broker = PaperBroker(tmp_path, Sink())
    try:
        await broker.on_tick("BTC", 0.000123, T0)
        await broker.submit(request("in", volume=1000.0))
        a = account_status(broker, "agent", [])
    finally:
        broker.close()
    text = "\n".join(render_accounts({"agent": a}))
    assert text.startswith("account agent (no loaded agent) as of ")
    assert "    BTC +1000 @ 0.000123, mark 0.000123, unrealized +0.00" in text


def test_a_status_file_whose_accounts_do_not_decode_shows_none(tmp_path: Path) -> None:
    """A hand-edited or foreign status.json: the accounts part is left out, the rest
    reads as before."""
    from daemon.status import read_status

    (tmp_path / "status.json").write_text(
        '{"pid": 1, "started_at": 0, "written_at": 0, "running": false, '
        '"bus": {"published": 0, "delivered": 0, "coalesced": 0, "subscriptions": []}, '
        '"feeds": [], "state": {}, "components": {"accounts": {"x": {"agents": 7}}}}'
    )
    status = read_status(tmp_path)
    assert status.accounts == {} and status.bus.published == 0


async def test_a_paper_store_that_cannot_be_read_leaves_the_accounts_out(tmp_path: Path) -> None:
    """The status of a daemon whose paper store broke under it (here its fills table
    is gone) shows no accounts and logs why; it does not raise into the status loop."""
    broker = PaperBroker(tmp_path, Sink())
    try:
        await broker.on_tick("BTC", 100.0, DAY0)
        await broker.submit(request("in", volume=1.0))
        desk = TradeDesk(broker)
        manager = SimpleNamespace(runtimes={})
        assert list(_accounts(desk, manager)) == ["agent"]  # type: ignore[arg-type]
        with sqlite3.connect(tmp_path / "paper.sqlite3") as other:
            other.execute("DROP TABLE fills")
        with structlog.testing.capture_logs() as logs:
            assert _accounts(desk, manager) == {}  # type: ignore[arg-type]
    finally:
        broker.close()
    [line] = [e for e in logs if e["event"] == "accounts left out of the status"]
    assert "no such table: fills" in line["error"] and "paper.sqlite3" in line["error"]
