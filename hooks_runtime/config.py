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
    timeout_ms: float = 250.0
    # Extra budget for a hook whose source is compiled in the same request.
    compile_timeout_ms: float = 1000.0
    # How long a fresh worker may take to import, harden itself and say READY.
    startup_timeout_ms: float = 10_000.0
    # RLIMIT_AS of a worker (virtual address space).
    memory_mb: int = 256
    # RLIMIT_CPU of a worker: a lifetime backstop; workers recycle at half of it.
    cpu_seconds: int = 600
    # RLIMIT_NOFILE of a worker.
    max_open_files: int = 16
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
    recycle_after: int = 50_000
    # ... or when its resident set grows past this (checked every few batches).
    recycle_rss_mb: int = 200
    # Ready-to-use spare workers, so a killed worker is replaced without a cold start.
    spare_workers: int = 1
    # Busy-poll up to this long for a batch's results (parent) and for the next request
    # (worker) while only one batch is in flight: waking a sleeping process costs
    # ~50 us per hop on this VM. 0 disables; never used when batches run concurrently.
    spin_us: int = 300
    # Failure handling per hook: backoff doubles from base to max, pause after N in a row.
    backoff_base_seconds: Annotated[float, msgspec.Meta(gt=0)] = 1.0
    backoff_max_seconds: Annotated[float, msgspec.Meta(gt=0)] = 300.0
    pause_after_failures: Annotated[int, msgspec.Meta(ge=1)] = 5

    def __post_init__(self) -> None:
        unknown = sorted(set(self.require_layers) - KNOWN_LAYERS)
        if unknown:
            known = ", ".join(sorted(KNOWN_LAYERS))
            raise ValueError(f"unknown sandbox layer(s) {unknown} (known: {known})")
        if self.timeout_ms <= 0 or self.compile_timeout_ms < 0:
            raise ValueError("timeout_ms must be > 0 and compile_timeout_ms >= 0")
        if self.memory_mb < 64:
            raise ValueError("memory_mb must be at least 64 (the interpreter needs it)")
        if self.recycle_after < 1:
            raise ValueError("recycle_after must be >= 1")
        if self.backoff_max_seconds < self.backoff_base_seconds:
            raise ValueError("backoff_max_seconds must be >= backoff_base_seconds")
        if not 0 < self.max_agent_source_bytes < self.max_frame_bytes:
            raise ValueError("max_agent_source_bytes must be > 0 and below max_frame_bytes")
        if not 0 <= self.spin_us <= 10_000:
            raise ValueError("spin_us must be between 0 and 10000")
        if self.spare_workers < 0 or self.max_open_files < 8:
            raise ValueError("spare_workers must be >= 0 and max_open_files >= 8")
