"""An intent whose rows reached the audit log but whose order a stop cut off (the
kill -9 window between the write-ahead and the order's record) is acted on after
the restart: on event time at its own event's market, as if never stopped; on wall
clock it is refused in the audit log (``CUT_SHORT``) and alerted, never placed late."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from daemon.agents.pipeline import open_agents
from daemon.app import build_feeds
from daemon.audit.reader import recent_evaluations
from daemon.audit.writer import AuditWriter
from daemon.config import Config
from daemon.service import Service
from daemon.trading.desk import TradeDesk
from daemon.trading.paper import PaperBroker
from feeds.synthetic import generate_candles
from tests.agents.test_pipeline import audit, workspace
from tests.agents.test_replay_restart import config
from tests.test_alerts import serve

TRADE_FIFTH = """
def evaluate(event, state):
    n = int(event["payload"]["closeTimeMs"] / 60000)
    if n % 5:
        return {"decision": "IGNORE", "reason": "not now"}
    side = "buy" if n % 10 else "sell"
    stop = event["payload"]["close"] * (0.5 if side == "buy" else 1.5)
    return {"decision": "TRADE_INTENT", "reason": side, "dedupeKey": "t:" + event["eventId"],
            "intent": {"action": "PLACE_MARKET_ORDER", "symbol": event["symbol"], "side": side,
                       "volume": 0.001, "stopLoss": stop}}
"""
CUT_AT = 3  # the third intent's order is cut off


def fills(root: Path) -> list[tuple[Any, ...]]:
    """Every filled order: (client order id, side, price, event time)."""
    return sorted(
        (r["clientOrderId"], r["side"], r["price"], r["eventTs"])
        for r in audit(root)
        if r["type"] == "order" and r["status"] == "FILLED"
    )


def quick_stop(cfg: Config) -> Config:
    daemon = msgspec.structs.replace(cfg.daemon, stop_timeout_seconds=0.5)
    return msgspec.structs.replace(cfg, daemon=daemon)


async def run_cut(
    cfg: Config, monkeypatch: pytest.MonkeyPatch, *, stage: str = "rows written"
) -> None:
    """Run until the CUT_AT-th intent reaches the desk, then hang there (the process
    frozen after its rows were written) and stop: the drain is cut, as by a kill.
    ``stage`` "placed": hang once the desk placed the order, its rows never written;
    "recorded": once the broker recorded it (PENDING_SUBMIT), its verdict's row
    never written and the order never opened; "approved": once its approval was
    written, before the broker got the order."""
    handle = TradeDesk.handle
    calls = 0
    reached = anyio.Event()

    async def frozen(*args: Any, **kwargs: Any) -> None:
        reached.set()
        await anyio.sleep_forever()

    async def hanging(self: TradeDesk, *args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == CUT_AT:
            with monkeypatch.context() as m:  # the rows stay queued: a kill takes them
                if stage == "placed":
                    m.setattr(AuditWriter, "write", lambda self, record: None)
                    await handle(self, *args, **kwargs)
                elif stage == "recorded":
                    m.setattr(TradeDesk, "_write_verdict", lambda self, *a: None)
                    m.setattr(PaperBroker, "_open", frozen)
                    await handle(self, *args, **kwargs)
                elif stage == "approved":  # the verdict's row written, the order not
                    m.setattr(PaperBroker, "submit", frozen)
                    await handle(self, *args, **kwargs)
            reached.set()
            await anyio.sleep_forever()
        return await handle(self, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(TradeDesk, "handle", hanging)
        await run_until(Service(cfg, build_feeds, components=[open_agents]), reached)


async def run_until(svc: Service, reached: anyio.Event) -> None:
    """Run ``svc`` and ask it to stop once ``reached`` is set (the process frozen
    there: with a short stop timeout, the drain is cut, as by a kill)."""
    async with anyio.create_task_group() as tg:

        async def stop() -> None:
            await reached.wait()
            svc.request_stop()

        tg.start_soon(stop)
        with anyio.fail_after(60):
            await svc.run()
        tg.cancel_scope.cancel()


async def reference_run(tmp_path: Path) -> tuple[Path, Path]:
    """60 generated candles (``c.csv``) replayed through TRADE_FIFTH under ``ref``,
    never stopped: the data and the reference's root."""
    csv = tmp_path / "c.csv"
    generate_candles(csv, seed=11, n=60, timeframe="1m")
    ref = tmp_path / "ref"
    svc = Service(config(ref, workspace(ref, {"autotrade_fifth.py": TRADE_FIFTH}), csv, 0),
                  build_feeds, components=[open_agents])  # fmt: skip
    with anyio.fail_after(60):
        await svc.run()
    return csv, ref


async def cut_beside_reference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stage: str
) -> tuple[Path, Path, Config]:
    """The same replay run through (under ``ref``) and stopped at its CUT_AT-th intent
    at ``stage`` (under ``cut``, see :func:`run_cut`): both roots and the config of
    the stopped one."""
    csv, ref = await reference_run(tmp_path)
    root = tmp_path / "cut"
    cfg = quick_stop(config(root, workspace(root, {"autotrade_fifth.py": TRADE_FIFTH}), csv, 0))
    await run_cut(cfg, monkeypatch, stage=stage)
    return ref, root, cfg


async def test_a_cut_off_intent_is_placed_at_its_own_event_after_the_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref, root, cfg = await cut_beside_reference(tmp_path, monkeypatch, "rows written")
    want = fills(ref)
    assert len(want) == 12
    before = fills(root)
    assert len(before) == CUT_AT - 1, "stopped at the cut intent"
    (cut,) = recent_evaluations(root / "state" / "audit").cut["alpha"]
    assert cut.output["reason"] in ("buy", "sell")

    svc = Service(cfg, build_feeds, components=[open_agents])
    with anyio.fail_after(60):
        await svc.run()
    assert fills(root) == want, "the cut intent filled at its own event's price"
    risk = [r for r in audit(root) if r["type"] == "risk"]
    assert len(risk) == len(want) and all(r["approved"] for r in risk)
    hooks = [r for r in audit(root) if r["type"] == "hook"]
    assert len(hooks) == 60, "no event evaluated twice"
    assert recent_evaluations(root / "state" / "audit").cut == {}


@pytest.mark.parametrize("clock", ["event", "wall"])
async def test_an_approval_whose_order_never_reached_the_broker_is_cut_short(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: str
) -> None:
    """The stop came after the verdict's row was written, before the broker had the
    order: the approval has no order row. On event time its intent is acted on at
    its own event (a second approval, in the new daemon run); on wall clock it is
    refused (CUT_SHORT), after its approval."""
    ref, root, cfg = await cut_beside_reference(tmp_path, monkeypatch, "approved")
    recent = recent_evaluations(root / "state" / "audit")
    assert recent.cut == {}, "its risk row was written"
    (unplaced,) = recent.unplaced["alpha"]
    assert unplaced.cut is not None and unplaced.cut.hook_id == "autotrade_fifth"
    cfg = msgspec.structs.replace(cfg, daemon=msgspec.structs.replace(cfg.daemon, clock=clock))
    svc = Service(cfg, build_feeds, components=[open_agents])
    with anyio.fail_after(60):
        await svc.run()
    verdicts = [
        (r["approved"], r["reasons"][0]["code"] if r["reasons"] else "")
        for r in audit(root)
        if r["type"] == "risk" and r["clientOrderId"] == unplaced.client_order_id
    ]
    if clock == "event":
        assert fills(root) == fills(ref)
        assert verdicts == [(True, ""), (True, "")]
    else:
        assert verdicts == [(True, ""), (False, "CUT_SHORT")]
        placed = {r["clientOrderId"] for r in audit(root) if r["type"] == "order"}
        assert unplaced.client_order_id not in placed
    assert recent_evaluations(root / "state" / "audit").unplaced == {}


@pytest.mark.parametrize("stage", ["placed", "recorded"])
async def test_a_cut_intent_whose_order_was_recorded_gets_its_rows_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stage: str
) -> None:
    """The kill came after the order was placed, before its verdict's and order's
    rows were written: the restart places nothing twice and audits the approval and
    the order as the broker holds it (its fill, its stop-loss), once. Recorded and
    never opened, the broker opens it at start (its rows written then): the restart
    adds the approval only (after the order's rows: a later restart finds nothing
    to write for it)."""
    ref, root, cfg = await cut_beside_reference(tmp_path, monkeypatch, stage)
    assert len(fills(root)) == CUT_AT - 1, "the third order's rows were never written"
    for _ in range(2):
        svc = Service(cfg, build_feeds, components=[open_agents])
        with anyio.fail_after(60):
            await svc.run()
    assert fills(root) == fills(ref)
    risk = [r for r in audit(root) if r["type"] == "risk"]
    assert len(risk) == len(fills(ref)) and all(r["approved"] for r in risk)
    assert len({r["clientOrderId"] for r in risk}) == len(risk), "one verdict an order"
    want = Counter((r["clientOrderId"], r["status"]) for r in audit(ref) if r["type"] == "order")
    got = Counter((r["clientOrderId"], r["status"]) for r in audit(root) if r["type"] == "order")
    assert got - want == Counter(), "no row twice"
    if stage == "placed":
        # The restored rows are the orders' state at the restart: the entry's OPEN
        # row, replaced by its fill on arrival, is the one the kill took for good.
        (lost,) = (want - got).keys()
        assert lost[1] == "OPEN" and (lost[0], "FILLED") in got
    else:
        assert got == want
    assert recent_evaluations(root / "state" / "audit").cut == {}


async def test_a_restart_stopped_before_its_redo_writes_no_row_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Recorded and never opened, the order is opened by the broker's recovery at the
    first restart (its rows written then), and that restart is stopped before the
    replay redoes the intent: the next restart writes the approval only, not the
    order's rows a second time."""
    from daemon.agents.dispatcher import Dispatcher

    ref, root, cfg = await cut_beside_reference(tmp_path, monkeypatch, "recorded")
    reached = anyio.Event()

    async def frozen(self: Dispatcher, *args: Any) -> None:
        reached.set()
        await anyio.sleep_forever()

    with monkeypatch.context() as m:
        m.setattr(Dispatcher, "_redo_cut", frozen)
        await run_until(Service(cfg, build_feeds, components=[open_agents]), reached)
    assert len(fills(root)) == CUT_AT, "the recovery's rows, written at that start"
    svc = Service(cfg, build_feeds, components=[open_agents])
    with anyio.fail_after(60):
        await svc.run()
    assert fills(root) == fills(ref)
    want = Counter((r["clientOrderId"], r["status"]) for r in audit(ref) if r["type"] == "order")
    got = Counter((r["clientOrderId"], r["status"]) for r in audit(root) if r["type"] == "order")
    assert got == want, "each row once"
    risk = [r["clientOrderId"] for r in audit(root) if r["type"] == "risk"]
    assert sorted(risk) == sorted(set(risk)) and len(risk) == len(fills(ref))


async def test_on_wall_clock_a_cut_off_intent_is_refused_not_placed_late(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    csv = tmp_path / "c.csv"
    generate_candles(csv, seed=11, n=60, timeframe="1m")
    root = tmp_path / "cut"
    cfg = quick_stop(config(root, workspace(root, {"autotrade_fifth.py": TRADE_FIFTH}), csv, 0))
    await run_cut(cfg, monkeypatch)
    (cut,) = recent_evaluations(root / "state" / "audit").cut["alpha"]

    runner, url, posted = await serve(200)  # the operator's alert webhook
    hooks = msgspec.structs.replace(cfg.hooks, alert_webhook=url)
    wall = msgspec.structs.replace(
        cfg, daemon=msgspec.structs.replace(cfg.daemon, clock="wall"), hooks=hooks
    )
    svc = Service(wall, build_feeds, components=[open_agents])
    try:
        with anyio.fail_after(60):
            await svc.run()
    finally:
        await runner.cleanup()
    assert [(a["eventId"], a["hookId"], a["reason"]) for a in posted] == [
        (cut.event_id, "autotrade_fifth", f"CUT_SHORT: not placed after the restart ({side})")
        for side in [cut.output["reason"]]
    ]
    refused = [r for r in audit(root) if r["type"] == "risk" and not r["approved"]]
    assert [(r["eventId"], r["reasons"][0]["code"]) for r in refused] == [
        (cut.event_id, "CUT_SHORT")
    ]
    placed = {r["clientOrderId"] for r in audit(root) if r["type"] == "order"}
    assert refused[0]["clientOrderId"] not in placed
    assert recent_evaluations(root / "state" / "audit").cut == {}


async def test_a_trade_events_rows_are_all_handed_to_the_os_before_the_next_event(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rows its actions wrote (risk, order placed, filled at arrival) are written
    ahead too, not left for the flusher's batch: a kill after the action loses none."""
    from daemon.agents.dispatcher import Dispatcher

    handle = Dispatcher.handle
    left: list[int] = []

    async def checked(self: Dispatcher, rt: Any, event: Any) -> Any:
        results = await handle(self, rt, event)
        if any(r.decision is not None and r.decision.name == "TRADE_INTENT" for r in results):
            left.append(self.audit.pending)  # type: ignore[attr-defined]
        return results

    monkeypatch.setattr(Dispatcher, "handle", checked)
    csv = tmp_path / "c.csv"
    generate_candles(csv, seed=11, n=30, timeframe="1m")
    cfg = config(tmp_path, workspace(tmp_path, {"autotrade_fifth.py": TRADE_FIFTH}), csv, 0)
    audit_cfg = msgspec.structs.replace(cfg.audit, flush_interval_seconds=3600)
    quiet = msgspec.structs.replace(cfg, audit=audit_cfg)
    svc = Service(quiet, build_feeds, components=[open_agents])
    with anyio.fail_after(60):
        await svc.run()
    assert len(fills(tmp_path)) == 6
    assert left == [0] * 6


async def test_a_runs_rows_reach_the_os_as_it_starts_and_as_it_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run's rows are written ahead, not left for the flusher's batch: a kill during
    the run leaves its start in the log, and one after it its end."""
    from daemon.wake.runners import LogRunner
    from daemon.wake.scheduler import WakeScheduler
    from tests.agents.test_pipeline import WAKE_EVERY

    writers: list[AuditWriter] = []
    init, run, execute = AuditWriter.__init__, LogRunner.run, WakeScheduler._execute
    at_start: list[int] = []
    at_end: list[int] = []

    def keep(self: AuditWriter, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        writers.append(self)

    async def starting(self: LogRunner, ctx: Any) -> Any:
        at_start.append(writers[-1].pending)
        return await run(self, ctx)

    async def ending(self: WakeScheduler, *args: Any) -> None:
        await execute(self, *args)
        at_end.append(writers[-1].pending)

    monkeypatch.setattr(AuditWriter, "__init__", keep)
    monkeypatch.setattr(LogRunner, "run", starting)
    monkeypatch.setattr(WakeScheduler, "_execute", ending)
    csv = tmp_path / "c.csv"
    generate_candles(csv, seed=11, n=20, timeframe="1m")
    cfg = config(tmp_path, workspace(tmp_path, {"wake_every.py": WAKE_EVERY}), csv, 0)
    audit_cfg = msgspec.structs.replace(cfg.audit, flush_interval_seconds=3600)
    svc = Service(msgspec.structs.replace(cfg, audit=audit_cfg), build_feeds,
                  components=[open_agents])  # fmt: skip
    with anyio.fail_after(60):
        await svc.run()
    runs = [r for r in audit(tmp_path) if r["type"] == "run"]
    assert len(at_start) == len(at_end) == len(runs) / 2 >= 2
    assert at_start == at_end == [0] * len(at_start)


async def test_on_wall_clock_a_cut_intent_whose_order_was_placed_gets_its_rows_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Live, the kill came after the order was placed: nothing is refused or
    alerted, and the approval and the order's state are audited at the start."""
    csv = tmp_path / "c.csv"
    generate_candles(csv, seed=11, n=60, timeframe="1m")
    root = tmp_path / "cut"
    cfg = quick_stop(config(root, workspace(root, {"autotrade_fifth.py": TRADE_FIFTH}), csv, 0))
    await run_cut(cfg, monkeypatch, stage="placed")
    (cut,) = recent_evaluations(root / "state" / "audit").cut["alpha"]
    wall = msgspec.structs.replace(cfg, daemon=msgspec.structs.replace(cfg.daemon, clock="wall"))
    svc = Service(wall, build_feeds, components=[open_agents])
    with anyio.fail_after(60):
        await svc.run()
    risk = [r for r in audit(root) if r["type"] == "risk" and r["eventId"] == cut.event_id]
    assert [r["approved"] for r in risk] == [True]
    coid = risk[0]["clientOrderId"]
    assert (coid, "FILLED") in {(r["clientOrderId"], r["status"]) for r in audit(root)
                                if r["type"] == "order"}  # fmt: skip
    assert recent_evaluations(root / "state" / "audit").cut == {}


@pytest.mark.parametrize("clock", ["event", "wall"])
async def test_broken_cut_rows_in_the_audit_are_skipped_not_fatal(
    tmp_path: Path, clock: str
) -> None:
    """The audit log is a file an operator (or a disk) can damage: intents in it that
    no longer parse, or name an agent that is gone, cost a warning, not the start;
    so do approvals of intents that do not parse (no order row after them)."""
    from daemon.audit.records import HookRecord, RiskRecord

    csv = tmp_path / "c.csv"
    generate_candles(csv, seed=11, n=20, timeframe="1m")
    first = int(csv.read_text().splitlines()[1].split(",")[0])
    ids = [f"replay:BTC-USD:1m:{first + 60_000 * n}" for n in (3, 6)]
    bad: list[dict[str, Any]] = [
        {"decision": "TRADE_INTENT", "reason": "r", "intent": "not an object"},
        {"decision": "TRADE_INTENT", "reason": "r", "intent": {
            "action": "PLACE_MARKET_ORDER", "symbol": "B" * 5000, "side": "buy", "volume": 1e308}},
    ]  # fmt: skip
    w = AuditWriter(tmp_path / "state" / "audit")
    for agent in ("alpha", "gone"):
        for event_id, output in zip(ids, bad, strict=True):
            w.write(HookRecord(
                ts="2026-01-01T00:00:00.000Z", agent_id=agent, trace_id="t", hook_id="autotrade_x",
                revision="r", kind="autotrade", event_id=event_id, topic="market.candle.closed",
                decision="TRADE_INTENT", reason="r", output=output,
            ))  # fmt: skip
        for n, intent in enumerate([{"action": "X"}, bad[1]["intent"]]):
            w.write(RiskRecord(
                ts="2026-01-01T00:00:00.000Z", agent_id=agent, trace_id="t", approved=True,
                hook_id="submit_trading_signal", intent=intent, client_order_id=f"mw-{agent}{n}",
            ))  # fmt: skip
    w.close()
    recent = recent_evaluations(tmp_path / "state" / "audit")
    assert len(recent.cut["alpha"]) == 2 and len(recent.unplaced["alpha"]) == 2
    cfg = config(tmp_path, workspace(tmp_path, {"autotrade_fifth.py": TRADE_FIFTH}), csv, 0)
    cfg = msgspec.structs.replace(cfg, daemon=msgspec.structs.replace(cfg.daemon, clock=clock))
    svc = Service(cfg, build_feeds, components=[open_agents])
    with anyio.fail_after(60):
        await svc.run()
    rows = audit(tmp_path)
    assert not [r for r in rows if r["type"] == "risk" and r["eventId"] in ids]
    assert not [r for r in rows if r["type"] == "risk" and r["hookId"] != "autotrade_fifth"]
    evaluated = [
        r["eventId"] for r in rows if r.get("hookId") == "autotrade_fifth" and r["type"] == "hook"
    ]
    everything = [f"replay:BTC-USD:1m:{first + 60_000 * n}" for n in range(1, 21)]
    # the rest of the replay ran; the two the rows name count as evaluated
    assert evaluated == [e for e in everything if e not in ids]


async def test_order_changes_a_stop_kept_from_the_audit_are_written_at_the_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bracket order's later changes (its stop-loss opened, then canceled when the
    position closed) are batched rows: a kill can take them while the broker has
    them. The restart writes each order's final state the audit lacks: the order
    rows then match a run that lost none (bar the steps in between), once."""
    from daemon.audit.records import OrderRecord

    csv, ref = await reference_run(tmp_path)
    want = Counter((r["clientOrderId"], r["status"]) for r in audit(ref) if r["type"] == "order")
    stops = sorted({c for c, _ in want if c.endswith(":sl")})
    assert len(stops) >= 4 and (stops[0], "CANCELED") in want

    root = tmp_path / "lost"
    cfg = config(root, workspace(root, {"autotrade_fifth.py": TRADE_FIFTH}), csv, 0)
    write = AuditWriter.write

    def losing(self: AuditWriter, record: Any) -> None:
        # every stop-loss's cancel, and the first one's every row: as a kill would
        if (
            isinstance(record, OrderRecord)
            and record.role == "stop_loss"
            and (record.status == "CANCELED" or record.client_order_id == stops[0])
        ):
            return
        write(self, record)

    with monkeypatch.context() as m:
        m.setattr(AuditWriter, "write", losing)
        svc = Service(cfg, build_feeds, components=[open_agents])
        with anyio.fail_after(60):
            await svc.run()
    got = Counter((r["clientOrderId"], r["status"]) for r in audit(root) if r["type"] == "order")
    assert (stops[0], "OPEN") not in got and (stops[1], "CANCELED") not in got
    for _ in range(2):  # restarted twice: the second finds nothing to write
        svc = Service(cfg, build_feeds, components=[open_agents])
        with anyio.fail_after(60):
            await svc.run()
    got = Counter((r["clientOrderId"], r["status"]) for r in audit(root) if r["type"] == "order")
    assert got - want == Counter(), "no row twice"
    assert want - got == Counter({(stops[0], "OPEN"): 1}), "only the step in between"


async def test_a_run_a_stop_cut_ends_as_interrupted_once(tmp_path: Path) -> None:
    """A run the store shows started and never finished (the daemon was killed during
    it) ends at the next start as failed, interrupted, in the audit log and the
    store, and is not run again; the start after that writes nothing more."""
    from daemon.wake.store import RunStore
    from tests.agents.test_pipeline import PacedFeed
    from tests.agents.test_pipeline import config as plain_config

    agents = workspace(tmp_path, {"autotrade_fifth.py": TRADE_FIFTH})
    store = RunStore.in_dir(tmp_path / "state")
    store.record_start("alpha", "r-cut", "wake", 1_700_000_000.0)
    store.record_start("alpha", "r-done", "wake", 1_700_000_100.0)
    store.record_finish("r-done", 1_700_000_160.0, "ok")
    store.close()
    for _ in range(2):
        svc = Service(plain_config(tmp_path, agents), lambda _: [PacedFeed([])],
                      components=[open_agents])  # fmt: skip
        with anyio.fail_after(60):
            await svc.run()
    (row,) = [r for r in audit(tmp_path) if r["type"] == "run"]
    assert (row["runId"], row["status"], row["eventTs"]) == (
        "r-cut",
        "failed",
        "2023-11-14T22:13:20.000Z",
    )
    assert row["error"].startswith("interrupted: the daemon stopped during this run")
    store = RunStore.in_dir(tmp_path / "state")
    try:
        assert store.unfinished("alpha") == []
        assert store.last_finish("alpha") == 1_700_000_160.0
    finally:
        store.close()
