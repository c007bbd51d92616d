"""Reconciliation through the real daemon: a follower whose hook does not copy is
found in drift, and, as its agent.toml says, alerted about once or corrected
through its risk engine, exactly once per drift, across rounds and a restart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio

from tests.agents.test_copytrade_signals import evaluated, run_daemon
from tests.agents.test_pipeline import audit
from tests.feeds.copytrade_client import post, signal
from tests.test_alerts import serve

# A follower that lets reconciliation do the copying (or reports that it did not).
BYSTANDER = """
def evaluate(event, state):
    p = state["copytrade"]["position"]
    return {"decision": "IGNORE", "reason": "target " + str(p["target"] if p else None)}
"""


def follower(root: Path, reconcile: str, **extra: str) -> None:
    hooks = root / "agents" / "follower" / "hooks"
    hooks.mkdir(parents=True)
    settings = "".join(f"{k} = {v}\n" for k, v in extra.items())
    (hooks.parent / "agent.toml").write_text(
        'topics = ["copytrade.signal.*"]\n'
        f'[copytrade]\nreconcile = "{reconcile}"\nratio = 0.5\n{settings}'
    )
    (hooks / "copytrade_bystander.py").write_text(BYSTANDER)


def orders(root: Path) -> list[tuple[str, str, float]]:
    return [
        (r["role"], r["side"], r["volume"])
        for r in audit(root)
        if r["type"] == "order" and r["status"] == "FILLED"
    ]


async def rounds(n: int) -> None:
    await anyio.sleep(0.2 * n + 0.3)  # reconcile_seconds = 0.2


async def test_drift_is_corrected_through_the_risk_engine_once(tmp_path: Path) -> None:
    follower(tmp_path, "correct")

    async def open_then_close(url: str) -> None:
        body = signal("s1", quantity=0.02, price=96500.0, stopLoss=94000.0)
        assert (await post(url, body))[0] == 200
        await evaluated(tmp_path, 1)
        await rounds(3)  # corrected by the first round after it, then on target
        assert (await post(url, signal("s2", "closed")))[0] == 200
        await evaluated(tmp_path, 2)
        await rounds(3)

    status = await run_daemon(tmp_path, open_then_close, reconcile_seconds=0.2)
    assert [r["reason"] for r in audit(tmp_path) if r["type"] == "hook"] == [
        "target 0.01",
        "target 0.0",
    ]
    # half the leader's 0.02 with its stop-loss, then exactly that closed
    assert orders(tmp_path) == [
        ("entry", "buy", 0.01),
        ("close", "sell", 0.01),
    ]
    risk = [r for r in audit(tmp_path) if r["type"] == "risk"]
    assert [(r["hookId"], r["approved"]) for r in risk] == [("reconcile", True)] * 2
    stats = status.components["copytrade"]
    assert stats["corrections"] == 2 and stats["drift"] == {} and stats["rounds"] >= 4

    # a restart: the corrective orders are known by their keys; nothing is placed again
    async def idle(url: str) -> None:
        await rounds(2)

    again = await run_daemon(tmp_path, idle, reconcile_seconds=0.2)
    assert again.components["copytrade"]["corrections"] == 0
    assert len(orders(tmp_path)) == 2


async def test_drift_alerts_once_and_a_refused_correction_alerts_once(tmp_path: Path) -> None:
    runner, url, alerts = await serve(200)
    try:
        # alert mode: one ALERT however many rounds find the drift
        follower(tmp_path / "a", "alert")

        async def entry(url: str) -> None:
            body = signal("s1", quantity=0.02, price=96500.0, stopLoss=94000.0)
            assert (await post(url, body))[0] == 200
            await evaluated(tmp_path / "a", 1)
            await rounds(4)

        status = await run_daemon(tmp_path / "a", entry, url, reconcile_seconds=0.2)
        assert [a["reason"] for a in alerts] == [
            "copy drift: holds 0 of alice/p1 (long BTC-USD), target 0.01"
        ]
        assert orders(tmp_path / "a") == []
        [d] = status.components["copytrade"]["drift"]["follower"]
        assert (d["positionId"], d["target"], d["held"]) == ("p1", 0.01, 0.0)

        # correct mode, but the risk engine refuses (no stop-loss: require_stop_loss)
        alerts.clear()
        follower(tmp_path / "c", "correct")

        async def unprotected(url: str) -> None:
            assert (await post(url, signal("s1", quantity=0.02, price=96500.0)))[0] == 200
            await evaluated(tmp_path / "c", 1)
            await rounds(4)

        status = await run_daemon(tmp_path / "c", unprotected, url, reconcile_seconds=0.2)
        assert [a["reason"] for a in alerts] == [
            (
                "copy corrective order refused by the risk engine: holds 0 of alice/p1 "
                "(long BTC-USD), target 0.01"
            )
        ]
        risk: list[dict[str, Any]] = [r for r in audit(tmp_path / "c") if r["type"] == "risk"]
        assert len(risk) >= 3 and not any(r["approved"] for r in risk)  # tried each round
        assert {c["code"] for c in risk[0]["reasons"]} == {"STOP_LOSS_REQUIRED"}
        assert orders(tmp_path / "c") == []
    finally:
        await runner.cleanup()
