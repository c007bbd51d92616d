"""TradingView alerts, sans-I/O: bodies from the documented template, each bad input,
and the position transitions they map to."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from daemon.errors import SignalRejected
from feeds.copytrade.tradingview import (
    ALERT_TEMPLATE,
    TvAlert,
    TvMapper,
    map_symbol,
    parse_alert,
)
from feeds.copytrade.tradingview_feed import client_address
from tests.feeds.tradingview_client import alert

JSON = "application/json"


def parsed(body: bytes) -> TvAlert:
    return parse_alert(body, JSON)


def test_the_template_parses() -> None:
    a = parsed(alert(contracts="0.5", size="-0.5", market="short", action="sell"))
    assert (a.ticker, a.action, a.contracts, a.market_position) == (
        "BINANCE:BTCUSDT", "sell", 0.5, "short"
    )  # fmt: skip
    assert a.position_size == 0.5 and a.price == 96500.5 and a.time == "2026-11-25T12:00:00.000Z"
    assert parsed(alert(size="")).position_size is None  # not every strategy sends it
    # the id: order id and time; the same alert twice has the same id
    assert a.alert_id == parsed(alert(contracts="0.5", market="short", action="sell")).alert_id
    assert a.alert_id.startswith("Long-Entry-") and a.alert_id.endswith(".1795608000000")
    assert parsed(alert(timenow="2026-11-25T12:00:01Z")).alert_id != parsed(alert()).alert_id


@pytest.mark.parametrize(
    ("body", "content_type", "status", "reason"),
    [
        (b"BTCUSDT buy 1 @ 96500", "text/plain", 415, "not JSON"),
        (b'{"ticker": "BINANCE:BTC', JSON, 400, "not JSON"),
        (b"[]", JSON, 422, "invalid alert"),
        (alert(action="{{strategy.order.action}}"), JSON, 422, "{{strategy.order.action}}"),
        (alert(close="{{ close }}"), JSON, 422, "{{close}} was not expanded"),
        (alert(action="hold"), JSON, 422, "action must be one of buy, sell"),
        (alert(market="sideways"), JSON, 422, "marketPosition must be one of"),
        (alert(contracts="0"), JSON, 422, "contracts must be above 0"),
        (alert(contracts="many"), JSON, 422, "contracts must be a number"),
        (alert(contracts="nan"), JSON, 422, "finite"),
        (alert(timenow="yesterday"), JSON, 422, "time must be RFC 3339"),
        (alert(extra={"leverage": "10"}), JSON, 422, "unknown field"),
        (alert(contracts=""), JSON, 422, "contracts is required"),
        (alert(close="1e308"), JSON, 422, "price must be below 1e15"),
    ],
)
def test_bad_alerts_are_refused_with_a_reason(
    body: bytes, content_type: str, status: int, reason: str
) -> None:
    with pytest.raises(SignalRejected) as info:
        parse_alert(body, content_type)
    assert info.value.status == status and reason in info.value.reason


def test_a_configured_passphrase_must_match() -> None:
    good = alert(extra={"passphrase": "open sesame"})
    assert parse_alert(good, JSON, "open sesame").action == "buy"
    for body in (alert(), alert(extra={"passphrase": "guess"})):
        with pytest.raises(SignalRejected) as info:
            parse_alert(body, JSON, "open sesame")
        assert info.value.status == 401


def kinds(mapper: TvMapper, body: bytes) -> list[tuple[str, str, str, float | None]]:
    return [
        (s.kind, s.side, s.position_id, s.quantity)
        for s in mapper.map("tv", "BTC-USD", parsed(body))
    ]


def test_entries_pyramiding_exits_and_reversals() -> None:
    m = TvMapper()
    entry = parsed(alert(contracts=1, order_id="L")).alert_id
    assert kinds(m, alert(contracts=1, order_id="L")) == [("opened", "long", entry, 1.0)]
    # pyramiding and a partial exit are size changes: modified with the new size
    add = alert(contracts=0.5, prev="long", order_id="L2", timenow="2026-11-25T12:01:00Z")
    assert kinds(m, add) == [("modified", "long", entry, 1.5)]
    part = alert("sell", 1, "long", "long", "TP1", timenow="2026-11-25T12:02:00Z")
    assert kinds(m, part) == [("modified", "long", entry, 0.5)]
    # a reversal: the order of 2.5 closes the 0.5 long and opens 2 short
    rev = alert("sell", 2.5, "short", "long", "S", timenow="2026-11-25T12:03:00Z")
    short = parsed(rev).alert_id
    got = m.map("tv", "BTC-USD", parsed(rev))
    assert [(s.kind, s.side, s.position_id, s.quantity, s.signal_id) for s in got] == [
        ("closed", "long", entry, None, short + ":close"),
        ("opened", "short", short, 2.0, short + ":open"),
    ]
    # the exit; then a flat-to-flat alert changes nothing
    out = alert("buy", 2, "flat", "short", "X", timenow="2026-11-25T12:04:00Z")
    assert kinds(m, out) == [("closed", "short", short, None)]
    assert kinds(m, alert("buy", 1, "flat", "flat", "Y")) == []
    assert m.held == {}


def test_position_size_wins_and_positions_survive_a_restart() -> None:
    m = TvMapper()
    kinds(m, alert(contracts=1, size=1))
    again = TvMapper()
    again.load(m.dump())
    add = alert(
        contracts=0.3, size=1.25, prev="long", order_id="L2", timenow="2026-11-25T12:01:00Z"
    )
    assert [k[0::3] for k in kinds(again, add)] == [("modified", 1.25)]  # size over contracts


def test_symbols_map_through_the_table() -> None:
    table = {"BINANCE:BTCUSDT": "BTC-USD", "ETHUSDT": "ETH-USD"}
    assert map_symbol("BINANCE:BTCUSDT", table) == "BTC-USD"
    assert map_symbol("BYBIT:ETHUSDT", table) == "ETH-USD"
    assert map_symbol("COINBASE:SOL-USD", table) == "SOL-USD"


def test_forwarded_addresses_count_only_from_a_trusted_proxy() -> None:
    proxies = [ipaddress.ip_network("127.0.0.1/32")]
    assert client_address("127.0.0.1", "52.89.214.238", proxies) == "52.89.214.238"
    # a client cannot claim an address by sending the header itself through the proxy
    assert client_address("127.0.0.1", "52.89.214.238, 6.6.6.6", proxies) == "6.6.6.6"
    assert client_address("6.6.6.6", "52.89.214.238", proxies) == "6.6.6.6"
    assert client_address("127.0.0.1", None, proxies) == "127.0.0.1"


def test_the_readme_and_docs_show_the_template_the_parser_takes() -> None:
    root = Path(__file__).resolve().parents[2]
    for doc in ("README.md", "docs/copytrade.md"):
        assert ALERT_TEMPLATE in (root / doc).read_text(), doc
