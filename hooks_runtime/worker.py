"""The sandbox worker: a long-lived process that compiles and runs one agent's hooks.

Started by :mod:`hooks_runtime.spawn` as ``python -I -S -B -X int_max_str_digits=4300
-c BOOT <sys.path entries>``. It imports everything it will ever need, moves the
IPC pipes off fds 0/1, hardens itself (:mod:`hooks_runtime.hardening`), reports
READY with the active layers, then serves batches until its stdin closes.

Each hook of a batch is compiled at most once per revision (cached as a code
object), executed into fresh globals, called with a shallow copy of the event
whose nested values are read-only, and the shared read-only state. Its result is
validated here, inside the deadline, and streamed back at once so the parent
can time and blame each hook separately.
"""

from __future__ import annotations

import datetime
import decimal
import gc
import os
import sys
import time
import types
from collections.abc import Iterator, Mapping
from typing import Any

import msgspec

from daemon.errors import NOT_JSON, HookCompileError, HookCrashed, HookResultInvalid
from hooks_runtime import hardening, policy
from hooks_runtime.config import SandboxConfig
from hooks_runtime.decisions import to_builtins
from hooks_runtime.protocol import (
    LAST_OUTPUTS,
    READ_ALL,
    SERIES_KEY,
    Batch,
    Fatal,
    FrameEncoder,
    FrameReader,
    HookCall,
    Ready,
    Result,
    SeriesDelta,
    Setup,
    decode_to_worker,
    result_frame_cap,
)
from hooks_runtime.series import check, forget_oldest
from hooks_runtime.validate import check_result, validate_result

_RAW_MAP = msgspec.msgpack.Decoder(dict[str, msgspec.Raw])
_ANY = msgspec.msgpack.Decoder()
_ANY_ENC = msgspec.msgpack.Encoder()
_SERIES = msgspec.msgpack.Decoder(dict[str, dict[str, list[msgspec.Raw]]])
_SERIES_REFS = msgspec.msgpack.Decoder(dict[str, dict[str, list[int]]])
_STATE_CACHE_KEYS = 64
_CANDLE_SLACK = 256  # candles the cache may hold beyond twice the series' own
_NO_WINDOW: tuple[list[msgspec.Raw], tuple[Any, ...]] = ([], ())
_FULL_GC_EVERY = 1024  # batches; per hook only the young generation is collected

# datetime.strptime imports _strptime lazily (HA #132469): do it now, while the
# filesystem is open, so 3.11 caches it and no hook ever triggers the import.
datetime.datetime.strptime("2000", "%Y")

#: The command-line program a worker runs: argv[1] is the doorbell fd, argv[2:] are
#: prepended to sys.path (``-S`` leaves site-packages out).
BOOT = (
    "import sys;sys.path[:0]=sys.argv[2:];"
    "from hooks_runtime.worker import main;main(int(sys.argv[1]))"
)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def describe(exc: BaseException, filename: str, limit: int) -> str:
    """``Type: message (line N)``, never raising, whatever the exception holds."""
    try:
        line = None
        tb = exc.__traceback__
        while tb is not None:
            if tb.tb_frame.f_code.co_filename == filename:
                line = tb.tb_lineno
            tb = tb.tb_next
        where = f" (line {line})" if line else ""
        return _clip(f"{type(exc).__name__}: {exc}{where}", limit)
    except BaseException:  # noqa: BLE001 - a hostile __str__ must not kill the worker
        return type(exc).__name__


class ReadTracker(Mapping[str, Any]):
    """A lookahead step's read-only state that notes which top-level keys a hook reads.

    Only keys the state has are noted; anything that lists or copies the whole
    state notes :data:`READ_ALL`. It offers what ``MappingProxyType`` offers
    (``copy`` and ``|`` included), so a hook sees no difference.
    """

    __slots__ = ("_data", "_reads")

    def __init__(self, data: dict[str, Any], reads: set[str]) -> None:
        self._data = data
        self._reads = reads

    def __getitem__(self, key: str) -> Any:
        value = self._data[key]
        self._reads.add(key)
        return value

    def __contains__(self, key: object) -> bool:
        if key in self._data:
            self._reads.add(key)
            return True
        return False

    def __iter__(self) -> Iterator[str]:
        self._reads.add(READ_ALL)
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __reversed__(self) -> Iterator[str]:
        self._reads.add(READ_ALL)
        return reversed(self._data)

    def copy(self) -> dict[str, Any]:
        self._reads.add(READ_ALL)
        return dict(self._data)

    def __or__(self, other: Any) -> Any:
        self._reads.add(READ_ALL)
        return self._data | other

    def __ror__(self, other: Any) -> Any:
        self._reads.add(READ_ALL)
        return other | self._data

    def __repr__(self) -> str:
        self._reads.add(READ_ALL)
        return f"mappingproxy({self._data!r})"


class Evaluator:
    """Compiled-code cache plus the per-hook evaluation steps."""

    def __init__(self, cfg: SandboxConfig) -> None:
        self.cfg = cfg
        # hook_id -> (revision, code object or compile error message)
        self.cache: dict[str, tuple[str, types.CodeType | str]] = {}
        # top-level state key -> (its encoded bytes, frozen value) from the last batch
        self.state_cache: dict[str, tuple[msgspec.Raw, Any]] = {}
        # each candle of the last batch's series (and of the lookahead tables since),
        # by its encoded bytes, so a candle is decoded once while it is in view
        self.candle_cache: dict[bytes, Any] = {}
        # (symbol, timeframe) -> the last batch's candles of that series, as sent and
        # frozen: a window that only moved on by one is then compared in C, not
        # looked up candle by candle
        self.windows: dict[tuple[str, str], tuple[list[msgspec.Raw], tuple[Any, ...]]] = {}
        # the same, for the windows batches with series deltas left (the parent holds
        # the same ones: each delta is against these), the most recently listed last
        self.deltas: dict[tuple[str, str], tuple[list[msgspec.Raw], tuple[Any, ...]]] = {}
        # the last batch's first state (frozen) and its lastOutputs bytes, for a
        # batch whose state is the same (Batch.same_state)
        self.last: tuple[Any, msgspec.Raw | None] | None = None

    def state(
        self,
        raw: msgspec.Raw,
        table: list[Any] | None = None,
        series: list[SeriesDelta] | None = None,
    ) -> Any:
        """Decode and freeze the batch state, reusing unchanged top-level values;
        ``table``: a lookahead step's candles, which its series list by index;
        ``series``: the candle series as deltas, in place of the state's own."""
        built = None if series is None else self._apply(series)
        try:
            parts = _RAW_MAP.decode(raw)
        except msgspec.ValidationError:  # not a str-keyed map: no reuse
            self.state_cache = {}
            whole = _ANY.decode(raw)
            if built is not None and type(whole) is dict and SERIES_KEY in whole:
                whole[SERIES_KEY] = built
            return policy.freeze(whole)
        old, new, values = self.state_cache, {}, {}
        for key, part in parts.items():
            if built is not None and key == SERIES_KEY:
                values[key] = built  # its bytes (a placeholder) mean nothing: not cached
                continue
            if table is not None and key == SERIES_KEY:
                # Indices mean something only with this table: never reused by bytes.
                values[key] = self._series_refs(part, table)
                continue
            hit = old.get(key)
            if hit is not None and hit[0] == part:
                value = hit[1]
            elif key == SERIES_KEY:
                value = self._series(part)
            else:
                value = policy.freeze(_ANY.decode(part))
            new[key] = (part, value)
            values[key] = value
        self.state_cache = new if len(new) <= _STATE_CACHE_KEYS else {}
        return types.MappingProxyType(values)

    def table(self, candles: list[msgspec.Raw]) -> list[Any]:
        """A lookahead request's candles, frozen (each one the last batches had is
        reused by its bytes, and the next batch may reuse these)."""
        cache, out = self.candle_cache, []
        for c in candles:
            b = bytes(c)
            value = cache.get(b)
            if value is None:
                value = cache[b] = policy.freeze(_ANY.decode(c))
            out.append(value)
        self._bound_cache()
        return out

    @staticmethod
    def _series_refs(raw: msgspec.Raw, table: list[Any]) -> Any:
        """A lookahead step's series: candle indices into the request's table."""
        series = _SERIES_REFS.decode(raw)
        return types.MappingProxyType(
            {
                symbol: types.MappingProxyType(
                    {tf: tuple([table[i] for i in refs]) for tf, refs in frames.items()}
                )
                for symbol, frames in series.items()
            }
        )

    def _series(self, raw: msgspec.Raw) -> Any:
        """The frozen candle series, reusing every candle the last batch had (frozen
        values are read-only, so sharing them between batches is as safe as sharing
        an unchanged top-level key)."""
        try:
            series = _SERIES.decode(raw)
        except msgspec.ValidationError:  # not the usual shape: no reuse
            self.candle_cache, self.windows = {}, {}
            return policy.freeze(_ANY.decode(raw))
        last, windows = self.windows, {}
        out = {}
        for symbol, frames in series.items():
            by_tf = {}
            for tf, candles in frames.items():
                key = (symbol, tf)
                row = self._moved(last.get(key), candles)
                if row is None:
                    row = tuple([self._candle(c) for c in candles])
                windows[key] = (candles, row)
                by_tf[tf] = row
            out[symbol] = types.MappingProxyType(by_tf)
        self.windows = windows
        self._bound_cache()
        return types.MappingProxyType(out)

    def _apply(self, series: list[SeriesDelta]) -> Any:
        """The candle series: each window held moved as its delta says (a delta that
        does not fit what is held ends the worker, see :func:`series.check`)."""
        held = self.deltas
        out: dict[str, dict[str, tuple[Any, ...]]] = {}
        for d in series:
            key = (d.symbol, d.timeframe)
            raws, row = held.pop(key, _NO_WINDOW)  # put back last: the most recent
            check(d, len(raws))
            if d.drop or d.new:
                fresh = [self._candle(c) for c in d.new]
                raws, row = raws[d.drop :] + d.new, (*row[d.drop :], *fresh)
            held[key] = (raws, row)
            out.setdefault(d.symbol, {})[d.timeframe] = row
        forget_oldest(held)
        self._bound_cache()
        return types.MappingProxyType(
            {symbol: types.MappingProxyType(frames) for symbol, frames in out.items()}
        )

    def _bound_cache(self) -> None:
        """Keep the candle cache near the candles in view: past twice those plus a
        slack (windows that jumped, lookahead tables), keep only those in view."""
        if len(self.candle_cache) <= _CANDLE_SLACK:
            return
        views = [*self.windows.values(), *self.deltas.values()]
        held = sum(len(c) for c, _ in views)
        if len(self.candle_cache) > 2 * held + _CANDLE_SLACK:
            self.candle_cache = {
                bytes(c): v for cs, row in views for c, v in zip(cs, row, strict=True)
            }

    def _moved(
        self, last: tuple[list[msgspec.Raw], tuple[Any, ...]] | None, candles: list[msgspec.Raw]
    ) -> tuple[Any, ...] | None:
        """The series when ``candles`` are the last batch's unchanged, moved on by one,
        grown by one or cut short (list comparisons run in C); else None."""
        if last is None:
            return None
        old, row = last
        n, m = len(candles), len(old)
        if n == m:
            if candles == old:
                return row
            if n and candles[:-1] == old[1:]:
                self.candle_cache.pop(bytes(old[0]), None)
                return (*row[1:], self._candle(candles[-1]))
        elif n == m + 1 and candles[:-1] == old:
            return (*row, self._candle(candles[-1]))
        elif n < m and candles == old[:n]:
            return row[:n]
        return None

    def _candle(self, raw: msgspec.Raw) -> Any:
        """One candle, frozen: reused by its bytes while it is in view."""
        b = bytes(raw)
        value = self.candle_cache.get(b)
        if value is None:
            value = self.candle_cache[b] = policy.freeze(_ANY.decode(raw))
        return value

    def _code(self, call: HookCall) -> types.CodeType:
        if call.source is not None:
            try:
                code: types.CodeType | str = policy.compile_hook(
                    call.source, self._filename(call), self.cfg.max_source_bytes
                )
            except HookCompileError as exc:
                code = _clip(str(exc), self.cfg.max_error_chars)
            self.cache[call.hook_id] = (call.revision, code)
        entry = self.cache.get(call.hook_id)
        if entry is None or entry[0] != call.revision:
            raise HookCompileError(f"worker has no source for revision {call.revision}")
        if isinstance(entry[1], str):
            raise HookCompileError(entry[1])
        return entry[1]

    @staticmethod
    def _filename(call: HookCall) -> str:
        return f"<hook {call.hook_id}@{call.revision[:12]}>"

    def evaluate(
        self,
        code: types.CodeType,
        call: HookCall,
        event: dict[str, Any],
        state: Any,
        compile_only: bool,
    ) -> tuple[Any, str]:
        """Run one hook's compiled ``code``; returns (its checked result dict, printed
        output)."""
        if compile_only:
            return None, ""
        out = policy.OutputBuffer(self.cfg.max_output_bytes)
        importer = policy.Importer(call.revision, event.get("eventId"))
        glb = policy.fresh_globals("hook", importer, out)
        decimal.setcontext(decimal.Context())  # every hook starts from the default context
        try:
            exec(code, glb)  # noqa: S102 - restricted code object, fresh guarded globals
            fn = glb.get("evaluate")
            if type(fn) is not types.FunctionType:
                raise HookCompileError("the hook defines no evaluate(event, state) function")
            value = fn(dict(event), state)
        finally:
            # The hook's functions and its globals refer to each other: break that
            # cycle so they go now, not in the collection after each hook.
            glb.clear()
        check_result(value, call.kind, self.cfg.max_result_bytes)  # the daemon converts
        return value, out.text()

    def run(self, batch: Batch, send: Any) -> None:
        """Evaluate every hook of ``batch``, sending one Result each, in order: the
        first event's, then each lookahead step's."""
        event = {k: policy.freeze(v) for k, v in batch.event.items()}
        if batch.same_state:
            if self.last is None:
                raise HookCrashed("a batch reused a state this worker never had")
            state, last_outputs = self.last
        else:
            state = self.state(batch.state, series=batch.series)
            hit = self.state_cache.get(LAST_OUTPUTS)
            last_outputs = hit[0] if hit is not None else None
            self.last = (state, last_outputs)
        outputs = None
        if batch.ahead:  # what the parent's state.lastOutputs will be after each step
            last = _ANY.decode(last_outputs) if last_outputs is not None else None
            outputs = dict(last) if type(last) is dict else {}
        n = len(batch.hooks)
        first = dict(state) if batch.track else None
        for index, call in enumerate(batch.hooks):
            if first is not None:
                reads: set[str] = set()
                view = ReadTracker(first, reads)
                send(self._one(batch, index, call, event, view, outputs, reads))
            else:
                send(self._one(batch, index, call, event, state, outputs))
        table = self.table(batch.candles) if batch.candles else None
        for step, later in enumerate(batch.ahead, 1):
            assert outputs is not None
            event = {k: policy.freeze(v) for k, v in later.event.items()}
            base = dict(self.state(later.state, table))
            base[LAST_OUTPUTS] = policy.freeze(_ANY.decode(_ANY_ENC.encode(outputs)))
            for index, call in enumerate(batch.hooks):
                reads = set()
                view = ReadTracker(base, reads)
                send(self._one(batch, step * n + index, call, event, view, outputs, reads))

    def _carry(self, outputs: dict[str, Any], call: HookCall, value: Any) -> None:
        """Put a hook's decision into ``outputs`` exactly as the parent will put it into
        ``lastOutputs``: from the result as the parent decodes it, validated the same way."""
        try:
            seen = _ANY.decode(_ANY_ENC.encode(value))
            decision = validate_result(seen, call.kind, self.cfg.max_result_bytes)
        except Exception:  # noqa: BLE001 - the parent gets an invalid_result: no entry
            return
        outputs[call.hook_id] = to_builtins(decision)

    def _one(
        self,
        batch: Batch,
        index: int,
        call: HookCall,
        event: Any,
        state: Any,
        outputs: dict[str, Any] | None = None,
        reads: set[str] | None = None,
    ) -> Result:
        """Evaluate one hook; with ``outputs`` (a lookahead batch) its decision goes
        into them as the parent will put it into ``lastOutputs``."""
        t0 = time.perf_counter_ns()
        limit = self.cfg.max_error_chars
        kind, msg, value, output = "", "", None, ""
        try:
            code = self._code(call)  # a source compiles off the evaluation's clock
            t0 = time.perf_counter_ns()
            value, output = self.evaluate(code, call, event, state, batch.compile_only)
        except HookCompileError as exc:
            kind, msg = "compile", _clip(str(exc), limit)
        except HookResultInvalid as exc:
            kind, msg = "invalid_result", _clip(str(exc), limit)
        except MemoryError:
            kind, msg = "memory", "MemoryError: the hook exceeded the worker's memory limit"
        except BaseException as exc:  # noqa: BLE001 - SystemExit, KeyboardInterrupt, GeneratorExit too
            kind, msg = "runtime", describe(exc, self._filename(call), limit)
        # Cyclic garbage (and its finalizers) this hook made, failed or not, is all in
        # the youngest generation (automatic gc is off): collect it on this hook's budget,
        # again and again while finalizers leave new garbage, so no code of this hook
        # runs in the next one's window (an endless chain is this hook's timeout).
        while gc.collect(0):
            pass
        t1 = time.perf_counter_ns()
        done_at = time.monotonic()
        if outputs is not None and not kind:
            self._carry(outputs, call, value)
        read = sorted(reads) if reads else []
        return Result(batch.id, index, (t1 - t0) // 1000, done_at, value, kind, msg, output, read)


def _send_all(fd: int, data: bytes) -> None:
    sent = os.write(fd, data)
    if sent < len(data):  # only for frames larger than the pipe's free space
        view = memoryview(data)[sent:]
        while view:
            view = view[os.write(fd, view) :]


def _read(fd: int, linger: list[float]) -> bytes:
    """Read from ``fd``, busy-polling up to ``linger[0]`` seconds before blocking."""
    spin, linger[0] = linger[0], 0.0
    if spin > 0:
        os.set_blocking(fd, False)
        end = time.monotonic() + spin
        try:
            while time.monotonic() < end:
                try:
                    return os.read(fd, 1 << 16)
                except BlockingIOError:
                    pass
        finally:
            os.set_blocking(fd, True)
    return os.read(fd, 1 << 16)


def _frames(fd: int, reader: FrameReader, linger: list[float]) -> Any:
    """Yield decoded frames from ``fd`` until EOF."""
    while True:
        data = _read(fd, linger)
        if not data:
            return
        for body in reader.feed(data):
            yield decode_to_worker(body)


def _clean_fds(expected: set[int]) -> tuple[bool, list[int]]:
    listed = hardening.open_fds()
    fds = []
    for fd in listed:
        try:
            os.fstat(fd)
            fds.append(fd)
        except OSError:
            pass  # the directory handle used for listing
    return set(fds) == expected, fds


class ResultSender:
    """Writes Result frames to the IPC fd; an unencodable or over-cap result is replaced
    by an ``invalid_result`` so one frame per hook always goes out."""

    def __init__(self, fd: int, cfg: SandboxConfig) -> None:
        self.fd = fd
        self.enc = FrameEncoder()
        self.cap = result_frame_cap(cfg) + 4

    def __call__(self, result: Result) -> None:
        try:
            data = self.enc.encode(result)
        except Exception as exc:  # noqa: BLE001 - validated data should always encode
            data, problem = b"", f"result could not be encoded: {type(exc).__name__}"
        else:
            problem = "" if len(data) <= self.cap else "result frame is larger than the size cap"
        if problem:
            r = result
            data = self.enc.encode(
                Result(r.id, r.index, r.runtime_us, r.done_at, None, "invalid_result", problem)
            )
        _send_all(self.fd, data)


def _setup(frames: Any, ipc_out: int) -> SandboxConfig:
    """The first frame must be Setup; anything else ends the worker."""
    setup = next(frames, None)
    if not isinstance(setup, Setup):
        _send_all(ipc_out, FrameEncoder().encode(Fatal("first frame must be setup")))
        os._exit(2)
    return setup.config


def _serve(
    frames: Any, evaluator: Evaluator, send: ResultSender, bell: int, linger: list[float]
) -> None:
    """Answer batches until the parent closes the pipe."""
    for batches, frame in enumerate(frames, 1):
        if not isinstance(frame, Batch):
            os._exit(2)
        evaluator.run(frame, send)
        os.write(bell, b"!")
        linger[0] = frame.linger_us / 1e6
        if batches % _FULL_GC_EVERY == 0:
            gc.collect()  # between batches: no hook's budget pays for it


def main(bell_fd: int) -> None:
    """Worker entry point: isolate fds, read setup, harden, say READY, serve."""
    parent_pid = os.getppid()
    ipc_in, ipc_out, bell = hardening.isolate_fds(bell_fd)
    fds_ok, fds = _clean_fds({0, 1, 2, ipc_in, ipc_out, bell})
    reader = FrameReader(64 * 1024 * 1024)
    linger = [0.0]  # set per batch by the parent (only when nothing else is in flight)
    frames = _frames(ipc_in, reader, linger)
    cfg = _setup(frames, ipc_out)
    reader.max_frame_bytes = cfg.max_frame_bytes
    active, missing = hardening.harden(cfg, parent_pid)
    if fds_ok:
        active.insert(0, "fds")
    else:
        missing["fds"] = f"unexpected open fds {fds}"
    gc.collect()
    gc.freeze()
    gc.disable()
    ready = Ready(os.getpid(), active, missing, fds, sys.version.split()[0])
    _send_all(ipc_out, FrameEncoder().encode(ready))
    try:
        _serve(frames, Evaluator(cfg), ResultSender(ipc_out, cfg), bell, linger)
    except (*NOT_JSON, msgspec.ValidationError, OSError, HookCrashed):
        os._exit(2)
    os._exit(0)
