"""Builders of audit records for the audit tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from daemon.audit.records import HookRecord, OrderRecord, RiskRecord, RunRecord, WakeRecord

DAY = "2026-02-17"


def ts(day: str = DAY, sec: int = 0) -> str:
    return f"{day}T03:{sec // 60:02d}:{sec % 60:02d}.000Z"


def hook(**kw: Any) -> HookRecord:
    base: dict[str, Any] = {
        "ts": ts(),
        "agent_id": "alpha",
        "hook_id": "wake_two_green",
        "revision": "abc123def456",
        "kind": "wake",
        "event_id": "coinbase:ETH-USD:5m:1",
        "topic": "market.candle.closed",
        "symbol": "ETH-USD",
        "event_ts": "2025-03-01T12:05:00.000Z",
        "decision": "IGNORE",
        "reason": "one green candle",
        "trace_id": "t1",
        "runtime_ms": 0.12,
    }
    base.update(kw)
    return HookRecord(**base)


def wake(**kw: Any) -> WakeRecord:
    base: dict[str, Any] = {
        "ts": ts(sec=1),
        "agent_id": "alpha",
        "trace_id": "t1",
        "outcome": "woke",
    }
    base.update(kw)
    return WakeRecord(**base)


def run(**kw: Any) -> RunRecord:
    base: dict[str, Any] = {"ts": ts(sec=2), "agent_id": "alpha", "trace_id": "t1", "run_id": "r1"}
    base.update({"runner": "log", "status": "finished", **kw})
    return RunRecord(**base)


def risk(**kw: Any) -> RiskRecord:
    base: dict[str, Any] = {
        "ts": ts(sec=1),
        "agent_id": "alpha",
        "trace_id": "t1",
        "approved": True,
    }
    base.update({"symbol": "ETH-USD", **kw})
    return RiskRecord(**base)


def order(**kw: Any) -> OrderRecord:
    base: dict[str, Any] = {
        "ts": ts(sec=1),
        "agent_id": "alpha",
        "trace_id": "t1",
        "broker": "paper",
        "client_order_id": "mw-1",
        "symbol": "ETH-USD",
        "side": "buy",
        "order_type": "limit",
        "volume": 0.01,
        "status": "FILLED",
        "price": 1000.0,
    }
    base.update(kw)
    return OrderRecord(**base)


def opened_parts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The list the names of the audit files the readers open are added to, in order."""
    from daemon.audit import files

    opened: list[str] = []
    real = files.open_lines

    def counting(path: Path) -> Any:
        opened.append(path.name)
        return real(path)

    monkeypatch.setattr("daemon.audit.reader.open_lines", counting)
    return opened
