"""The async worker pool: one long-lived sandbox worker per agent.

``evaluate`` sends all of an agent's hooks for one event in one request and
reads one result per hook as it arrives, each against its own deadline. A hook
that overruns gets its worker SIGKILLed (process group) and replaced by a warm
spare; it is blamed with ``timeout`` and the hooks after it are re-run on the
fresh worker. Every result is validated again here (the authoritative check).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc
import msgspec

from daemon.errors import (
    HookCrashed,
    HookRequestTooLarge,
    HookRequestUnsendable,
    HookResultInvalid,
    SandboxUnavailable,
)
from hooks_runtime.breaker import Gate, HookBreaker
from hooks_runtime.config import SandboxConfig
from hooks_runtime.decisions import Decision
from hooks_runtime.hookfile import HookSpec
from hooks_runtime.process import WorkerProcess
from hooks_runtime.protocol import (
    Batch,
    ErrorKind,
    HookCall,
    HookKind,
    Ready,
    Result,
    SeriesDelta,
    Step,
    encode_state,
)
from hooks_runtime.series import (
    Held,
    SplitState,
    Windows,
    deltas,
    deltas_size,
    split,
)
from hooks_runtime.spin import WORKER_LINGER, SpinPolicy
from hooks_runtime.validate import validate_result

_WORKER_ERROR_KINDS = frozenset({"compile", "runtime", "invalid_result", "memory"})
_USAGE_CHECK_EVERY = 64  # batches between /proc reads of a worker's RSS and CPU
_MAX_READS = 64  # state keys a lookahead result may name (the worker names only real ones)


class HookResult(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What one hook made of one event: a valid decision, or an error kind + message."""

    hook_id: str
    kind: HookKind
    revision: str
    runtime_ms: float
    decision: Decision | None = None
    error_kind: ErrorKind | None = None
    error: str | None = None
    output: str = ""
    # Lookahead results only: the state keys the hook read (see protocol.Batch).
    reads: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """True when the hook produced a valid decision."""
        return self.error_kind is None


# Results of hooks that did not run: their gate was closed (see HookBreaker.gate).
GATED: frozenset[str] = frozenset({"paused", "backoff"})


def _fill(
    hooks: Sequence[HookSpec], gates: list[tuple[Gate, str] | None], ran: list[HookResult]
) -> list[HookResult]:
    """One result per hook: ``ran`` (the results of the hooks whose gate is open, in
    order) with the others' gate as their error."""
    it = iter(ran)
    return [
        next(it) if g is None else _error(h, g[0], g[1]) for h, g in zip(hooks, gates, strict=True)
    ]


def _error(h: HookSpec, kind: ErrorKind, msg: str, ms: float = 0.0) -> HookResult:
    return HookResult(
        hook_id=h.hook_id, kind=h.kind, revision=h.revision, runtime_ms=ms, error_kind=kind,
        error=msg,
    )  # fmt: skip


class WorkerPool:
    """Use :func:`open_worker_pool`; this class needs the pool's task group."""

    def __init__(
        self,
        config: SandboxConfig,
        tg: anyio.abc.TaskGroup,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.breaker = HookBreaker(
            config.backoff_base_seconds,
            config.backoff_max_seconds,
            config.pause_after_failures,
            clock,
            window=config.failure_window,
            max_restarts=config.max_worker_restarts,
            restart_window=config.restart_window_seconds,
        )
        self._tg = tg
        self._workers: dict[str, WorkerProcess] = {}
        # asyncio's: 0.4 us against anyio's 2.3 us a batch (the daemon runs on asyncio)
        self._locks: dict[str, asyncio.Lock] = {}
        self._spares: list[WorkerProcess] = []
        self._refilling = 0
        self._spare_error: Exception | None = None  # last failed spawn, with backoff
        self._spawn_failures = 0
        self._retry_at = 0.0
        self._ids = itertools.count(1)
        self._closed = False
        self._spin = SpinPolicy(config.spin_us)
        self.ready: Ready | None = None  # the latest worker's layer report
        self.respawns = 0

    # --- public API -------------------------------------------------------

    async def evaluate(
        self,
        agent_id: str,
        hooks: Sequence[HookSpec],
        event: dict[str, Any],
        state: Any,
        now: float | None = None,
    ) -> list[HookResult]:
        """Evaluate ``hooks`` (in order) on ``event``; one result per hook, never raises
        for hook misbehaviour (only :exc:`SandboxUnavailable` when no worker can start,
        and :exc:`HookRequestTooLarge` when event + state exceed ``max_frame_bytes``).

        ``state`` is plain data, or ``encode_state(state)`` when the same state goes
        to several agents (encode it once per event). ``now`` is the time backoff is
        measured on: the event's time in a replay (so a failing hook skips the same
        events at any speed), else the pool's clock."""
        results, _ = await self._gated(agent_id, hooks, event, state, False, now)
        return results

    async def evaluate_ahead(
        self,
        agent_id: str,
        hooks: Sequence[HookSpec],
        event: dict[str, Any],
        state: Any,
        now: float | None,
        ahead: Sequence[Step],
        candles: Sequence[msgspec.Raw] = (),
    ) -> tuple[list[HookResult], list[list[HookResult]]]:
        """:meth:`evaluate`, plus the events queued after ``event`` in the same request
        (event time): their results, one list per step, for as many steps as came back
        whole. Those are speculative: each holds only if what its hooks read of the
        state (``HookResult.reads``) is what that event's real state has, and only
        once accepted with :meth:`record`. No lookahead while any hook is backing
        off (its backoff could end within the steps); a paused hook is left out of
        the request and stands paused in every step (a pause lasts until someone
        lifts it: the caller checks it still stands when it uses a step).
        ``candles``: the table the steps' series refer to (``Batch.candles``)."""
        return await self._gated(agent_id, hooks, event, state, False, now, ahead, candles)

    async def speculate(
        self,
        agent_id: str,
        hooks: Sequence[HookSpec],
        event: dict[str, Any],
        state: Any,
        now: float | None,
        ahead: Sequence[Step],
        candles: Sequence[msgspec.Raw] = (),
    ) -> list[list[HookResult]]:
        """Evaluate ``event`` and ``ahead``, every one ahead of its turn (event time),
        while the caller goes on with other work: one result list per step, for as
        many steps as came back whole, each result with its reads. Nothing is
        recorded (see :meth:`record`), a dead worker is not retried, nothing runs
        while any hook is backing off, and a paused hook stands paused in every step."""
        gates = self._gates(agent_id, hooks, now)
        if not hooks or any(g is not None and g[0] != "paused" for g in gates):
            return []
        runnable = [h for h, g in zip(hooks, gates, strict=True) if g is None]
        steps = 1 + len(ahead)
        done: list[HookResult] = []
        if runnable:
            state_raw = _prepare(state)
            async with self._lock(agent_id):
                worker = await self._worker_for(agent_id)
                try:
                    done = await self._batch(
                        worker, runnable, event, state_raw, False, ahead, candles, speculative=True
                    )
                finally:
                    self._release(agent_id, worker)
            steps = len(done) // len(runnable)
        n = len(runnable)
        return [_fill(hooks, gates, done[i * n : (i + 1) * n]) for i in range(steps)]

    def paused(self, agent_id: str, hooks: Sequence[HookSpec]) -> frozenset[str]:
        """Which of ``hooks`` are paused now (by hook id)."""
        if self.breaker.idle:
            return frozenset()
        gates = self._gates(agent_id, hooks, None)
        return frozenset(
            h.hook_id for h, g in zip(hooks, gates, strict=True) if g and g[0] == "paused"
        )

    def record(self, agent_id: str, results: Sequence[HookResult], now: float | None) -> None:
        """Count results in each hook's failure history (lookahead results, once used).
        A hook that did not run (paused, backing off) has nothing to count."""
        if self.breaker.idle and all(r.error_kind is None for r in results):
            return  # healthy hooks and no history: nothing to keep
        for r in results:
            if r.error_kind not in GATED:
                self.breaker.record((agent_id, r.hook_id), r.revision, r.error, now, r.error_kind)

    async def compile(self, agent_id: str, hooks: Sequence[HookSpec]) -> list[HookResult]:
        """Compile ``hooks`` in the agent's worker without running them (for the loader:
        a failing new revision can be reported while the previous one keeps running)."""
        results, _ = await self._run(agent_id, hooks, {}, None, compile_only=True)
        return results

    def resume(self, agent_id: str, hook_id: str) -> bool:
        """Lift a pause or backoff of one hook."""
        return self.breaker.resume((agent_id, hook_id))

    async def discard(self, agent_id: str) -> None:
        """Stop an agent's worker (agent removed or disabled)."""
        async with self._lock(agent_id):
            w = self._workers.pop(agent_id, None)
            if w is not None:
                self._retire(w)

    # --- evaluation -------------------------------------------------------

    async def _gated(
        self,
        agent_id: str,
        hooks: Sequence[HookSpec],
        event: dict[str, Any],
        state: Any,
        compile_only: bool,
        now: float | None = None,
        ahead: Sequence[Step] = (),
        candles: Sequence[msgspec.Raw] = (),
    ) -> tuple[list[HookResult], list[list[HookResult]]]:
        if self.breaker.idle:  # nothing backs off or is paused: every hook runs
            done, later = await self._run(
                agent_id, hooks, event, state, compile_only, ahead, candles
            )
            if not all(r.error_kind is None for r in done):
                self.record(agent_id, done, now)
            return done, later
        gates = self._gates(agent_id, hooks, now)
        runnable = [h for h, g in zip(hooks, gates, strict=True) if g is None]
        if any(g is not None and g[0] != "paused" for g in gates):
            ahead = ()  # a backoff ends with time: it could within the steps
        done, later = await self._run(
            agent_id, runnable, event, state, compile_only, ahead, candles
        )
        self.record(agent_id, done, now)
        return _fill(hooks, gates, done), [_fill(hooks, gates, step) for step in later]

    def _gates(
        self, agent_id: str, hooks: Sequence[HookSpec], now: float | None
    ) -> list[tuple[Gate, str] | None]:
        return [self.breaker.gate((agent_id, h.hook_id), h.revision, now) for h in hooks]

    async def _run(
        self,
        agent_id: str,
        hooks: Sequence[HookSpec],
        event: dict[str, Any],
        state: Any,
        compile_only: bool,
        ahead: Sequence[Step] = (),
        candles: Sequence[msgspec.Raw] = (),
    ) -> tuple[list[HookResult], list[list[HookResult]]]:
        results: list[HookResult] = []
        later: list[list[HookResult]] = []
        if not hooks:  # every hook paused: each step is all pauses (see _gated)
            return results, [[] for _ in ahead]
        state_raw = _prepare(state)
        async with self._lock(agent_id):
            pending = list(hooks)
            n = len(pending)
            idle_deaths = 0
            while pending:
                worker = await self._worker_for(agent_id)
                whole = len(pending) == n  # a retry after a death: no lookahead
                steps, table = (ahead, candles) if whole else ((), ())
                try:
                    done = await self._batch(
                        worker, pending, event, state_raw, compile_only, steps, table
                    )
                finally:
                    self._release(agent_id, worker)
                if not done:
                    idle_deaths += 1
                    if idle_deaths < 2:
                        continue
                    done = [_error(pending[0], "crashed", "fresh workers keep dying")]
                first = done[: len(pending)]
                if len(first) == n:  # the steps after the first event, each one whole
                    later = [done[i : i + n] for i in range(n, len(done) - n + 1, n)]
                results.extend(first)
                pending = pending[len(first) :]
        return results, later

    def _release(self, agent_id: str, worker: WorkerProcess) -> None:
        """After a request: replace the agent's worker if it died, was poisoned or is worn."""
        if not worker.alive or worker.poisoned or self._worn_out(worker):
            self._workers.pop(agent_id, None)
            self._retire(worker)

    async def _batch(
        self,
        worker: WorkerProcess,
        hooks: list[HookSpec],
        event: dict[str, Any],
        state: msgspec.Raw | SplitState,
        compile_only: bool,
        ahead: Sequence[Step] = (),
        candles: Sequence[msgspec.Raw] = (),
        *,
        speculative: bool = False,
    ) -> list[HookResult]:
        """Results for a prefix of ``hooks`` (then of each step of ``ahead``, numbered
        on): all of them, or up to the one that killed the worker (which is then dead
        and the caller re-runs the rest of the first event's hooks). A ``speculative``
        request tracks the first event's reads too, and its caller has other work:
        it sleeps on the doorbell instead of polling."""
        rest, windows = (
            (state.rest, state.windows) if isinstance(state, SplitState) else (state, None)
        )
        same, series, held, full = _plan(worker, rest, windows)
        calls = [HookCall(h.hook_id, h.revision, h.kind, _source_for(worker, h)) for h in hooks]
        if not compile_only and any(c.source for c in calls):
            # A fresh worker gets every source with the event: when that would not fit
            # one frame, the sources go first in compile-only requests that do.
            size = len(_encoded(worker, Batch(0, event, rest, calls, False, 0))) - 4
            size += full - len(rest)
            if size > self.config.max_frame_bytes:
                if not await self._precompile(worker, hooks):
                    return []  # the worker died compiling: the caller retries on a fresh one
                same, series, held, full = _plan(worker, rest, windows)  # it holds no state
            calls = [HookCall(h.hook_id, h.revision, h.kind, _source_for(worker, h)) for h in hooks]
        batch_id = next(self._ids)
        spin_us, token = self._spin.start()
        if speculative:
            spin_us = 0
        worker.spin_missed = False
        sent = _NO_STATE if same else rest
        # What the frame lacks of the whole state (as a fresh worker would be sent it).
        hidden = full - (len(_NO_STATE) if same else len(rest)) + 1 - deltas_size(series)
        try:
            linger = spin_us * WORKER_LINGER
            data = _encoded(
                worker,
                Batch(
                    batch_id, event, sent, calls, compile_only, linger, [*ahead], speculative,
                    [*candles], same, series,
                ),
            )  # fmt: skip
            if ahead and len(data) - 4 + hidden > self.config.max_frame_bytes:
                ahead = ()  # the lookahead is only worth it if it fits
                data = _encoded(
                    worker,
                    Batch(
                        batch_id, event, sent, calls, compile_only, linger, [], speculative,
                        [], same, series,
                    ),
                )  # fmt: skip
            if len(data) - 4 + hidden > self.config.max_frame_bytes:
                raise HookRequestTooLarge(len(data) - 4 + hidden, self.config.max_frame_bytes)
            try:
                await worker.send(data, self.config.timeout_ms / 1000 + 1.0)
            except HookCrashed:  # died while idle (not a hook's doing): the caller retries
                worker.kill()
                return []
            worker.sent_state, worker.sent_windows = rest, windows
            worker.series, worker.sent_size = held, full
            return await self._collect(
                worker, batch_id, hooks, calls, spin_us, compile_only, len(ahead)
            )
        finally:
            self._spin.finish(token, worker.spin_missed)

    async def _precompile(self, worker: WorkerProcess, hooks: list[HookSpec]) -> bool:
        """Send the sources ``worker`` lacks in compile-only requests of at most half a
        frame each; False if the worker died on the way."""
        budget = self.config.max_frame_bytes // 2
        chunk: list[HookSpec] = []
        size = 0
        chunks: list[list[HookSpec]] = []
        for h in hooks:
            if _source_for(worker, h) is None:
                continue
            n = len(h.source.encode())
            if chunk and size + n > budget:
                chunks.append(chunk)
                chunk, size = [], 0
            chunk.append(h)
            size += n
        if chunk:
            chunks.append(chunk)
        for part in chunks:
            done = await self._batch(worker, part, {}, _NO_STATE, True)
            if len(done) < len(part) or not worker.alive:
                return False
        return True

    async def _collect(
        self,
        worker: WorkerProcess,
        batch_id: int,
        hooks: list[HookSpec],
        calls: list[HookCall],
        spin_us: int,
        compile_only: bool,
        steps: int = 0,
    ) -> list[HookResult]:
        cfg = self.config
        worker.batches += 1
        budget = cfg.timeout_ms / 1000
        budgets = [budget] * (len(calls) * (1 + steps))
        for i, c in enumerate(calls):
            if c.source:
                budgets[i] += cfg.compile_timeout_ms / 1000
        n = len(hooks)
        out: list[HookResult] = []

        def accept(res: Result) -> None:  # as each arrives: while the worker runs the next
            out.append(self._accept(hooks[len(out) % n], res, compile_only))

        try:
            results, failure, msg, spent = await worker.collect(
                batch_id, budgets, time.monotonic(), spin_us / 1e6, self._spin.alone, accept,
                runtime_limit=budget,
            )  # fmt: skip
        except BaseException:  # cancelled mid-batch: its results would confuse the next one
            worker.kill()
            raise
        for c in calls[: len(results)]:
            if c.source is not None:
                worker.known[c.hook_id] = c.revision
        worker.evaluations += len(results)
        for res in results:
            if res.error_kind == "memory":
                worker.poisoned = True
            elif res.error_kind and res.error_kind not in _WORKER_ERROR_KINDS:
                worker.kill()  # a worker that reports what it cannot have seen
        if failure is not None:
            worker.kill()
            culprit = hooks[len(results) % n]
            out.append(_error(culprit, failure, msg, spent * 1000))
        return out

    def _accept(self, h: HookSpec, res: Result, compile_only: bool) -> HookResult:
        """The daemon's view of one result (what it means for the worker is
        :meth:`_collect`'s to act on)."""
        ms = res.runtime_us / 1000
        if res.error_kind:
            if res.error_kind not in _WORKER_ERROR_KINDS:
                return _error(
                    h, "crashed", f"worker reported unknown error kind {res.error_kind!r}"
                )
            msg = res.error[: self.config.max_error_chars]
            return _error(h, res.error_kind, msg, ms)  # type: ignore[arg-type]
        if compile_only:
            return HookResult(hook_id=h.hook_id, kind=h.kind, revision=h.revision, runtime_ms=ms)
        try:
            decision = validate_result(res.value, h.kind, self.config.max_result_bytes)
        except HookResultInvalid as exc:
            return _error(h, "invalid_result", str(exc), ms)
        return HookResult(
            hook_id=h.hook_id, kind=h.kind, revision=h.revision, runtime_ms=ms,
            decision=decision, output=res.output, reads=tuple(res.reads[:_MAX_READS]),
        )  # fmt: skip

    def _worn_out(self, worker: WorkerProcess) -> bool:
        if worker.evaluations >= self.config.recycle_after:
            return True
        if worker.batches % _USAGE_CHECK_EVERY:
            return False
        rss, cpu = worker.usage()
        limit = self.config.recycle_rss_mb * 1024 * 1024
        return rss > limit or cpu > self.config.cpu_seconds / 2

    # --- workers ----------------------------------------------------------

    def _lock(self, agent_id: str) -> asyncio.Lock:
        lock = self._locks.get(agent_id)
        if lock is None:
            lock = self._locks[agent_id] = asyncio.Lock()
        return lock

    async def _worker_for(self, agent_id: str) -> WorkerProcess:
        w = self._workers.get(agent_id)
        if w is not None and w.alive:
            return w
        if self._closed:
            raise SandboxUnavailable("the hook worker pool is closed")
        if self._spares:
            w = self._spares.pop()
        else:
            if self._spare_error is not None and time.monotonic() < self._retry_at:
                raise self._spare_error  # no restart storm while workers cannot start
            try:
                w = await WorkerProcess.start(self.config)
            except Exception as exc:
                self._spawn_failed(exc)
                raise
            self._spawn_ok(w)
        self._workers[agent_id] = w
        self.respawns += 1
        self._refill()
        return w

    def _refill(self) -> None:
        if self._spare_error is not None and time.monotonic() < self._retry_at:
            return
        while len(self._spares) + self._refilling < self.config.spare_workers:
            self._refilling += 1
            self._tg.start_soon(self._spawn_spare)

    def _spawn_failed(self, exc: Exception) -> None:
        self._spare_error = exc
        self._spawn_failures += 1
        self._retry_at = time.monotonic() + min(0.5 * 2**self._spawn_failures, 60.0)

    def _spawn_ok(self, w: WorkerProcess) -> None:
        self.ready = w.ready
        self._spare_error = None
        self._spawn_failures = 0

    async def _spawn_spare(self) -> None:
        try:
            w = await WorkerProcess.start(self.config)
        except Exception as exc:  # noqa: BLE001 - re-raised by the next _worker_for
            self._spawn_failed(exc)
            return
        finally:
            self._refilling -= 1
        self._spawn_ok(w)
        if self._closed:
            self._retire(w)
        else:
            self._spares.append(w)

    def _retire(self, w: WorkerProcess) -> None:
        w.kill()
        self._tg.start_soon(_reap, w)

    def adopt_spare(self, w: WorkerProcess) -> None:
        """Take a started worker as a spare (the pool's first worker proves the layers)."""
        self.ready = w.ready
        self._spares.append(w)
        self._refill()

    async def aclose(self) -> None:
        """Kill every worker and reap them."""
        self._closed = True
        workers = [*self._workers.values(), *self._spares]
        self._workers.clear()
        self._spares.clear()
        for w in workers:
            self._retire(w)

    def worker_pids(self) -> dict[str, int]:
        """Live worker pid per agent (spares excluded), for diagnostics and tests."""
        return {a: w.pid for a, w in self._workers.items() if w.alive}

    def spare_pids(self) -> list[int]:
        """Pids of the warm spares."""
        return [w.pid for w in self._spares]


async def _reap(w: WorkerProcess) -> None:
    """Wait for a killed worker's exit, shielded: a pool closed by a cancellation (the
    daemon's stop, a failing sibling task) still reaps its workers, not leaves zombies.
    The worker has been sent SIGKILL, so the wait is short."""
    with anyio.CancelScope(shield=True):
        await anyio.to_thread.run_sync(w.proc.wait)


_NO_STATE = encode_state(None)  # what compile() sends


def _plan(
    worker: WorkerProcess, rest: msgspec.Raw, windows: Windows | None
) -> tuple[bool, list[SeriesDelta] | None, Held, int]:
    """What to send ``worker`` of a state (``rest``, and its candle ``windows`` when
    they go apart): whether it holds that state already (nothing is sent), the
    series deltas, what it holds after them, and the state's size encoded at once
    (whatever this worker holds: the size checks do not depend on which worker
    gets a request)."""
    same = rest == worker.sent_state and windows == worker.sent_windows
    if windows is None:
        return same, None, worker.series, len(rest)
    if same:
        return same, None, worker.series, worker.sent_size
    series, held, candles = deltas(worker.series, windows)
    return same, series, held, len(rest) - 1 + candles


def _prepare(state: Any) -> msgspec.Raw | SplitState:
    """``state`` encoded once per request: its candle series apart when they are in
    the daemon's form (each worker is then sent what moved, see
    :mod:`hooks_runtime.series`), else whole."""
    if isinstance(state, msgspec.Raw):
        return state
    if type(state) is dict:
        parts = split(state)
        if parts is not None:
            return parts
    return encode_state(state)


def _encoded(worker: WorkerProcess, batch: Batch) -> bytes:
    """``batch`` as the worker's frame; :exc:`HookRequestUnsendable` when it holds a
    value msgpack cannot carry (an integer beyond 64 bits in a recorded payload)."""
    try:
        return worker.encoder.encode(batch)
    except (OverflowError, TypeError, ValueError) as exc:
        raise HookRequestUnsendable(str(exc)) from None


def _source_for(worker: WorkerProcess, h: HookSpec) -> str | None:
    return None if worker.known.get(h.hook_id) == h.revision else h.source


@asynccontextmanager
async def open_worker_pool(config: SandboxConfig | None = None) -> AsyncIterator[WorkerPool]:
    """Start a pool; raises :exc:`SandboxUnavailable` (unwrapped) if the first worker
    cannot start or lacks a required layer. Exceptions from the body propagate as is."""
    cfg = config or SandboxConfig()
    first = await WorkerProcess.start(cfg)
    failure: BaseException | None = None
    async with anyio.create_task_group() as tg:
        pool = WorkerPool(cfg, tg)
        pool.adopt_spare(first)
        try:
            yield pool
        except BaseException as exc:  # noqa: BLE001 - re-raised below, outside the group
            failure = exc
        finally:
            with anyio.CancelScope(shield=True):
                await pool.aclose()
    if failure is not None:
        raise failure
