"""Sandbox settings, mounted by the daemon as the ``[hooks.sandbox]`` config section.

Every field has a default so an empty section is a working, hardened sandbox.
The worker-side limits travel to the worker in its setup frame; the rest are
enforced by the parent (deadlines, recycling, backoff).
"""

from __future__ import annotations

from typing import Annotated

import msgspec

#: Layer names a worker can report; ``require_layers`` must use these.
KNOWN_LAYERS = frozenset(
    {"fds", "rlimits", "no_new_privs", "no_dumpable", "pdeathsig", "landlock", "seccomp"}
)


class SandboxConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Limits and policy knobs of the hook sandbox."""

    # Per-hook wall-clock budget; the parent SIGKILLs the worker when it passes.
    # Bounded: an infinite one (TOML's `inf`) would let a looping hook hold its agent.
    timeout_ms: Annotated[float, msgspec.Meta(gt=0, le=60_000)] = 250.0
    # Extra budget for a hook whose source is compiled in the same request.
    compile_timeout_ms: Annotated[float, msgspec.Meta(ge=0, le=60_000)] = 1000.0
    # How long a fresh worker may take to import, harden itself and say READY.
    startup_timeout_ms: Annotated[float, msgspec.Meta(gt=0, le=600_000)] = 10_000.0
    # RLIMIT_AS of a worker (virtual address space).
    memory_mb: Annotated[int, msgspec.Meta(ge=64)] = 256  # the interpreter needs 64
    # RLIMIT_CPU of a worker: a lifetime backstop; workers recycle at half of it.
    cpu_seconds: int = 600
    # RLIMIT_NOFILE of a worker.
    max_open_files: Annotated[int, msgspec.Meta(ge=8)] = 16
    max_source_bytes: int = 256 * 1024
    # All of one agent's hook sources together (they travel in one request to a fresh
    # worker): files past it are refused for that agent alone. Keep it under max_frame_bytes.
    max_agent_source_bytes: int = 2 * 1024 * 1024
    max_result_bytes: int = 64 * 1024
    # print() output kept per evaluation (the rest is dropped, with a marker).
    max_output_bytes: int = 4096
    # Longest error message recorded for a hook.
    max_error_chars: int = 500
    # Largest frame either side accepts (requests carry event + state + sources).
    max_frame_bytes: int = 8 * 1024 * 1024
    # A worker is refused (SandboxUnavailable) unless it reports all of these active.
    require_layers: list[str] = msgspec.field(
        default_factory=lambda: ["fds", "rlimits", "no_new_privs"]
    )
    # Optional layers to try; the worker reports whether they took effect.
    landlock: bool = True
    seccomp: bool = True
    # Replace a worker after this many hook evaluations ...
    recycle_after: Annotated[int, msgspec.Meta(ge=1)] = 50_000
    # ... or when its resident set grows past this (checked every few batches).
    recycle_rss_mb: int = 200
    # Ready-to-use spare workers, so a killed worker is replaced without a cold start.
    spare_workers: Annotated[int, msgspec.Meta(ge=0)] = 1
    # Busy-poll up to this long for a batch's results (parent) and for the next request
    # (worker) while only one batch is in flight: waking a sleeping process costs
    # ~50 us per hop on this VM. 0 disables; never used when batches run concurrently.
    spin_us: Annotated[int, msgspec.Meta(ge=0, le=10_000)] = 300
    # Failure handling per hook: backoff doubles from base to max after each failure;
    # paused once pause_after_failures of its last failure_window evaluations failed.
    backoff_base_seconds: Annotated[float, msgspec.Meta(gt=0)] = 1.0
    backoff_max_seconds: Annotated[float, msgspec.Meta(gt=0)] = 300.0
    pause_after_failures: Annotated[int, msgspec.Meta(ge=1)] = 5
    failure_window: Annotated[int, msgspec.Meta(ge=1, le=10_000)] = 20
    # Per agent: more worker restarts (timeouts, crashes, memory) than this within
    # restart_window_seconds pauses every hook that caused one.
    max_worker_restarts: Annotated[int, msgspec.Meta(ge=1)] = 20
    restart_window_seconds: Annotated[float, msgspec.Meta(gt=0)] = 300.0

    def __post_init__(self) -> None:
        unknown = sorted(set(self.require_layers) - KNOWN_LAYERS)
        if unknown:
            known = ", ".join(sorted(KNOWN_LAYERS))
            raise ValueError(f"unknown sandbox layer(s) {unknown} (known: {known})")
        if self.backoff_max_seconds < self.backoff_base_seconds:
            raise ValueError("backoff_max_seconds must be >= backoff_base_seconds")
        if not 0 < self.max_agent_source_bytes < self.max_frame_bytes:
            raise ValueError("max_agent_source_bytes must be > 0 and below max_frame_bytes")
