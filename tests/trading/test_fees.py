"""Paper fees: taker for market, stop and marketable orders, maker for a resting
limit the market reached; PnL is net of them; an older store gains the column."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from daemon.trading.paper import Fees, PaperBroker
from daemon.trading.paper_store import RECENT_ORDERS, SCHEMA_VERSION, FillRow, PaperStore
from tests.trading.test_paper import MIN, T0, Sink, bar, request


async def test_maker_and_taker_fees(tmp_path: Path) -> None:
    broker = PaperBroker(tmp_path, Sink(), fees=Fees(maker_bps=10, taker_bps=50))
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
    broker = PaperBroker(tmp_path, Sink(), fees=Fees(maker_bps=10, taker_bps=50))
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
