"""An order a model's tool placed, which a stop cut off from its rows or from the
broker: no hook row announces it, so its approval's row reaches the OS before the
order is recorded, and the restart finds an approval with no order row. The broker
has the order: its rows are written. It has not: the approval is refused
(``CUT_SHORT``) and alerted, once (the run that asked is gone)."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from daemon.agents.pipeline import open_agents
from daemon.app import open_market, shared_pool
from daemon.audit.reader import recent_evaluations
from daemon.audit.writer import AuditWriter
from daemon.service import Service
from daemon.trading.paper import PaperBroker
from tests.agents.test_cut_intent import run_until
from tests.agents.test_pipeline import WAKE_EVERY, PacedFeed, audit, candle, config, workspace
from tests.llm.fakes import fake_openai, openai_turn
from tests.llm.test_daemon_llm import RUNNER
from tests.test_alerts import serve

SIGNAL = {
    "symbol": "BTC-USD", "confidence": 72, "entry_price": 100.0, "stop_loss": 95.0,
    "tp1": 110.0, "technical_score": 30, "sentiment_score": 20, "liquidity_score": 15,
    "correlation_score": 7, "analysis": "oversold bounce",
}  # fmt: skip


async def run_frozen(root: Path, monkeypatch: pytest.MonkeyPatch, stage: str) -> list[int]:
    """A wake whose model submits a signal; the process freezes at the broker's submit
    (``recorded``: before the order is recorded; ``placed``: once it is placed, its
    rows never written) and stops, its drain cut as by a kill. Returns the audit
    rows still queued when the broker was called."""
    writers: list[AuditWriter] = []
    init = AuditWriter.__init__

    def keep(self: AuditWriter, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        writers.append(self)

    submit = PaperBroker.submit
    queued: list[int] = []
    reached = anyio.Event()

    async def frozen(self: PaperBroker, request: Any) -> Any:
        queued.append(writers[-1].pending)
        if stage == "placed":
            with monkeypatch.context() as m:  # the order's rows stay queued: lost
                m.setattr(AuditWriter, "write", lambda self, record: None)
                await submit(self, request)
        reached.set()
        await anyio.sleep_forever()

    script = [openai_turn(calls=[("s1", "submit_trading_signal", SIGNAL)]), openai_turn("Done.")]
    async with fake_openai(script) as (_, url):
        toml = RUNNER.format(url=url) + "signal_notional = 50.0\n"
        agents = workspace(root, {"wake_every.py": WAKE_EVERY}, toml)
        cfg = config(root, agents)
        cfg = msgspec.structs.replace(
            cfg, daemon=msgspec.structs.replace(cfg.daemon, stop_timeout_seconds=0.5)
        )
        pool = shared_pool(cfg)
        assert pool is not None
        feed = PacedFeed([candle(0), candle(1)])
        svc = Service(cfg, lambda _: [feed], components=[partial(open_market, pool), open_agents])
        with monkeypatch.context() as m:
            m.setattr(AuditWriter, "__init__", keep)
            m.setattr(PaperBroker, "submit", frozen)
            await run_until(svc, reached)
    return queued


async def restart(root: Path, webhook: str | None = None) -> None:
    """The daemon again on the same state, live, with no market events."""
    cfg = config(root, root / "agents")
    hooks = msgspec.structs.replace(cfg.hooks, alert_webhook=webhook)
    wall = msgspec.structs.replace(cfg.daemon, clock="wall")
    svc = Service(
        msgspec.structs.replace(cfg, hooks=hooks, daemon=wall),
        lambda _: [PacedFeed([])],
        components=[open_agents],
    )
    with anyio.fail_after(30):
        await svc.run()


def rows_of(root: Path, kind: str) -> list[dict[str, Any]]:
    return [r for r in audit(root) if r["type"] == kind]


async def test_a_tool_order_never_recorded_is_refused_and_alerted_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    queued = await run_frozen(tmp_path, monkeypatch, "recorded")
    assert queued == [0], "the approval reached the OS before the broker was called"
    (approval,) = rows_of(tmp_path, "risk")
    assert approval["approved"] and approval["hookId"] == "submit_trading_signal"
    coid = approval["clientOrderId"]
    (unplaced,) = recent_evaluations(tmp_path / "state" / "audit").unplaced["alpha"]
    assert unplaced.client_order_id == coid and unplaced.cut is None

    runner, url, posted = await serve(200)  # the operator's alert webhook
    try:
        await restart(tmp_path, url)
    finally:
        await runner.cleanup()
    refused = [r for r in rows_of(tmp_path, "risk") if not r["approved"]]
    assert [(r["clientOrderId"], r["reasons"][0]["code"]) for r in refused] == [(coid, "CUT_SHORT")]
    assert "the run that asked for it is gone" in refused[0]["reasons"][0]["message"]
    assert [(a["hookId"], a["symbol"]) for a in posted] == [("submit_trading_signal", "BTC-USD")]
    assert posted[0]["reason"].startswith("CUT_SHORT: approved, then not placed")
    assert rows_of(tmp_path, "order") == []
    await restart(tmp_path)
    assert len([r for r in rows_of(tmp_path, "risk") if not r["approved"]]) == 1, "once"


async def test_a_tool_order_placed_before_the_stop_gets_its_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await run_frozen(tmp_path, monkeypatch, "placed")
    (approval,) = rows_of(tmp_path, "risk")
    coid = approval["clientOrderId"]
    assert rows_of(tmp_path, "order") == [], "the kill took the order's rows"
    await restart(tmp_path)
    assert [r["approved"] for r in rows_of(tmp_path, "risk")] == [True], "nothing refused"
    orders = rows_of(tmp_path, "order")
    assert [(r["clientOrderId"], r["status"], r["price"]) for r in orders] == [
        (coid, "OPEN", SIGNAL["entry_price"])
    ]
    assert orders[0]["traceId"] == approval["traceId"]
    assert recent_evaluations(tmp_path / "state" / "audit").unplaced == {}
