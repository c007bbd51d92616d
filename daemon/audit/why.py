"""``marketwake why``: everything the audit log knows about one event or trace.

Given an eventId or a traceId we gather the hook evaluations, wake decisions,
runs, risk verdicts and orders that share it (an eventId is widened to the
traceIds its records carry, since runs and orders only know the trace) and tell,
per agent, what each hook decided and why the agent did or did not wake or trade.
An order's clientOrderId (as ``status`` and ``audit tail`` show it) tells the
story of the event that placed it, for the agent that placed it (a trace is its
event's, shared by every agent that evaluated the event).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Literal

import msgspec
from rich.text import Text

from daemon.audit.reader import (
    AuditFilter,
    Record,
    decision_of,
    event_ms,
    iter_records,
    ts_ms,
)
from daemon.audit.render import market_time, price_text, visible_record
from daemon.events import candle_close_of

Outcome = Literal[
    "TRADED",
    "ORDER_OPEN",
    "NOT_FILLED",
    "TRADE_REJECTED",
    "WOKE",
    "QUEUED",
    "SUPPRESSED",
    "ALERTED",
    "HOOK_ERROR",
    "NO_WAKE",
    "NOT_SEEN",
]
FILLED = ("FILLED", "PARTIALLY_FILLED")
TRACE_MARGIN_MS = 3_600_000
ENDED = ("CANCELED", "REJECTED")


class AgentStory(msgspec.Struct, kw_only=True, rename="camel"):
    """One agent's part in the story: an outcome, a one-line why, and the evidence."""

    agent_id: str
    outcome: Outcome = "NOT_SEEN"
    why: str = ""
    details: list[str] = msgspec.field(default_factory=list)
    records: list[Record] = msgspec.field(default_factory=list)


class Explanation(msgspec.Struct, kw_only=True, rename="camel"):
    """The answer to ``why <id>``."""

    query: str
    event_ids: list[str]
    trace_ids: list[str]
    agents: list[AgentStory]
    # The events' own times (from the hook rows), beside the rows' wall-clock ts.
    event_times: dict[str, str] = msgspec.field(default_factory=dict)

    @property
    def found(self) -> bool:
        """True when at least one record matched."""
        return bool(self.agents)


def collect(directory: Path, ident: str, since_ms: int | None = None) -> list[Record]:
    """Records whose eventId, traceId, clientOrderId or runId is ``ident``, plus all
    records of their traces (of an order's or a run's, its own agent's only: a
    trace is an event's, which every agent evaluated)."""
    direct = _direct(directory, ident, since_ms)
    traces = {str(r["traceId"]) for r in direct if r.get("traceId")}
    # A run's row lists the traces of every wake it took (collect mode merges them).
    traces |= {t for r in direct if r.get("runId") == ident for t in _trace_ids(r)}
    traces -= {ident}
    if not traces:
        return sorted(direct, key=_order)
    owners = {r.get("agentId") for r in direct if ident in (r.get("clientOrderId"), r.get("runId"))}
    if not owners:
        # An event's trace starts at its evaluation: the rows of its trace were written
        # no earlier (an hour's margin for a clock set back), so the passes below skip
        # the days before it (an order's trace, found by the order, began before it).
        first = min((ts_ms(r) for r in direct), default=0) - TRACE_MARGIN_MS
        flt = AuditFilter(since_ms=max(since_ms or 0, first) or None)
    else:
        flt = AuditFilter(since_ms=since_ms)
    linked = [
        r
        for r in iter_records(directory, flt, ids=sorted(traces))
        # (a run row bears its first wake's trace, and lists those merged into it)
        if (r.get("traceId") in traces or not traces.isdisjoint(_trace_ids(r)))
        and not _names(r, ident)
        and (not owners or r.get("agentId") in owners)
    ]
    found = [*direct, *linked]
    # A run the daemon's stop cut ends in a row of its own run id but no trace (the
    # store keeps no traces): looked for when a woken run shows no end here.
    ended = {
        r.get("runId") for r in found if r.get("type") == "run" and r.get("status") != "started"
    }
    open_runs = {
        str(r["runId"])
        for r in found
        if r.get("type") == "wake" and r.get("runId") and r.get("runId") not in ended
    }
    if open_runs:
        found += [
            r
            for r in iter_records(directory, flt, ids=sorted(open_runs))
            if r.get("type") == "run" and r.get("runId") in open_runs and not r.get("traceId")
        ]
    return sorted(found, key=_order)


def _direct(directory: Path, ident: str, since_ms: int | None) -> list[Record]:
    """The records that name ``ident``. A candle's event id carries its close time, and
    no row about it was written before (live, or a replay of the past): the days before
    it are read only when nothing turned up after it (future-dated synthetic data, a
    clock set back more than the margin)."""

    def read(since: int | None) -> list[Record]:
        flt = AuditFilter(since_ms=since)
        return [r for r in iter_records(directory, flt, ids=[ident]) if _names(r, ident)]

    close = candle_close_of(ident)
    narrowed = None if close is None else close - TRACE_MARGIN_MS
    if narrowed is not None and narrowed > (since_ms or 0):
        found = read(narrowed)
        if found:
            return found
    return read(since_ms)


def event_at(
    directory: Path, at_ms: int, symbol: str | None = None, agent: str | None = None
) -> str | None:
    """The eventId of the first event at or after ``at_ms`` (market time) a hook
    evaluated, of ``symbol`` / ``agent`` if given; None when there is none."""
    flt = AuditFilter(types=frozenset({"hook"}), from_ms=at_ms, symbol=symbol, agent=agent)
    best: tuple[int, str] | None = None
    for r in iter_records(directory, flt, contains=['"type":"hook"']):
        event_id = r.get("eventId")
        if not isinstance(event_id, str) or not event_id:
            continue  # a damaged row: nothing to explain
        key = (event_ms(r), event_id)  # by time, whatever format the row spells it in
        if best is None or key < best:
            best = key
    return None if best is None else best[1]


def _names(r: Record, ident: str) -> bool:
    """Whether the record is about ``ident``: its event, trace, order or run."""
    return ident in (
        r.get("eventId"), r.get("traceId"), r.get("clientOrderId"), r.get("runId")
    ) or ident in _trace_ids(r)  # fmt: skip


def _int(value: object) -> int:
    """A row's count (0 when it is not one: a damaged row, an older row without it)."""
    return value if type(value) is int else 0


def _trace_ids(r: Record) -> list[str]:
    """A run row's ``traceIds`` (of a damaged row, only the strings of a list)."""
    listed = r.get("traceIds")
    return [t for t in listed if isinstance(t, str)] if isinstance(listed, list) else []


# Within one millisecond, show cause before effect.
_RANK = {"hook": 0, "risk": 1, "wake": 2, "order": 3, "run": 4}


def _order(r: Record) -> tuple[str, int]:
    return str(r.get("ts", "")), _RANK.get(str(r.get("type")), 5)


def _hook_line(r: Record) -> str:
    decision = decision_of(r)
    text = f"hook {r.get('hookId')} ({r.get('kind')}, rev {str(r.get('revision') or '')[:12]}) → {decision}"
    if r.get("reason"):
        text += f": {r['reason']}"
    if r.get("error"):
        text += f" [error: {r['error']}]"
    if r.get("suppressedBy") not in (None, "none"):
        text += f" [suppressed by {r['suppressedBy']}]"
    return text


def _other_line(r: Record) -> str:
    kind = r.get("type")
    if kind == "wake":
        by = f" by {r.get('suppressedBy')}" if r.get("outcome") == "suppressed" else ""
        run = f" → run {r.get('runId')}" if r.get("runId") else ""
        return f"wake scheduler: {r.get('outcome')}{by}{run}"
    if kind == "run":
        err = f" [error: {r['error']}]" if r.get("error") else ""
        took = (
            f" in {r['durationMs']:.0f} ms" if isinstance(r.get("durationMs"), float | int) else ""
        )
        return f"run {r.get('runId')} ({r.get('runner')}) {r.get('status')}{took}{err}"
    if kind == "risk":
        if r.get("approved"):
            return f"risk approved {r.get('symbol')} (order {r.get('clientOrderId')})"
        reasons = r.get("reasons") or []
        text = "; ".join(
            f"{x.get('code')}: {x.get('message')}" for x in reasons if isinstance(x, dict)
        )
        return f"risk rejected {r.get('symbol')}: {text}"
    if kind == "order":
        price = f" @ {price_text(r['price'])}" if r.get("price") is not None else ""
        return (
            f"order {r.get('clientOrderId')} {r.get('status')} {r.get('side')} {r.get('volume')} "
            f"{r.get('symbol')}{price} ({r.get('role')}){_why_ended(r)}{_at(r)}"
        )
    if kind == "alert":
        return f"alert of {r.get('hookId')} at the webhook: {_delivery(r)}"
    return f"{kind} record"


def _delivery(r: Record) -> str:
    """What an alert row says became of the alert at the webhook."""
    status, error = r.get("status"), r.get("error")
    late = " (posted again after a restart or an outage)" if r.get("redelivered") else ""
    if status == "posted":
        return f"posted{late}"
    if status == "failed":
        then = "kept, to be posted again" if r.get("kept") else "not posted again"
        return f"NOT DELIVERED{late} ({error}); {then}"
    return f"{status} ({error}){late}"


def _trade_summary(orders: list[Record]) -> str:
    """'entry X FILLED @ p; closed by stop_loss @ q' from the order records, in order."""
    entries = [r for r in orders if r.get("role") in ("entry", "close")] or orders
    last = entries[-1]
    price = f" @ {price_text(last['price'])}" if last.get("price") is not None else ""
    text = f"order {last.get('clientOrderId')} {last.get('status')}{price}{_why_ended(last)}"
    exits = [
        r for r in orders if r is not last and r.get("status") == "FILLED" and r not in entries
    ]
    if exits:
        text += f"; closed by {exits[-1].get('role')} @ {price_text(exits[-1].get('price'))}{_at(exits[-1])}"
    return text


def _order_outcome(orders: list[Record]) -> Outcome:
    """TRADED once any order filled (even in part); else ORDER_OPEN while one is still
    working, NOT_FILLED when every one ended (canceled, expired, refused) unfilled."""
    if any(r.get("status") in FILLED for r in orders):
        return "TRADED"
    # str(): a row is read back from a file, where an id may be anything JSON holds
    last = {str(r.get("clientOrderId")): r.get("status") for r in orders}
    return "NOT_FILLED" if all(status in ENDED for status in last.values()) else "ORDER_OPEN"


def _why_ended(r: Record) -> str:
    """': <reason>' of a canceled or rejected order row (expired, one-cancels-other, by
    request), or ''."""
    if r.get("status") in ENDED and r.get("reason"):
        return f": {r.get('reason')}"
    return ""


def _at(r: Record) -> str:
    """' at <market time>' of an order row (the broker's time of the change), or ''."""
    when = market_time(r)
    return f" at {when}" if when else ""


def _judge(recs: list[Record]) -> tuple[Outcome, str]:
    """The agent's outcome and a one-line reason, most consequential first."""
    hooks = [r for r in recs if r.get("type") == "hook"]
    by_type = {t: [r for r in recs if r.get("type") == t] for t in ("wake", "risk", "order")}
    wanted = [r for r in hooks if decision_of(r) in ("WAKE", "TRADE_INTENT")]
    suppressed = [r for r in wanted if r.get("suppressedBy") not in (None, "none")]
    if by_type["order"]:
        return _order_outcome(by_type["order"]), _trade_summary(by_type["order"])
    rejected = [r for r in by_type["risk"] if not r.get("approved")]
    if rejected:
        codes = sorted(
            {
                str(x.get("code"))
                for r in rejected
                for x in r.get("reasons") or []
                if isinstance(x, dict)
            }
        )
        return "TRADE_REJECTED", f"the risk engine rejected the trade intent: {', '.join(codes)}"
    who = ", ".join(str(r.get("hookId")) for r in wanted if decision_of(r) == "WAKE") or "a hook"
    runs = [r for r in recs if r.get("type") == "run"]
    if runs:  # the run happened: say how it ended
        last = runs[-1]
        n = last.get("wakes")
        merged = f" (one run for {n} wakes: collect mode merged them)" if _int(n) > 1 else ""
        return "WOKE", f"{who} returned WAKE; run {last.get('runId')} {last.get('status')}{merged}"
    sup_w = [w for w in by_type["wake"] if w.get("outcome") == "suppressed"]
    pairs: tuple[tuple[str, Outcome], ...] = (("woke", "WOKE"), ("queued", "QUEUED"))
    for outcome, label in pairs:
        hit = [w for w in by_type["wake"] if w.get("outcome") == outcome]
        if hit and not (label == "QUEUED" and sup_w):
            return label, f"{who} returned WAKE; run {hit[-1].get('runId')}"
    if sup_w or suppressed:
        by = sorted({str(r.get("suppressedBy")) for r in [*sup_w, *suppressed]})
        return "SUPPRESSED", f"a hook asked to act but it was suppressed by {', '.join(by)}"
    raised = [
        r for r in hooks if decision_of(r) == "ALERT" and r.get("suppressedBy") in (None, "none")
    ]
    if raised:
        who = ", ".join(dict.fromkeys(str(r.get("hookId")) for r in raised))
        sent = [r for r in recs if r.get("type") == "alert"]
        where = (
            f"webhook: {_delivery(sent[-1])}"
            if sent
            else "logged (no webhook was set, or a replay on event time)"
        )
        return "ALERTED", f"{who} returned ALERT; {where}"
    errors = [r for r in hooks if r.get("error")]
    if errors and not wanted:
        return (
            "HOOK_ERROR",
            f"{len(errors)} hook(s) failed: {errors[0].get('hookId')}: {errors[0].get('error')}",
        )
    if hooks:
        ignores = [r for r in hooks if decision_of(r) in ("IGNORE", "ALERT")]
        reasons = "; ".join(
            f"{r.get('hookId')}: {r.get('reason') or '(no reason)'}" for r in ignores[:5]
        )
        return "NO_WAKE", f"no hook returned WAKE or TRADE_INTENT ({reasons})"
    return "NOT_SEEN", "no hook evaluation of this event was recorded"


def explain(records: Iterable[Record], query: str) -> Explanation:
    """Group ``records`` per agent and judge each agent's outcome (every string of
    every record with control characters escaped: hooks write reasons and keys)."""
    recs = [visible_record(r) for r in records]
    stories: dict[str, AgentStory] = {}
    for r in recs:
        agent = str(r.get("agentId") or "?")
        story = stories.setdefault(agent, AgentStory(agent_id=agent))
        story.records.append(r)
        line = _hook_line(r) if r.get("type") == "hook" else _other_line(r)
        run = r.get("daemonRun")
        story.details.append(f"[run {run}] {line}" if run else line)
    for story in stories.values():
        story.outcome, story.why = _judge(story.records)
    return Explanation(
        query=query,
        event_ids=sorted({str(r["eventId"]) for r in recs if r.get("eventId")}),
        trace_ids=sorted({str(r["traceId"]) for r in recs if r.get("traceId")}),
        agents=sorted(stories.values(), key=lambda s: s.agent_id),
        event_times={
            str(r["eventId"]): str(r["eventTs"])
            for r in recs
            if r.get("eventId") and isinstance(r.get("eventTs"), str)
        },
    )


_OUTCOME_STYLE = {
    "TRADED": "bold magenta",
    "ORDER_OPEN": "magenta",
    "NOT_FILLED": "yellow",
    "TRADE_REJECTED": "bold red",
    "WOKE": "bold green",
    "QUEUED": "green",
    "SUPPRESSED": "bold yellow",
    "ALERTED": "bold cyan",
    "HOOK_ERROR": "bold red",
    "NO_WAKE": "dim",
}


def render_explanation(exp: Explanation) -> list[Text]:
    """Readable lines: a header, then per agent its outcome, why, and the evidence."""
    if not exp.found:
        return [Text(f"no audit records for {exp.query}", style="yellow")]
    events = [
        f"{e} (event time {exp.event_times[e]})" if e in exp.event_times else e
        for e in exp.event_ids
    ]
    lines = [
        Text(
            f"{exp.query}: events {', '.join(events) or '-'}; traces {', '.join(exp.trace_ids)}",
            style="bold",
        )
    ]
    for story in exp.agents:
        head = Text(f"agent {story.agent_id}: ", style="bold")
        head.append(story.outcome, style=_OUTCOME_STYLE.get(story.outcome, "bold"))
        head.append(f" — {story.why}")
        lines.append(head)
        lines.extend(Text(f"    {d}") for d in story.details)
    return lines
