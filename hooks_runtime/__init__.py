"""The hook sandbox: restricted compile, worker processes, IPC protocol and pool.

Usage from the daemon (one pool for the whole process, one worker per agent)::

    from hooks_runtime import SandboxConfig, open_worker_pool, load_hook

    async with open_worker_pool(SandboxConfig()) as pool:      # SandboxUnavailable if
        hooks = [load_hook(p) for p in paths]                   # a required layer is off
        results = await pool.evaluate("agent-1", hooks, event_dict, state_dict)
        for r in results:          # one HookResult per hook, in order, never raises
            r.ok, r.decision, r.error_kind, r.error, r.runtime_ms, r.output

* ``HookSpec`` (hook_id, kind, revision, source): ``load_hook(path)`` builds it from
  a file (kind from the ``wake_``/``autotrade_``/``copytrade_`` prefix, revision =
  content hash), ``spec_from_source`` from a string. Sources travel to the worker
  once per revision and are cached there as code objects.
* ``pool.evaluate`` runs all of an agent's hooks for one event in one round
  trip. Pass ``encode_state(state)`` instead of the state when several agents
  get the same state for an event (it is then encoded once). ``error_kind`` is
  one of ``compile``, ``runtime``, ``invalid_result``, ``memory``, ``timeout``,
  ``crashed`` (the hook ran and failed: it counts towards backoff),
  ``backoff``/``paused`` (the hook was skipped), ``oversized`` or ``unsendable``
  (the caller's request did not fit a frame, or held a value msgpack cannot carry;
  set by the dispatcher). Only :exc:`SandboxUnavailable` (no worker can start),
  :exc:`HookRequestTooLarge` (event + state over ``max_frame_bytes``) and
  :exc:`HookRequestUnsendable` (an integer beyond 64 bits) are raised.
* ``pool.compile(agent, hooks)`` compiles without running: a loader can check a
  new revision and keep the previous good one running when it fails (the
  recommended policy, see docs/sandbox.md).
* ``pool.breaker`` (:class:`HookBreaker`) holds backoff and pauses;
  ``pool.resume(agent, hook)`` lifts one; persisting pauses is the caller's job
  (``breaker.paused()`` / ``breaker.pause(...)``).
* ``pool.ready`` is the last worker's READY report (active and missing layers).
* ``pool.discard(agent)`` stops an agent's worker.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hooks_runtime.breaker import HookBreaker
    from hooks_runtime.config import KNOWN_LAYERS, SandboxConfig
    from hooks_runtime.decisions import (
        ALLOWED_DECISIONS,
        Alert,
        Decision,
        Ignore,
        Trade,
        TradeIntent,
        Wake,
        to_decision,
    )
    from hooks_runtime.hookfile import HookSpec, hook_paths, kind_of, load_hook, spec_from_source
    from hooks_runtime.pool import HookResult, WorkerPool, open_worker_pool
    from hooks_runtime.protocol import ErrorKind, HookKind, encode_state
    from hooks_runtime.validate import validate_result

# Where each name lives: imported on first use (PEP 562), so a sandbox worker, which
# imports ``hooks_runtime.worker`` and so this package, does not load the pool, its
# breaker and their logging and async stacks (about half of a worker's start).
_WHERE = {
    "HookBreaker": "breaker",
    "KNOWN_LAYERS": "config",
    "SandboxConfig": "config",
    "ALLOWED_DECISIONS": "decisions",
    "Alert": "decisions",
    "Decision": "decisions",
    "Ignore": "decisions",
    "Trade": "decisions",
    "TradeIntent": "decisions",
    "Wake": "decisions",
    "to_decision": "decisions",
    "HookSpec": "hookfile",
    "hook_paths": "hookfile",
    "kind_of": "hookfile",
    "load_hook": "hookfile",
    "spec_from_source": "hookfile",
    "HookResult": "pool",
    "WorkerPool": "pool",
    "open_worker_pool": "pool",
    "ErrorKind": "protocol",
    "HookKind": "protocol",
    "encode_state": "protocol",
    "validate_result": "validate",
}


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{where}"), name)
    globals()[name] = value
    return value


__all__ = [
    "ALLOWED_DECISIONS",
    "KNOWN_LAYERS",
    "Alert",
    "Decision",
    "ErrorKind",
    "HookBreaker",
    "HookKind",
    "HookResult",
    "HookSpec",
    "Ignore",
    "SandboxConfig",
    "Trade",
    "TradeIntent",
    "Wake",
    "WorkerPool",
    "encode_state",
    "hook_paths",
    "kind_of",
    "load_hook",
    "open_worker_pool",
    "spec_from_source",
    "to_decision",
    "validate_result",
]
