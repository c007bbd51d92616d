"""Typed frames between the daemon and a sandbox worker (sans-I/O).

A frame is a 4-byte big-endian length followed by a msgpack body; the body is
one of the tagged Structs below. msgpack (not pickle) means a hostile worker can
only ever send us plain data, and the length cap bounds what we buffer.
One request is outstanding per worker; the worker answers a batch with one
``Result`` per hook, written as soon as that hook is done, and then one byte on
a separate doorbell pipe. The parent sleeps on the doorbell only (one wakeup per
batch) and, when a deadline passes, drains the results pipe to see which hook
is still running; ``Result.done_at`` tells it when that hook started.
"""

from __future__ import annotations

import struct
from typing import Any, Literal

import msgspec

from daemon.errors import NOT_JSON, HookCrashed, HookRequestUnsendable
from hooks_runtime.config import SandboxConfig

HookKind = Literal["wake", "autotrade", "copytrade"]
ErrorKind = Literal[
    "compile",
    "runtime",
    "invalid_result",
    "memory",
    "timeout",
    "crashed",
    "backoff",
    "paused",
    "oversized",
    "unsendable",
]

_HEADER = struct.Struct(">I")


class Setup(msgspec.Struct, tag="setup", frozen=True):
    """First frame to a new worker: the limits it applies to itself before READY."""

    config: SandboxConfig


class HookCall(msgspec.Struct, frozen=True, array_like=True):
    """One hook of a batch; ``source`` is sent only when the worker lacks this revision."""

    hook_id: str
    revision: str
    kind: HookKind
    source: str | None = None


class Step(msgspec.Struct, frozen=True, array_like=True):
    """A later event of a lookahead batch; its ``state`` has no ``lastOutputs`` key."""

    event: dict[str, Any]
    state: msgspec.Raw


class SeriesDelta(msgspec.Struct, frozen=True, array_like=True):
    """How one candle series moved since the worker's last batch with deltas: of the
    ``held`` candles it has, drop the first ``drop``, then append ``new``."""

    symbol: str
    timeframe: str
    held: int
    drop: int
    new: list[msgspec.Raw]


class Batch(msgspec.Struct, tag="batch", frozen=True):
    """Evaluate ``hooks`` in order on one event; ``compile_only`` just compiles them.

    ``state`` is pre-encoded msgpack (see :func:`encode_state`): the worker decodes
    it per top-level key and reuses the frozen value of a key whose bytes did not
    change since the previous batch (candles do not change between ticks). With
    ``same_state`` the first event's state is byte for byte the previous batch's
    first state, which is not sent again (``state`` is then nil).

    ``ahead`` (event time only) are the events queued after this one, evaluated
    next in the same request (``track``: all of them are): the worker completes each one's state with the
    ``lastOutputs`` it carries forward from its own results, and reports which
    state keys each hook read (``Result.reads``), so the parent can tell whether
    a result still holds once the real portfolio of that event is known.
    Results are numbered ``step * len(hooks) + hook`` (the first event is step 0).
    """

    id: int
    event: dict[str, Any]
    state: msgspec.Raw
    hooks: list[HookCall]
    compile_only: bool = False
    # After answering, busy-poll this long for the next request before sleeping.
    linger_us: int = 0
    ahead: list[Step] = []
    # The first event is evaluated ahead of its turn too: report its hooks' reads.
    track: bool = False
    # The steps' candles, each once (a window moves by one candle a step): a step's
    # ``candles`` series list indices into this instead of candles.
    candles: list[msgspec.Raw] = []
    same_state: bool = False
    # The first state's candle series as deltas (see :mod:`hooks_runtime.series`):
    # ``state`` then has an empty map at its ``candles`` key, and the worker builds
    # the series listed here from the windows it holds (it keeps the others).
    series: list[SeriesDelta] | None = None


class Ready(msgspec.Struct, tag="ready", frozen=True):
    """The worker is hardened and waiting; ``missing`` maps a layer to why it is off."""

    pid: int
    active: list[str]
    missing: dict[str, str]
    fds: list[int]
    python: str


class Result(msgspec.Struct, tag="result", frozen=True, omit_defaults=True):
    """The outcome of hook ``index`` of batch ``id``."""

    id: int
    index: int
    runtime_us: int
    done_at: float  # worker's time.monotonic() (CLOCK_MONOTONIC is system-wide)
    value: Any = None
    error_kind: str = ""
    error: str = ""
    output: str = ""
    # Lookahead steps only: the top-level state keys the hook read (READ_ALL: it
    # listed or copied the whole state).
    reads: list[str] = []


READ_ALL = "*"
LAST_OUTPUTS = "lastOutputs"  # the state key of each hook's last decision
SERIES_KEY = "candles"  # the state key of the candle series: {symbol: {timeframe: [...]}}


def result_frame_cap(cfg: SandboxConfig) -> int:
    """Largest Result frame body: a capped value plus capped output and error text
    (in UTF-8, up to 4 bytes a character) plus the fixed fields."""
    return cfg.max_result_bytes + 4 * (cfg.max_output_bytes + cfg.max_error_chars) + 1024


class Fatal(msgspec.Struct, tag="fatal", frozen=True):
    """The worker could not start (bad setup); it exits after sending this."""

    message: str


ToWorker = Setup | Batch
FromWorker = Ready | Result | Fatal


class FrameEncoder:
    """Encodes frames into one reusable buffer (no per-frame concatenation)."""

    def __init__(self) -> None:
        self._enc = msgspec.msgpack.Encoder()
        self._buf = bytearray(64)

    def encode(self, msg: ToWorker | FromWorker) -> bytes:
        """The framed bytes of ``msg``."""
        self._enc.encode_into(msg, self._buf, _HEADER.size)
        _HEADER.pack_into(self._buf, 0, len(self._buf) - _HEADER.size)
        return bytes(self._buf)


class FrameReader:
    """Accumulates bytes and yields complete frame bodies; enforces the size cap."""

    def __init__(self, max_frame_bytes: int) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[bytes | memoryview]:
        """Add ``data``; return the bodies of all frames now complete.

        Fast path: when nothing is buffered (the usual case) frames are zero-copy
        views into ``data``; a partial frame is accumulated in a bytearray.
        """
        buf: bytes | bytearray
        if self._buf:
            self._buf += data
            buf = self._buf
        else:
            buf = data
        frames: list[bytes | memoryview] = []
        pos, n = 0, len(buf)
        while n - pos >= _HEADER.size:
            (size,) = _HEADER.unpack_from(buf, pos)
            if size > self.max_frame_bytes:
                raise HookCrashed(
                    f"frame of {size} bytes exceeds the {self.max_frame_bytes}-byte cap"
                )
            end = pos + _HEADER.size + size
            if n < end:
                break
            if buf is data:
                frames.append(memoryview(data)[pos + _HEADER.size : end])
            else:
                frames.append(bytes(buf[pos + _HEADER.size : end]))
            pos = end
        if buf is data:
            self._buf = bytearray(data[pos:])
        else:
            del self._buf[:pos]
        return frames

    @property
    def pending(self) -> int:
        """Bytes buffered towards an incomplete frame."""
        return len(self._buf)


_state_encoder = msgspec.msgpack.Encoder()


def encode_state(state: Any) -> msgspec.Raw:
    """Encode a hook state once per event (JSON-like data; TypeError otherwise, and
    :exc:`HookRequestUnsendable` for an integer beyond 64 bits)."""
    try:
        return msgspec.Raw(_state_encoder.encode(state))
    except OverflowError as exc:
        raise HookRequestUnsendable(str(exc)) from None
    except (msgspec.EncodeError, TypeError) as exc:
        raise TypeError(f"hook state is not plain data: {exc}") from None


_to_worker = msgspec.msgpack.Decoder(ToWorker)
_from_worker = msgspec.msgpack.Decoder(FromWorker)


def decode_to_worker(body: bytes | memoryview) -> ToWorker:
    """Decode a parent → worker frame body (raises msgspec errors on garbage)."""
    msg: ToWorker = _to_worker.decode(body)
    return msg


def decode_from_worker(body: bytes | memoryview) -> FromWorker:
    """Decode a worker → parent body; anything malformed is a crashed worker."""
    try:
        msg: FromWorker = _from_worker.decode(body)
    except (*NOT_JSON, msgspec.ValidationError, RecursionError) as exc:
        raise HookCrashed(f"worker sent a malformed frame: {exc}") from None
    return msg
