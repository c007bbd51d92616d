"""A replayed candle stream through a stand-in hook, the TradeDesk, the paper broker and
the audit log; then `audit tail` and `why` answer questions about it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
from click.testing import CliRunner

from daemon.audit.records import HookRecord, now_ts
from daemon.audit.why import collect, explain
from daemon.audit.writer import AuditWriter
from daemon.cli.audit import audit_group, why_command
from daemon.events import FeedEvent, trace_id_for
from daemon.trading.desk import TradeDesk, audited_publish
from daemon.trading.intents import parse_intent
from daemon.trading.paper import PaperBroker
from feeds.config import ReplaySection
from feeds.replay import ReplayFeed
from feeds.synthetic import generate_candles


def doji_hook(event: FeedEvent) -> dict[str, Any]:
    """In-process stand-in for autotrade_doji.py: buy a doji's close minus 0.2 %."""
    p = event.payload
    close = float(p["close"])
    if abs(close - float(p["open"])) > close * 0.0002:
        return {"decision": "IGNORE", "reason": "no doji"}
    intent = {
        "action": "PLACE_LIMIT_ORDER",
        "symbol": event.symbol,
        "side": "buy",
        "volume": 0.01,
        "openPrice": round(close * 0.998, 2),
        "stopLoss": round(close * 0.99, 2),
        "takeProfit": round(close * 1.01, 2),
    }
    return {
        "decision": "TRADE_INTENT",
        "reason": "doji",
        "intent": intent,
        "dedupeKey": event.event_id,
    }


async def replay(tmp_path: Path) -> tuple[Path, list[str], list[str]]:
    csv = tmp_path / "synthetic_BTC-USD_1m.csv"
    generate_candles(csv, seed=7, n=400)
    feed = ReplayFeed(ReplaySection(path=str(csv), symbol="BTC-USD", timeframe="1m"))
    audit = AuditWriter(tmp_path / "audit")

    published: list[FeedEvent] = []

    async def publish(event: FeedEvent) -> None:
        published.append(event)

    broker = PaperBroker(tmp_path / "paper", audited_publish(publish, audit), synchronous="NORMAL")
    desk = TradeDesk(broker, audit)
    traded, ignored = [], []
    for raw in feed.events():
        event = msgspec.structs.replace(raw, trace_id=trace_id_for(raw.event_id))
        await broker.on_market_event(event)
        out = doji_hook(event)
        audit.write(
            HookRecord(
                ts=now_ts(),
                agent_id="example",
                hook_id="autotrade_doji",
                revision="r1",
                kind="autotrade",
                event_id=event.event_id,
                topic=event.topic,
                symbol=event.symbol,
                decision=out["decision"],
                reason=out["reason"],
                dedupe_key=out.get("dedupeKey"),
                trace_id=event.trace_id,
            )
        )
        if out["decision"] == "TRADE_INTENT":
            await desk.handle(
                parse_intent(out["intent"]),
                agent_id="example",
                dedupe_key=out["dedupeKey"],
                trace_id=event.trace_id,
                hook_id="autotrade_doji",
                event_id=event.event_id,
            )
            traded.append(event.event_id)
        else:
            ignored.append(event.event_id)
    broker.close()
    audit.close()
    return tmp_path / "audit", traded, ignored


async def test_replayed_stream_tail_and_why(tmp_path: Path) -> None:
    """Every doji is in `tail --decision TRADE_INTENT`; `why` follows a doji to its later fill."""
    logdir, traded, ignored = await replay(tmp_path)
    assert traded and ignored
    result = CliRunner().invoke(
        audit_group,
        ["tail", "--dir", str(logdir), "--decision", "TRADE_INTENT", "--json", "-n", "1000"],
    )
    assert [json.loads(line)["eventId"] for line in result.output.splitlines()] == traded
    outcomes = {}
    for event_id in traded:
        (story,) = explain(collect(logdir, event_id), event_id).agents
        outcomes[event_id] = (story.outcome, story.details)
    closed = [
        eid for eid, (outcome, details) in outcomes.items()
        if outcome == "TRADED" and any("FILLED" in d and "(entry)" in d for d in details)
        and any("FILLED" in d and ("stop_loss" in d or "take_profit" in d) for d in details)
    ]  # fmt: skip
    assert closed, outcomes  # a doji's trace reaches its entry fill and its bracket exit
    placed = [d for eid in closed for d in outcomes[eid][1] if "OPEN" in d and "(entry)" in d]
    assert len(placed) == len(closed)  # each state change audited once
    # each order line says when, in market time, it happened: an exit after its entry
    for eid in closed:
        times = [d.rsplit(" at ", 1)[1] for d in outcomes[eid][1] if d.startswith("order ")]
        entry_at = next(d for d in outcomes[eid][1] if "FILLED" in d and "(entry)" in d)
        assert all(len(t) == 19 for t in times) and max(times) > entry_at.rsplit(" at ", 1)[1]
    assert {o for o, _ in outcomes.values()} <= {
        "TRADED",
        "ORDER_OPEN",
        "NOT_FILLED",
        "TRADE_REJECTED",
    }
    for outcome, details in outcomes.values():  # TRADED exactly when something filled
        assert (outcome == "TRADED") == any(
            " FILLED " in d or "PARTIALLY_FILLED" in d for d in details
        ), details
    text = CliRunner().invoke(why_command, [ignored[0], "--dir", str(logdir)]).output
    assert "agent example: NO_WAKE" in text and "no doji" in text
