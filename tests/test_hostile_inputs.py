"""Mutated inputs (tests/mutate.py) through the parsers of what others send (feeds,
recordings, RAG requests, signals, hook results, config): each refuses with our own
error or gives values later stages may trust. Stop 57 found a ticker priced at 0,
a product id with an escape sequence and candles priced at 0 this way
(bench/input_fuzz.py runs it on the recorded frames)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner

from daemon import config
from daemon.audit.reader import recent_evaluations
from daemon.backtest.report import Tally
from daemon.cli.audit import audit_group, why_command
from daemon.errors import MarketwakeError
from daemon.events import MAX_MS, FeedEvent
from daemon.rag import jsonrpc
from daemon.rag.features import STATE_COLUMNS
from daemon.rag.params import parse_params
from feeds import candle_csv
from feeds.candles.protocol import parse_candles
from feeds.coinbase_ws.protocol import CandlesFrame, TickerFrame, parse_frame, product_id
from feeds.coinbase_ws.recording import Recording
from feeds.copytrade import protocol as copytrade
from feeds.copytrade.tradingview import parse_alert
from feeds.movers.protocol import parse_products
from hooks_runtime.validate import validate_result
from tests.audit.factory import hook, order, risk, run, wake
from tests.coinbase_fake import ticker
from tests.feeds.tradingview_client import alert
from tests.mutate import mutations

N = 1500  # per parser: ~0.1-0.5 s each

TICKERS = {
    "channel": "ticker", "timestamp": "2026-08-09T21:05:48.229198328Z", "sequence_num": 6,
    "events": [
        {"type": "snapshot", "tickers": [ticker("BTC-USD", "65086.18"), ticker("ETH-USD", "1925")]},
        {"type": "update", "tickers": [ticker("BTC-USD", "65087")]},
    ],
}  # fmt: skip
CANDLES = {
    "channel": "candles", "timestamp": "2026-08-09T21:05:48.229Z", "sequence_num": 7,
    "events": [{"type": "update", "candles": [
        {"start": "1786309200", "open": "100", "high": "101", "low": "99", "close": "100.5",
         "volume": "1.5", "product_id": "BTC-USD"},
    ]}],
}  # fmt: skip


def _trusted_price(value: Any) -> bool:
    return isinstance(value, float) and math.isfinite(value) and value > 0


def _check_event(at: int, event: FeedEvent) -> None:
    assert 0 <= at <= MAX_MS
    assert event.symbol is None or product_id(event.symbol) == event.symbol
    for key in ("price", "open", "high", "low", "close"):
        if key in event.payload:
            assert _trusted_price(event.payload[key]), (key, event.payload)


def test_coinbase_frames() -> None:
    """A ticker or candle passed on has a product id fit for a symbol and prices above 0."""
    passed = 0
    for frame in mutations([TICKERS, CANDLES], N, seed=1):
        try:
            parsed = parse_frame(json.dumps(frame))
        except MarketwakeError:
            continue
        if isinstance(parsed, TickerFrame):
            for t in parsed.tickers:
                assert product_id(t.product_id) == t.product_id and _trusted_price(t.price)
                passed += 1
        elif isinstance(parsed, CandlesFrame):
            for c in parsed.candles:
                low, high = c.candle.low, c.candle.high
                assert product_id(c.product_id) == c.product_id and _trusted_price(low)
                assert low <= min(c.candle.open, c.candle.close) <= high
                passed += 1
    assert passed > N // 10  # the mutations leave many frames valid: the checks ran


def test_coinbase_recordings() -> None:
    """A recorded line (wrapped with its receive time) gives events in time and priced."""
    lines = [{"recv_ts": 1786309548.64, "raw": frame} for frame in (TICKERS, CANDLES)]
    recording, events = Recording(), 0
    for line in mutations(lines, N, seed=2):
        if isinstance(line, dict) and isinstance(line.get("raw"), dict | list):
            line["raw"] = json.dumps(line["raw"])
        try:
            got = recording.parse(json.dumps(line)).events
        except MarketwakeError:
            continue
        for at, event in got:
            _check_event(at, event)
            events += 1
    assert events > N // 10


def test_candle_responses_and_rows() -> None:
    """Coinbase's REST candles and product list, and a CSV's candle rows: refused, or
    candles (and movers) priced above 0 whose high and low span open and close."""
    rest = {"candles": [CANDLES["events"][0]["candles"][0]]}  # type: ignore[index]
    products = {"products": [{
        "product_id": "SOL-USD", "price": "10.5", "price_percentage_change_24h": "7.25",
        "volume_24h": "1000", "quote_currency_id": "USD", "status": "online",
        "trading_disabled": False,
    }]}  # fmt: skip
    row = [1_786_309_200_000, 100.0, 101.0, 99.0, 100.5, 1.5]
    passed = 0
    for n, body in enumerate(mutations([rest, products, row], N, seed=7)):
        try:
            if isinstance(body, list):  # a CSV row
                candles = [
                    candle_csv.candle(",".join(map(str, body)), candle_csv.OWN, 300_000, "c.csv:2")
                ]
            elif isinstance(body, dict) and "products" in body:
                quotes = parse_products(json.dumps(body).encode(), frozenset())
                assert all(product_id(q.product_id) and _trusted_price(q.price) for q in quotes)
                passed += len(quotes)
                continue
            else:
                candles = parse_candles(json.dumps(body).encode(), "5m")
        except MarketwakeError:
            continue
        for c in candles:
            assert _trusted_price(c.low) and c.low <= min(c.open, c.close) <= c.high
            assert math.isfinite(c.high) and c.volume >= 0, (n, c)
            passed += 1
    assert passed > N // 10


def test_rag_requests() -> None:
    """query_patterns params, and JSON-RPC lines with bytes flipped: our errors only."""
    params = {
        "symbol": "BTCUSDT",
        "timestamp": 1_767_225_600_000,
        "current_state": dict.fromkeys(STATE_COLUMNS, 0.5),
        "query_config": {"lookback_days": 365},
    }
    valid = 0
    for i, mutated in enumerate(mutations([params], N, seed=3)):
        try:
            parse_params(mutated)
            valid += 1
        except MarketwakeError:
            pass
        line = bytearray(json.dumps({"jsonrpc": "2.0", "id": i, "params": mutated}).encode())
        line[i % len(line)] = (line[i % len(line)] + i) % 256
        jsonrpc.parse(bytes(line), 10)  # errors are answers, never raised
    assert valid > 0


RESULTS = [
    ("wake", {"decision": "WAKE", "reason": "x", "dedupeKey": "k", "cooldownSeconds": 60}),
    ("wake", {"decision": "ALERT", "reason": "x", "data": {"a": [1, 2]}}),
    ("autotrade", {"decision": "TRADE_INTENT", "reason": "r", "intent": {
        "action": "PLACE_LIMIT_ORDER", "symbol": "BTC-USD", "side": "buy", "volume": 0.1,
        "openPrice": 100.0, "stopLoss": 90.0, "takeProfit": 120.0, "expiresInSeconds": 60}}),
    ("autotrade", {"decision": "TRADE_INTENT", "reason": "r", "intent": {
        "action": "MODIFY_ORDER", "symbol": "BTC-USD", "orderId": "abc", "stopLoss": 5.0}}),
]  # fmt: skip


@pytest.mark.parametrize(("kind", "result"), RESULTS)
def test_hook_results(kind: str, result: dict[str, Any]) -> None:
    """What a hook returns becomes a Decision that encodes, or HookResultInvalid."""
    valid = 0
    for mutated in mutations([result], N // 2, seed=4):
        try:
            decision = validate_result(mutated, kind, 65_536)
        except MarketwakeError:
            continue
        msgspec.json.encode(decision)
        valid += 1
    assert valid > 0


def test_signal_bodies() -> None:
    """TradingView alerts and signed copy-trade signals: refused with SignalRejected
    (a status and a reason), or a signal whose amounts are above 0."""
    signal = {
        "leader": "alice", "signalId": "s1", "kind": "opened", "positionId": "p1",
        "symbol": "BTC-USD", "side": "long", "time": "2026-11-25T12:00:00Z",
        "quantity": 0.5, "price": 100.0, "stopLoss": 90.0, "takeProfit": 120.0,
    }  # fmt: skip
    passed = 0
    amounts: tuple[float | None, ...]
    for body in mutations([json.loads(alert()), signal], N, seed=5):
        data = json.dumps(body).encode()
        try:
            if isinstance(body, dict) and "leader" in body:
                got = copytrade.parse(data, "alice")
                amounts = (got.quantity, got.price, got.stop_loss, got.take_profit)
            else:
                tv = parse_alert(data, "application/json")
                amounts = (tv.contracts, tv.price)
        except MarketwakeError:
            continue
        assert all(a is None or _trusted_price(float(a)) for a in amounts)
        passed += 1
    assert passed > 0


def test_config_files() -> None:
    """The shipped config.toml with values mutated: a ConfigError naming the key, or a
    config (never a traceback)."""
    rows = (Path(__file__).resolve().parent.parent / "config.toml").read_text().splitlines()
    keys = [i for i, line in enumerate(rows) if "=" in line and line[:1].isalpha()]
    parsed = 0
    for n, odd in enumerate(mutations([[0], ["x"], {"a": 1.5}], 200, seed=6)):
        changed = list(rows)
        i = keys[n % len(keys)]
        changed[i] = changed[i].split("=", 1)[0] + "= " + _toml(odd)
        try:
            config.parse("\n".join(changed), "config.toml")
        except MarketwakeError:
            continue
        parsed += 1
    assert parsed > 0


def _toml(value: Any) -> str:
    """``value`` as a TOML literal (None, which TOML lacks, as "")."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(map(_toml, value)) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + "}"
    return json.dumps(value if value is not None else "")


def test_audit_rows(tmp_path: Path) -> None:
    """An audit log with damaged rows (a field of another type, keys gone or added): the
    restart's scan, the backtest report's reader, `audit tail` and `why` read it
    without a crash (the scan at a
    daemon's start tripped on a hook id that was a list, `tail` on risk reasons that
    were `true`, before stop 57)."""
    intent = {"action": "PLACE_LIMIT_ORDER", "symbol": "ETH-USD", "side": "buy", "volume": 1.0}
    rows = [
        hook(decision="WAKE", event_hooks=2), hook(hook_id="other", event_hooks=2),
        wake(run_id="r1", event_id="coinbase:ETH-USD:5m:1", reasons=["x"], hook_ids=["h"]),
        run(trace_ids=["t1"], event_ids=["coinbase:ETH-USD:5m:1"], duration_ms=5.0),
        risk(approved=False, reasons=[{"code": "LIMIT", "message": "m"}], intent=intent),
        order(),
    ]  # fmt: skip
    samples = [msgspec.to_builtins(r) for r in rows]
    for seed in range(6):
        audit = tmp_path / f"a{seed}"
        audit.mkdir()
        lines = [json.dumps(m) for m in mutations(samples, 150, seed=10 + seed)]
        (audit / "audit-2026-02-17.jsonl").write_text("\n".join(lines) + "\n")
        recent_evaluations(audit)
        Tally("alpha").read(line.encode() for line in lines)  # the backtest report's reader
        runner = CliRunner()
        for args in (["tail", "-n", "200"], ["tail", "--kind", "run"], ["tail", "--json"]):
            done = runner.invoke(audit_group, [*args, "--dir", str(audit)], catch_exceptions=False)
            assert done.exit_code == 0, done.output
        for ident in ("t1", "r1", "coinbase:ETH-USD:5m:1"):
            done = runner.invoke(why_command, [ident, "--dir", str(audit)], catch_exceptions=False)
            assert done.exit_code in (0, 1), done.output
