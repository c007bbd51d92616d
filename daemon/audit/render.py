"""Audit records as one readable, coloured line each (rich), or as JSON.

Colour carries the decision: WAKE green, TRADE_INTENT magenta, ALERT yellow,
IGNORE dim, errors and rejections red, anything suppressed struck through in
yellow, so a wall of IGNOREs does not hide the one line that mattered.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec
from rich.text import Text

from daemon.audit.reader import Record, decision_of
from daemon.printable import visible

_DECISION_STYLE = {
    "WAKE": "bold green",
    "TRADE_INTENT": "bold magenta",
    "ALERT": "bold yellow",
    "IGNORE": "dim",
    "ERROR": "bold red",
}
_encoder = msgspec.json.Encoder()


def visible_record(value: Any) -> Any:
    """A copy of a record with :func:`visible` applied to every string in it."""
    if isinstance(value, str):
        return visible(value)
    if isinstance(value, dict):
        return {visible(str(k)): visible_record(v) for k, v in value.items()}
    if isinstance(value, list):
        return [visible_record(v) for v in value]
    return value


def to_json(rec: Record) -> str:
    """The record as one compact JSON line (as stored)."""
    return _encoder.encode(rec).decode()


def _number(rec: Record, key: str) -> float:
    """``rec[key]`` when it is a number, else 0 (a hand-edited row still prints)."""
    value = rec.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def _s(rec: Record, key: str, default: str = "") -> str:
    value: Any = rec.get(key)
    return default if value is None else str(value)


def _clock(rec: Record) -> str:
    ts = _s(rec, "ts")
    return f"{ts[:10]} {ts[11:23]}" if len(ts) >= 23 else ts


def _hook(rec: Record, line: Text) -> None:
    decision = decision_of(rec)
    suppressed = _s(rec, "suppressedBy", "none")
    style = _DECISION_STYLE.get(decision, "bold")
    line.append(f"{_s(rec, 'hookId')} ", style="cyan")
    if suppressed != "none":
        line.append(decision, style="yellow strike")
        line.append(f" [suppressed: {suppressed}]", style="yellow")
    else:
        line.append(decision, style=style)
    if rec.get("reason"):
        line.append(f" {rec['reason']}")
    if rec.get("error"):
        line.append(f" error: {rec['error']}", style="red")
    line.append(
        f"  {_s(rec, 'symbol', '-')} {_s(rec, 'topic')}{_event_time(rec)} "
        f"{_number(rec, 'runtimeMs'):.2f}ms",
        style="dim",
    )


def market_time(rec: Record) -> str:
    """'DATE TIME' of the row's ``eventTs`` (its market time), or '' without one."""
    event_ts = _s(rec, "eventTs")
    return f"{event_ts[:10]} {event_ts[11:19]}" if len(event_ts) >= 19 else ""


def _event_time(rec: Record) -> str:
    when = market_time(rec)
    return f" event {when}" if when else ""


def _at_market_time(rec: Record, line: Text) -> None:
    """End the line with the row's market time (the event time on a replay)."""
    if when := _event_time(rec):
        line.append(f" {when.strip()}", style="dim")


def _wake(rec: Record, line: Text) -> None:
    outcome = _s(rec, "outcome")
    style = {"woke": "bold green", "queued": "green", "suppressed": "yellow"}.get(outcome, "bold")
    line.append(f"wake {outcome}", style=style)
    if outcome == "suppressed":
        line.append(f" by {_s(rec, 'suppressedBy')}", style="yellow")
        dropped = rec.get("dropped")
        if type(dropped) is int and dropped > 0:  # queued as decided, dropped later
            line.append(" (queued, then dropped before its run)", style="yellow")
    if rec.get("runId"):
        line.append(f" run {rec['runId']}")
    reasons = rec.get("reasons") or []
    if reasons:
        line.append(f" ({'; '.join(str(r) for r in reasons)})", style="dim")
    _at_market_time(rec, line)


def _run(rec: Record, line: Text) -> None:
    status = _s(rec, "status")
    line.append(
        f"run {_s(rec, 'runId')} {status}",
        style="red" if status in ("failed", "timeout") else "blue",
    )
    if rec.get("durationMs") is not None:
        line.append(f" in {_number(rec, 'durationMs'):.0f}ms", style="dim")
    if rec.get("error"):
        line.append(f" error: {rec['error']}", style="red")
    if rec.get("summary"):
        line.append(f" {rec['summary']}")
    _at_market_time(rec, line)


def _risk(rec: Record, line: Text) -> None:
    if rec.get("approved"):
        line.append("risk approved", style="green")
    else:
        codes = ", ".join(
            str(r.get("code")) for r in rec.get("reasons") or [] if isinstance(r, dict)
        )
        line.append(f"risk REJECTED {codes}", style="bold red")
    intent = rec.get("intent") or {}
    if isinstance(intent, dict) and intent:
        line.append(
            f"  {intent.get('action', '')} {intent.get('side', '')} {intent.get('volume', '')} "
            f"{_s(rec, 'symbol')}",
            style="dim",
        )
    _at_market_time(rec, line)


def price_text(price: object) -> str:
    """A price as a trader reads it: its 12 significant digits, no float tail (an
    average of partial fills may end in ...0000000002; 92265.66 is 92265.660000000003
    to 12 decimals), never an exponent; not a number: as is."""
    if isinstance(price, bool) or not isinstance(price, int | float):
        return str(price)
    if not math.isfinite(price) or price == 0:
        return f"{price:g}"
    decimals = max(0, 11 - math.floor(math.log10(abs(price))))
    text = f"{price:.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _order(rec: Record, line: Text) -> None:
    status = _s(rec, "status")
    style = {"FILLED": "bold magenta", "CANCELED": "yellow", "REJECTED": "red"}.get(
        status, "magenta"
    )
    line.append(f"order {status}", style=style)
    price = rec.get("price")
    at = f" @ {price_text(price)}" if price is not None else ""
    size = _s(rec, "volume")
    if rec.get("filled") is not None:
        size = f"{_s(rec, 'filled')} of {size}"
    line.append(
        f" {_s(rec, 'side')} {size} {_s(rec, 'symbol')}{at} "
        f"({_s(rec, 'orderType')}, {_s(rec, 'role')}) {_s(rec, 'clientOrderId')}"
    )
    if status in ("CANCELED", "REJECTED") and rec.get("reason"):
        line.append(f": {_s(rec, 'reason')}")  # canceled by request, expired, one-cancels-other
    _at_market_time(rec, line)


def _signal(rec: Record, line: Text) -> None:
    status = _s(rec, "status")
    style = {"accepted": "bold cyan", "duplicate": "dim", "rejected": "red"}.get(status, "cyan")
    line.append(f"signal {status}", style=style)
    answer = (
        f"({_s(rec, 'httpStatus')})" if rec.get("httpStatus") is not None else "(a leader agent's)"
    )
    line.append(f" {_s(rec, 'leader')}/{_s(rec, 'signalId', '?')} {answer}")
    if rec.get("reason"):
        line.append(f": {_s(rec, 'reason')}")
    if rec.get("remote"):
        line.append(f" from {_s(rec, 'remote')}", style="dim")
    _at_market_time(rec, line)


def _alert(rec: Record, line: Text) -> None:
    status = _s(rec, "status")
    style = {"posted": "bold cyan", "failed": "bold red", "refused": "red"}.get(status, "yellow")
    late = " (redelivered)" if rec.get("redelivered") else ""
    line.append(f"alert {status.upper() if status == 'failed' else status}{late}", style=style)
    line.append(f" {_s(rec, 'hookId')} at the webhook")
    if rec.get("error"):
        line.append(f": {_s(rec, 'error')}")
    if rec.get("kept"):
        line.append(" (kept: posted again later)", style="dim")
    _at_market_time(rec, line)


_RENDERERS = {
    "hook": _hook,
    "wake": _wake,
    "run": _run,
    "risk": _risk,
    "order": _order,
    "signal": _signal,
    "alert": _alert,
}


def render(rec: Record) -> Text:
    """One human-readable line for any record type (control characters escaped)."""
    rec = visible_record(rec)
    line = Text()
    line.append(f"{_clock(rec)} ", style="dim")
    line.append(f"{_s(rec, 'agentId', '?')} ", style="bold")
    renderer = _RENDERERS.get(_s(rec, "type"))
    if renderer is None:
        line.append(to_json(rec))
    else:
        renderer(rec, line)
    if rec.get("traceId"):
        line.append(f"  trace={rec['traceId']}", style="dim")
    return line
