"""The one exception tree of marketwake.

Every error the project raises on purpose derives from :class:`MarketwakeError`.
Each class carries the process exit code the CLI uses and, where it can reach a
JSON-RPC client, the wire code. Third-party exceptions are translated at the
adapter that meets them, never deeper.

* :exc:`MarketwakeError`
    * :exc:`ConfigError` -- a config file or value is wrong (exit 2)
    * :exc:`StateDirInUse` -- another daemon holds the state dir (exit 2)
    * :exc:`FeedError` -- a feed could not do its job
        * :exc:`FeedProtocolError` -- the venue sent something we cannot parse
        * :exc:`FeedDisconnected` -- the connection dropped or stalled
    * :exc:`StoreError` -- a persistent store (SQLite, Qdrant) failed (rpc -32003)
    * :exc:`BrokerError` -- a broker refused an operation
    * :exc:`HookError` -- a hook could not produce a valid decision
        * :exc:`HookCompileError` (:exc:`WorkspaceFileError`), :exc:`HookCrashed`,
          :exc:`HookResultInvalid`, :exc:`HookRequestTooLarge` (a timeout is a
          recorded ``error_kind``, never raised: the parent kills the worker)
    * :exc:`SandboxUnavailable` -- a required hardening layer is missing
    * :exc:`RpcError` -- a JSON-RPC request failed; carries ``rpc_code``
    * :exc:`ReplayError` -- a replay file is malformed
    * :exc:`DataFileError` -- a RAG input CSV is missing or malformed (exit 2)
    * :exc:`EmbeddingError` -- an embedding could not be produced (rpc -32004)
"""

from __future__ import annotations

from typing import Any, ClassVar, Final

import msgspec

#: What decoding JSON bytes raises when they are not JSON: msgspec's DecodeError,
#: and UnicodeDecodeError (no DecodeError) for a string that is not UTF-8, as a
#: hostile peer sends or a kill leaves, tearing a line inside a character.
NOT_JSON: Final = (msgspec.DecodeError, UnicodeDecodeError)


class MarketwakeError(Exception):
    """Base of every deliberate marketwake error."""

    exit_code: ClassVar[int] = 1
    # How the RAG JSON-RPC server reports it (seed 003's error table).
    rpc_code: ClassVar[int] = -32000
    rpc_message: ClassVar[str] = "Server error"


class ConfigError(MarketwakeError):
    """The configuration is invalid; the message names the key path."""

    exit_code = 2


class StateDirInUse(MarketwakeError):
    """Another live daemon holds the state dir's lock (exit 2)."""

    exit_code = 2


class FeedError(MarketwakeError):
    """A feed failed to deliver events."""


class FeedProtocolError(FeedError):
    """The remote side sent data that does not match its documented format."""


class FeedDisconnected(FeedError):
    """The feed's connection closed or went silent."""


class SignalRejected(FeedError):
    """A copy-trade signal refused at the door: ``status`` is the HTTP answer (4xx)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class StoreError(MarketwakeError):
    """A persistent store could not be read or written."""

    rpc_code = -32003
    rpc_message = "Qdrant error"


class BrokerError(MarketwakeError):
    """A broker refused an operation (unknown order, order no longer working)."""


class DataFileError(MarketwakeError):
    """An input CSV (candles, funding, open interest) is missing or malformed."""

    exit_code = 2


class EmbeddingError(MarketwakeError):
    """An embedding could not be produced (model missing, mismatch with the collection)."""

    exit_code = 2
    rpc_code = -32004
    rpc_message = "Embedding error"


class ReplayError(MarketwakeError):
    """A replay or recording file could not be read."""

    exit_code = 2


class HookError(MarketwakeError):
    """A hook evaluation did not produce a valid decision."""


class HookCompileError(HookError):
    """The hook source failed to compile under the restricted policy."""


class WorkspaceFileError(HookCompileError):
    """A workspace file is a link, a special file, too large or unreadable.

    A compile error of that file (the agent keeps its last good revision); for
    agent.toml the loader turns it into the agent's ConfigError."""


class HookCrashed(HookError):
    """The worker died or broke protocol while evaluating the hook."""


class HookResultInvalid(HookError):
    """The hook returned a value that is not a valid decision for its kind."""


class HookRequestTooLarge(HookError):
    """An agent's event + state (or its sources) do not fit one worker frame.

    The agent's problem, never the daemon's: the dispatcher records it as an
    ``oversized`` error for each of that agent's hooks and serves on."""

    def __init__(self, size: int, cap: int) -> None:
        super().__init__(f"request of {size} bytes exceeds max_frame_bytes ({cap})")
        self.size = size
        self.cap = cap


class HookRequestUnsendable(HookError):
    """An agent's event or state holds a value the worker protocol cannot carry (an
    integer beyond 64 bits, from a hand-made recording): recorded by the dispatcher as
    an ``unsendable`` error for each of the agent's hooks, which serves on."""

    def __init__(self, why: str) -> None:
        super().__init__(f"the event or its state cannot be sent to the sandbox: {why}")


class SandboxUnavailable(MarketwakeError):
    """A hardening layer the configuration requires is not active."""

    exit_code = 3


class ModelAnswerError(MarketwakeError):
    """The model endpoint answered, but not with a reply (an HTML page, plain text):
    ``base_url`` points somewhere else than the provider's API."""


class RpcError(MarketwakeError):
    """A JSON-RPC error with its wire code and optional data."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data
