"""The audit record types, tagged by ``type`` and camelCase on the wire.

Every field is always written (nulls included), so every line of a type has
the same keys and ``jq`` filters never trip on a missing one. ``ts`` is when
marketwake did the thing (wall clock, RFC 3339 UTC with milliseconds); a hook
row also carries the event's own time (``eventTs``). :class:`HookRecord` carries the fields of
design.md's audit contract plus ``type`` and ``daemonRun`` (the id of the
daemon run that wrote the row, so a restarted replay's rows are told apart).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from daemon.events import iso_ms, now_ms

# "shutdown": a wake still waiting for its run when the daemon stopped.
# "cost": the agent's LLM runs reached [wake] max_cost_per_day.
# "store": the hook store could not record the decision's dedupe key or cooldown
# (disk full): nothing is acted on without them.
SuppressedBy = Literal[
    "dedupe", "cooldown", "budget", "cost", "paused", "shutdown", "store", "none"
]


_last_ts: tuple[int, str] = (0, "")


def now_ts() -> str:
    """The current time in the audit ``ts`` format (formatted once per millisecond:
    an event's rows are written within one)."""
    global _last_ts
    ms = now_ms()
    if ms != _last_ts[0]:
        _last_ts = (ms, iso_ms(ms))
    return _last_ts[1]


class _Record(msgspec.Struct, frozen=True, kw_only=True, rename="camel", tag_field="type"):
    ts: str
    agent_id: str
    trace_id: str | None = None
    # Which daemon run wrote it (stamped by the writer): tells a restart's rows apart.
    daemon_run: str | None = None
    # The market time the row is about (``ts`` is when it was written, seconds apart
    # in a backtest of a year): a hook row's event's time, an order change's broker
    # time, the agent's time for wakes, runs and risk verdicts (the event time on a
    # replay). ``audit tail --from/--to`` select by it.
    event_ts: str | None = None


class HookRecord(_Record, frozen=True, kw_only=True, tag="hook"):
    """One hook evaluation, IGNOREs and suppressed decisions included.

    ``decision`` is None when the hook failed (``error`` says why);
    ``suppressedBy`` says what stopped a WAKE / TRADE_INTENT from acting.
    """

    hook_id: str
    revision: str
    kind: str
    event_id: str
    topic: str
    symbol: str | None = None
    decision: str | None = None
    reason: str = ""
    dedupe_key: str | None = None
    suppressed_by: SuppressedBy = "none"
    runtime_ms: float = 0.0
    error: str | None = None
    # The decision as ``state.lastOutputs`` holds it, when it carries more than
    # ``decision``/``reason``/``dedupeKey`` (cooldown, data, an intent): with it the
    # audit alone rebuilds lastOutputs (restarts, ``hooks test --from-audit``).
    output: dict[str, Any] | None = None
    # How many hook rows the event has (queued together): a restart that finds
    # fewer knows a kill cut their write, wherever it tore (even between rows).
    event_hooks: int | None = None


class WakeRecord(_Record, frozen=True, kw_only=True, tag="wake"):
    """What the wake scheduler did with WAKE decisions.

    ``outcome``: ``woke`` (a run started), ``queued`` (collect mode: merged
    into a pending follow-up run), ``suppressed`` (``suppressedBy`` says why).
    """

    event_id: str | None = None
    outcome: Literal["woke", "queued", "suppressed"]
    suppressed_by: SuppressedBy = "none"
    hook_ids: list[str] = msgspec.field(default_factory=list)
    reasons: list[str] = msgspec.field(default_factory=list)
    run_id: str | None = None
    # The queued WAKE decisions (their hook rows said so) a row records as dropped
    # before their run started: 1 a wake, the count of a run's summarized earlier
    # wakes on their one row; 0 for a wake suppressed as it was decided.
    dropped: int = 0


class ToolCallReport(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """One tool call of an LLM run: which tool, a digest of its arguments (the
    arguments themselves may be large or sensitive), how long, and how it ended."""

    name: str
    args_digest: str
    duration_ms: float
    ok: bool
    error: str | None = None


class LlmReport(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """What an LLM run cost and did, for the ``run`` record (``why``, ``audit tail``)."""

    provider: str
    model: str
    tokens_in: int = 0
    tokens_out: int = 0
    # Of tokens_in: written to and read from the provider's prompt cache.
    tokens_cache_write: int = 0
    tokens_cache_read: int = 0
    cost: float = 0.0
    model_calls: int = 0
    stop_reason: str = ""
    tool_calls: list[ToolCallReport] = msgspec.field(default_factory=list)
    text: str = ""


class RunRecord(_Record, frozen=True, kw_only=True, tag="run"):
    """An agent run (LLM or runner) starting or ending."""

    run_id: str
    runner: str
    status: Literal["started", "finished", "failed", "timeout"]
    event_ids: list[str] = msgspec.field(default_factory=list)
    # The WAKE decisions it answers: its own and those collect mode merged into it
    # (the summarized earlier ones too); 0 for an audit run.
    wakes: int = 0
    # Every merged wake's trace (``traceId`` holds the first), so ``why`` finds the run
    # from any of them.
    trace_ids: list[str] = msgspec.field(default_factory=list)
    duration_ms: float | None = None
    error: str | None = None
    summary: str = ""
    # LLM runs: tokens, cost, tool calls, the final text (None for other runners).
    llm: LlmReport | None = None


class RiskRecord(_Record, frozen=True, kw_only=True, tag="risk"):
    """The risk engine's verdict on one intent; ``reasons`` hold ``{code, message}``."""

    hook_id: str | None = None
    event_id: str | None = None
    symbol: str | None = None
    approved: bool
    reasons: list[dict[str, str]] = msgspec.field(default_factory=list)
    intent: dict[str, Any] = msgspec.field(default_factory=dict)
    client_order_id: str | None = None


class OrderRecord(_Record, frozen=True, kw_only=True, tag="order"):
    """An order state change at the broker (placed, filled, canceled, rejected)."""

    broker: str
    client_order_id: str
    symbol: str
    side: str
    order_type: str
    role: str = "entry"
    volume: float
    status: str  # PARTIALLY_FILLED: a part filled, the rest still working
    price: float | None = None
    reason: str = ""
    filled: float | None = None  # filled so far, on PARTIALLY_FILLED


class SignalRecord(_Record, frozen=True, kw_only=True, tag="signal"):
    """A copy-trade signal at the door: ``accepted`` (published), ``duplicate`` (a
    redelivery, answered but not published again) or ``rejected`` (``reason``).
    A leader agent's signal (``source`` copytrade_leader) is published as it is
    made: ``accepted``, no ``httpStatus``.

    ``agentId`` is ``-``: a signal belongs to a leader, not to an agent."""

    source: str
    leader: str
    signal_id: str | None = None
    event_id: str | None = None
    status: Literal["accepted", "duplicate", "rejected"]
    http_status: int | None = None  # the answer at a door (webhook, TradingView)
    reason: str = ""
    remote: str = ""


class AlertRecord(_Record, frozen=True, kw_only=True, tag="alert"):
    """What became of an ALERT at ``[hooks] alert_webhook`` (the hook's row says it was
    raised; a replay's and a daemon's without a webhook get none): ``posted``;
    ``refused`` (a 4xx: not tried again); ``failed`` (not delivered after its attempts;
    ``kept``: in the outbox, posted again later); ``expired`` (kept past
    ``alert_webhook_keep_seconds``: never posted). ``redelivered``: an attempt after
    a restart or an outage. ``eventTs`` is the alert's event's time."""

    hook_id: str
    event_id: str
    status: Literal["posted", "refused", "failed", "expired"]
    redelivered: bool = False
    kept: bool = False
    error: str = ""


AuditRecord = (
    HookRecord | WakeRecord | RunRecord | RiskRecord | OrderRecord | SignalRecord | AlertRecord
)

_encoder = msgspec.json.Encoder()


def encode_line(record: AuditRecord) -> bytes:
    """One record as a JSON line (with the trailing newline)."""
    return _encoder.encode(record) + b"\n"
