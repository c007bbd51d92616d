"""Accounts: each agent trades its own book unless agent.toml shares one."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from daemon.audit.records import AuditRecord, RiskRecord
from daemon.events import FeedEvent
from daemon.trading.desk import TradeDesk
from daemon.trading.intents import RiskLimits, parse_intent
from daemon.trading.paper import PaperBroker
from daemon.trading.portfolio import Order, Position

BUY = parse_intent(
    {"action": "PLACE_MARKET_ORDER", "symbol": "BTC", "side": "buy", "volume": 1.0,
     "stopLoss": 90.0}
)  # fmt: skip
CLOSE = parse_intent({"action": "CLOSE_POSITION", "symbol": "BTC"})


class Audit(list[AuditRecord]):
    def write(self, record: AuditRecord) -> None:
        self.append(record)


@pytest.fixture
def published() -> list[FeedEvent]:
    return []


@pytest.fixture
def broker(tmp_path: Path, published: list[FeedEvent]) -> Iterator[PaperBroker]:
    async def publish(event: FeedEvent) -> None:
        published.append(event)

    b = PaperBroker(tmp_path, publish, synchronous="NORMAL")
    yield b
    b.close()


async def test_positions_orders_and_events_are_per_agent(
    broker: PaperBroker, published: list[FeedEvent]
) -> None:
    """Two agents buying the same symbol hold two positions; account events say whose."""
    desk = TradeDesk(broker, Audit())
    await broker.on_tick("BTC", 100.0, 1)
    await desk.handle(BUY, agent_id="a", dedupe_key="1", trace_id=None)
    await desk.handle(BUY, agent_id="b", dedupe_key="1", trace_id=None)
    assert broker.positions("a")["BTC"].quantity == 1.0
    assert broker.positions("b")["BTC"].quantity == 1.0
    assert [o.account_id for o in broker.open_orders("a")] == ["a"]  # its stop-loss only
    assert broker.accounts() == ["a", "b"]
    assert {e.account_id for e in published} == {"a", "b"}
    assert all(e.partition_key == f"paper:{e.account_id}:BTC" for e in published)


async def test_close_position_closes_only_the_agents_own(broker: PaperBroker) -> None:
    """b's CLOSE_POSITION flattens b and cancels b's stop; a keeps its position and stop."""
    desk = TradeDesk(broker, Audit())
    await broker.on_tick("BTC", 100.0, 1)
    await desk.handle(BUY, agent_id="a", dedupe_key="1", trace_id=None)
    await desk.handle(BUY, agent_id="b", dedupe_key="1", trace_id=None)
    out = await desk.handle(CLOSE, agent_id="b", dedupe_key="close", trace_id=None)
    assert out.order is not None and out.order.status == "FILLED"
    assert broker.positions("b") == {} and broker.open_orders("b") == ()
    assert broker.positions("a")["BTC"].quantity == 1.0
    assert [o.role for o in broker.open_orders("a")] == ["stop_loss"]
    # a flat agent has nothing to close, whatever the others hold
    again = await desk.handle(CLOSE, agent_id="b", dedupe_key="close2", trace_id=None)
    assert again.verdict is not None and not again.verdict.approved


async def test_risk_limits_count_the_agents_own_account(broker: PaperBroker) -> None:
    """max_open_orders is per account: a full book for a does not block b."""
    audit = Audit()
    desk = TradeDesk(broker, audit)
    limits = RiskLimits(max_open_orders=1, require_stop_loss=False)
    desk.set_limits("a", limits)
    desk.set_limits("b", limits)
    await broker.on_tick("BTC", 100.0, 1)
    rest = parse_intent(
        {"action": "PLACE_LIMIT_ORDER", "symbol": "BTC", "side": "buy", "volume": 1.0,
         "openPrice": 99.0}
    )  # fmt: skip
    assert (await desk.handle(rest, agent_id="a", dedupe_key="1", trace_id=None)).order
    second = await desk.handle(rest, agent_id="a", dedupe_key="2", trace_id=None)
    assert second.verdict is not None and not second.verdict.approved
    assert (await desk.handle(rest, agent_id="b", dedupe_key="1", trace_id=None)).order
    verdicts = [r.approved for r in audit if isinstance(r, RiskRecord)]
    assert verdicts == [True, False, True]


async def test_an_explicitly_shared_account_is_one_book(broker: PaperBroker) -> None:
    """Agents naming the same account see and close the same position."""
    desk = TradeDesk(broker, Audit())
    desk.set_limits("a", RiskLimits(), account="team")
    desk.set_limits("b", RiskLimits(), account="team")
    await broker.on_tick("BTC", 100.0, 1)
    await desk.handle(BUY, agent_id="a", dedupe_key="1", trace_id=None)
    assert desk.account_of("b") == "team" and broker.positions("team")["BTC"].quantity == 1.0
    out = await desk.handle(CLOSE, agent_id="b", dedupe_key="c", trace_id=None)
    assert out.order is not None and out.order.agent_id == "b"
    assert broker.positions("team") == {}


V0_SCHEMA = """
CREATE TABLE orders (seq INTEGER PRIMARY KEY AUTOINCREMENT, client_order_id TEXT NOT NULL UNIQUE,
    symbol TEXT NOT NULL, role TEXT NOT NULL, status TEXT NOT NULL, created_ms INTEGER NOT NULL,
    body TEXT NOT NULL);
CREATE INDEX orders_status ON orders(status);
CREATE TABLE fills (id INTEGER PRIMARY KEY AUTOINCREMENT, client_order_id TEXT NOT NULL,
    symbol TEXT NOT NULL, signed_qty REAL NOT NULL, price REAL NOT NULL, ts_ms INTEGER NOT NULL,
    realized REAL NOT NULL);
CREATE INDEX fills_ts ON fills(ts_ms);
CREATE TABLE positions (symbol TEXT PRIMARY KEY, body TEXT NOT NULL);
CREATE TABLE marks (symbol TEXT PRIMARY KEY, price REAL NOT NULL);
"""


async def test_a_store_from_before_accounts_migrates_to_the_legacy_account(
    tmp_path: Path,
) -> None:
    """Old rows keep working: they belong to account ``paper``, no agent's own book."""
    db = sqlite3.connect(tmp_path / "paper.sqlite3")
    db.executescript(V0_SCHEMA)
    stop = Order(
        client_order_id="mw-old:sl", agent_id="old", symbol="BTC", side="sell",
        order_type="stop", role="stop_loss", volume=1.0, status="OPEN", created_ms=1,
        updated_ms=1, stop_price=90.0,
    )  # fmt: skip
    body = msgspec.json.encode(stop).replace(b',"accountId":"paper"', b"")
    db.execute(
        "INSERT INTO orders (client_order_id, symbol, role, status, created_ms, body) "
        "VALUES ('mw-old:sl', 'BTC', 'stop_loss', 'OPEN', 1, ?)",
        (body.decode(),),
    )
    pos = Position(symbol="BTC", quantity=1.0, avg_price=100.0, opened_ms=1)
    db.execute("INSERT INTO positions VALUES ('BTC', ?)", (msgspec.json.encode(pos).decode(),))
    db.execute("INSERT INTO fills VALUES (1, 'mw-old', 'BTC', 1.0, 100.0, 1, 5.0)")
    db.commit()
    db.close()

    async def publish(event: FeedEvent) -> None:
        pass

    broker = PaperBroker(tmp_path, publish, synchronous="NORMAL")
    try:
        assert broker.positions("paper") == {"BTC": pos}
        assert [o.client_order_id for o in broker.open_orders("paper")] == ["mw-old:sl"]
        assert broker.realized_pnl("paper") == 5.0 and broker.realized_pnl("old") == 0.0
        assert broker.positions("old") == {}
        await broker.on_tick("BTC", 89.0, 2)  # the legacy stop still works
        assert broker.positions("paper") == {}
    finally:
        broker.close()
    reopened = PaperBroker(tmp_path, publish, synchronous="NORMAL")  # idempotent
    assert reopened.positions("paper") == {}
    reopened.close()
