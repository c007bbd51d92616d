"""Paper fill costs: fees (taker for market, stop and marketable orders, maker for a
resting limit the market reached; PnL is net of them) and taker slippage; an older
store gains the fee column."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Literal

import pytest

from daemon.sqlite import Connection
from daemon.trading.matching import FillCosts
from daemon.trading.paper import PaperBroker
from daemon.trading.paper_store import RECENT_ORDERS, SCHEMA_VERSION, FillRow, PaperStore
from tests.trading.test_paper import MIN, T0, Sink, bar, request


async def test_maker_and_taker_fees(tmp_path: Path) -> None:
    broker = PaperBroker(tmp_path, Sink(), costs=FillCosts(maker_fee_bps=10, taker_fee_bps=50))
    try:
        await broker.on_tick("BTC", 100.0, T0)
        market = await broker.submit(request("m", volume=2.0))  # taker: 200 x 0.5 %
        assert market.fees == pytest.approx(1.0)
        # a sell limit at 99 with the market at 100 is marketable on arrival: it fills
        # at the market and takes liquidity
        through = await broker.submit(
            request("l", action="PLACE_LIMIT_ORDER", openPrice=99.0, side="sell", volume=2.0)
        )
        assert through.status == "FILLED" and through.fees == pytest.approx(1.0)
        assert broker.realized_pnl("agent") == pytest.approx(-2.0)  # flat, two taker fees
    finally:
        broker.close()


async def test_a_resting_limit_pays_the_maker_fee_and_pnl_is_net(tmp_path: Path) -> None:
    broker = PaperBroker(tmp_path, Sink(), costs=FillCosts(maker_fee_bps=10, taker_fee_bps=50))
    try:
        await broker.on_tick("BTC", 100.0, T0)
        entry = await broker.submit(request("e", action="PLACE_LIMIT_ORDER", openPrice=98.0))
        await broker.on_candle("BTC", bar(100, 101, 97, 99, T0 + MIN))
        got = broker.get_order(entry.client_order_id)
        assert got is not None and got.fees == pytest.approx(98 * 2 * 0.001)  # maker
        await broker.submit(request("x", side="sell"))  # at the mark, 99: taker
        # +1 a unit on 2 units, less 98 x 2 x 0.1 % maker and 99 x 2 x 0.5 % taker
        assert broker.realized_pnl("agent") == pytest.approx(2 - 0.196 - 0.99)
    finally:
        broker.close()


async def test_slippage_moves_taker_fills_against_the_order(tmp_path: Path) -> None:
    """10 bps: a market buy fills above the price, a sell below, a stop below its
    trigger for a long; a marketable limit never past its limit; a resting limit the
    market reached fills at its limit; marks stay the market's."""
    broker = PaperBroker(tmp_path, Sink(), costs=FillCosts(slippage_bps=10))
    try:
        await broker.on_tick("BTC", 100.0, T0)
        buy = await broker.submit(request("b", volume=1.0, stopLoss=90.0))
        assert buy.fill_price == pytest.approx(100.1)
        assert broker.positions("agent")["BTC"].avg_price == pytest.approx(100.1)
        assert broker.last_price("BTC", "agent") == 100.0  # the market's, not ours
        capped = await broker.submit(
            request("c", action="PLACE_LIMIT_ORDER", openPrice=100.05, volume=1.0)
        )
        assert capped.fill_price == pytest.approx(100.05)  # 100.1 is past the limit
        resting = await broker.submit(
            request("r", action="PLACE_LIMIT_ORDER", openPrice=95.0, volume=1.0)
        )
        assert resting.status == "OPEN"
        await broker.on_candle("BTC", bar(96, 97, 94, 96, T0 + MIN))
        rested = broker.get_order(resting.client_order_id)
        assert rested is not None and rested.fill_price == 95.0  # maker: at its limit
        await broker.on_tick("BTC", 89.0, T0 + 2 * MIN)  # the stop of "b" triggers
        stop = broker.get_order(buy.client_order_id + ":sl")
        assert stop is not None and stop.fill_price == pytest.approx(89.0 * 0.999)
        sell = await broker.submit(request("s", side="sell", volume=2.0))
        assert sell.fill_price == pytest.approx(89.0 * 0.999)
        # the realized PnL is at the prices paid: (88.911 - 100.1) + 2 x 88.911 - 100.05 - 95
        expected = (88.911 - 100.1) + (88.911 - 100.05) + (88.911 - 95.0)
        assert broker.realized_pnl("agent") == pytest.approx(expected)
    finally:
        broker.close()


def test_a_version_1_store_gains_the_fee_column(tmp_path: Path) -> None:
    path = tmp_path / "paper.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(
        "CREATE TABLE orders (seq INTEGER PRIMARY KEY, client_order_id TEXT UNIQUE,"
        " account TEXT, symbol TEXT, role TEXT, status TEXT, created_ms INTEGER, body TEXT);"
        "CREATE TABLE fills (id INTEGER PRIMARY KEY, client_order_id TEXT, account TEXT,"
        " symbol TEXT, signed_qty REAL, price REAL, ts_ms INTEGER, realized REAL);"
        "INSERT INTO fills VALUES (1, 'o', 'a', 'BTC', -1, 110, 5, 10.0);"
        "PRAGMA user_version=1;"
    )
    db.close()
    store = PaperStore(path)
    try:
        assert store.realized_since("a", 0) == 10.0
        assert store.fills("a") == [
            FillRow(ts_ms=5, symbol="BTC", price=110.0, qty=-1.0, realized=10.0, fee=0.0)
        ]
        (version,) = store._db.execute("PRAGMA user_version").fetchone()
        assert version == SCHEMA_VERSION == 2
    finally:
        store.close()


def test_the_order_rate_check_reads_by_index(tmp_path: Path) -> None:
    """Every intent reads the account's last minute of orders: by index, not by
    scanning every order ever placed (that made long backtests quadratic)."""
    store = PaperStore(tmp_path / "paper.sqlite3")
    try:
        plan = store._db.execute(f"EXPLAIN QUERY PLAN {RECENT_ORDERS}", ("a", 0)).fetchall()
        assert "orders_recent" in " ".join(str(row[-1]) for row in plan)
    finally:
        store.close()


@pytest.mark.parametrize("synchronous", ["FULL", "OFF"])
def test_a_store_whose_creation_a_kill_cut_opens_and_is_created_whole(
    tmp_path: Path, synchronous: Literal["FULL", "OFF"]
) -> None:
    """A kill between the tables and their version once left a current store marked
    version 0: every later start failed ("duplicate column name: account"). Such a
    store opens (found by bench/kill9_check.py), and a new one gets its tables and
    version in one transaction."""
    path = tmp_path / "paper.sqlite3"
    PaperStore(path, synchronous).close()
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version=0")  # as the kill left it
    db.close()
    store = PaperStore(path, synchronous)
    try:
        assert store.all_orders() == []
        (version,) = store._db.execute("PRAGMA user_version").fetchone()
        assert version == SCHEMA_VERSION
    finally:
        store.close()
    script: list[str] = []
    real = Connection.executescript

    def spy(self: sqlite3.Connection, sql: str) -> sqlite3.Cursor:
        script.append(sql)
        return real(self, sql)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(Connection, "executescript", spy)
        PaperStore(tmp_path / "new.sqlite3", synchronous).close()
    (created,) = [s for s in script if "CREATE TABLE" in s]
    assert created.startswith("BEGIN;") and created.rstrip().endswith("COMMIT;")
    assert "PRAGMA user_version" in created
