"""The per-agent wake policy: the ``[wake]`` table of ``agents/<id>/agent.toml``.

Every field has a default so an agent with no ``[wake]`` table still gets a
safe, cheap policy: a small hourly budget, collect mode and the ``log`` runner
(which never calls an LLM). Unknown keys are rejected so a typo fails loudly.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from daemon.secret import Secret
from hooks_runtime.decisions import MAX_EXPIRY_SECONDS

NonNegInt = Annotated[int, msgspec.Meta(ge=0)]
NonNegFloat = Annotated[float, msgspec.Meta(ge=0)]
PosFloat = Annotated[float, msgspec.Meta(gt=0)]
OutputCap = Annotated[int, msgspec.Meta(ge=256, le=16 * 1024 * 1024)]


class RunnerConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Which runner an agent run uses.

    ``log`` records the run and calls nothing (the default); ``command`` pipes
    the wake context as JSON to ``command`` (an argv list, never a shell line);
    ``llm`` runs the model with the agent's tools (``daemon/llm``, docs/llm.md).
    """

    kind: Literal["log", "command", "llm"] = "log"
    command: list[str] = msgspec.field(default_factory=list)
    timeout_seconds: PosFloat = 300.0
    # Each of stdout and stderr is kept up to this many bytes; the rest is drained.
    max_output_bytes: OutputCap = 64 * 1024
    # --- kind = "llm" ---
    provider: Literal["anthropic", "openai"] | None = None
    model: str = ""
    api_key: Secret = msgspec.field(default_factory=Secret)
    # "" = the provider's own API; an OpenAI-compatible server (Ollama, vLLM, ...) here.
    base_url: str = ""
    max_tokens: Annotated[int, msgspec.Meta(ge=1, le=200_000)] = 4096
    max_tool_calls: Annotated[int, msgspec.Meta(ge=0, le=100)] = 12
    # The whole run (model turns, tool calls, retries) ends by then (seed 002: 45 s).
    deadline_seconds: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 45.0
    # For the cost in the run record: prices per million tokens.
    price_input_per_mtok: NonNegFloat = 0.0
    price_output_per_mtok: NonNegFloat = 0.0
    # Input tokens read from the provider's prompt cache; unset: Anthropic's 0.1 x the
    # input price, the input price for OpenAI-compatible servers (set your model's).
    price_cached_input_per_mtok: NonNegFloat | None = None
    # Anthropic: mark the tools, the system prompt and the newest message for its
    # prompt cache, so each turn of a run reads what the turn before sent (writes cost
    # 1.25 x the input price, reads 0.1 x). OpenAI-compatible servers cache by themselves.
    prompt_cache: bool = True
    # submit_trading_signal: the order's notional (quote currency) and the confidence
    # a signal needs to be traded (seed 002: 60).
    signal_notional: PosFloat = 100.0
    min_confidence: Annotated[float, msgspec.Meta(ge=0, le=100)] = 60.0
    # How long a signal's limit entry works before it is canceled (0: until filled
    # or canceled); at most a year.
    signal_expiry_seconds: Annotated[float, msgspec.Meta(ge=0, le=MAX_EXPIRY_SECONDS)] = 0.0

    def __post_init__(self) -> None:
        if self.kind == "command" and not self.command:
            raise ValueError("runner.command must name the program to run when kind = 'command'")
        if any(not arg for arg in self.command[:1]):
            raise ValueError("runner.command[0] must not be empty")
        if self.kind == "llm":
            if self.provider is None:
                raise ValueError(
                    "runner.provider must be 'anthropic' or 'openai' when kind = 'llm'"
                )
            if not self.model:
                raise ValueError("runner.model must name the model when kind = 'llm'")
            if not self.api_key and not self.base_url:
                raise ValueError(
                    'runner.api_key is missing (api_key = "${ANTHROPIC_API_KEY}" reads it '
                    "from the environment); only a local base_url may go without one"
                )


class WakePolicy(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How often, and how, WAKE decisions turn into agent runs."""

    # Sliding one-hour window over wake runs (audit runs are not counted); 0 = never wake.
    max_runs_per_hour: NonNegInt = 12
    # After a wake run ends, a wake that would start a new run is suppressed for this long.
    cooldown_after_run_seconds: NonNegFloat = 60.0
    # collect: wakes merge into one pending run; immediate: one run per wake, in order.
    queue_mode: Literal["collect", "immediate"] = "collect"
    # collect mode: how long the first wake of an idle agent waits for company.
    debounce_seconds: NonNegFloat = 2.0
    # collect mode: wakes kept in detail per run; older ones become one summary line.
    max_collected: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 20
    # Start an audit run after this many seconds without any run (0 = off).
    audit_interval_seconds: NonNegFloat = 0.0
    # LLM spend per UTC day of the agent's clock (wake and audit runs); once reached,
    # runs are suppressed with reason "cost" until the day turns. 0 = no cap.
    max_cost_per_day: NonNegFloat = 0.0
    # A wake run a stop cut (the daemon stopped or was killed during it) runs once more
    # at the next start if it began at most this long before; 0 = never (it may have
    # paid already): for runners that cost nothing to repeat (a command, a local model).
    rerun_interrupted_within_seconds: NonNegFloat = 0.0
    runner: RunnerConfig = msgspec.field(default_factory=RunnerConfig)
