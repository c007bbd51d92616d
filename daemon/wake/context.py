"""The typed messages of the wake path: requests in, contexts to runners, results back.

:class:`WakeContext` is what a runner receives, and what the ``command``
runner writes to its program's stdin as one JSON object (camelCase)::

    {"agentId": "example", "runId": "example-…", "kind": "wake" | "audit",
     "triggeredAt": "2026-02-17T03:05:00.123Z",
     "reasons": [{"hookId": "wake_two_green", "reason": "…", "eventId": "…",
                  "traceId": "…", "symbol": "BTC-USD", "topic": "…", "ts": "…"}],
     "earlier": "...and 7 earlier wakes: 4x two_green, 3x crash" | null,
     "earlierCount": 7, "state": {…} | null}

``reasons`` is oldest first; an audit run has an empty list.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Literal

import msgspec

from daemon.audit.records import LlmReport

RunKind = Literal["wake", "audit"]
Outcome = Literal["woke", "queued", "suppressed"]
SuppressedBy = Literal["budget", "cost", "cooldown", "paused", "shutdown", "none"]


class WakeRequest(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """One WAKE decision of one hook for one event, as the dispatcher hands it over."""

    agent_id: str
    hook_id: str
    reason: str = ""
    event_id: str | None = None
    trace_id: str | None = None
    symbol: str | None = None
    topic: str | None = None
    ts: str | None = None


class WakeReason(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """Why a run happened: one merged wake."""

    hook_id: str
    reason: str
    event_id: str | None
    trace_id: str | None
    symbol: str | None
    topic: str | None
    ts: str | None

    @classmethod
    def of(cls, wake: WakeRequest) -> WakeReason:
        """The context view of a request."""
        return cls(
            hook_id=wake.hook_id,
            reason=wake.reason,
            event_id=wake.event_id,
            trace_id=wake.trace_id,
            symbol=wake.symbol,
            topic=wake.topic,
            ts=wake.ts,
        )


class WakeContext(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """Everything a runner gets about one agent run."""

    agent_id: str
    run_id: str
    kind: RunKind
    triggered_at: str
    reasons: list[WakeReason]
    earlier: str | None = None
    earlier_count: int = 0
    state: dict[str, Any] | None = None
    # The run a stop cut whose wakes this one runs again (None: a first run): what
    # that run did before the stop (an order, a message) may already have happened.
    rerun_of: str | None = None


class WakeOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """What :meth:`WakeScheduler.submit` did with a wake (for the hook's audit row)."""

    outcome: Outcome
    suppressed_by: SuppressedBy = "none"
    run_id: str | None = None


# What a run spent: (cost, tokens in, tokens out); the run store keeps it per run.
Usage = tuple[float, int, int]


class RunResult(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """What a runner reports back; output is already bounded by the runner."""

    status: Literal["ok", "failed", "timeout"]
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    truncated: bool = False
    error: str | None = None
    llm: LlmReport | None = None

    def summary(self) -> str:
        """One line for the audit ``run`` record."""
        parts: list[str] = [self.status]
        if self.llm is not None:
            r = self.llm
            parts.append(
                f"{r.model}: {len(r.tool_calls)} tool call(s), {r.tokens_in}+{r.tokens_out} "
                f"tokens, cost {r.cost:.4f}, stop {r.stop_reason or '-'}"
            )
        if self.exit_code is not None:
            parts.append(f"exit {self.exit_code}")
        if self.truncated:
            parts.append("output truncated")
        head = self.stdout.strip().splitlines()[:1]
        if head:
            parts.append(f"stdout: {head[0][:200]}")
        return "; ".join(parts)


def summarize_earlier(counts: Counter[str]) -> str | None:
    """The one line that stands for wakes dropped from a run's detail."""
    total = sum(counts.values())
    if not total:
        return None
    noun = "wake" if total == 1 else "wakes"
    parts = ", ".join(f"{n}x {hook}" for hook, n in counts.most_common())
    return f"...and {total} earlier {noun}: {parts}"
