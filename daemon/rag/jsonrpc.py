"""JSON-RPC 2.0 message rules, sans-I/O: one text in, calls to run, bytes out.

Per the spec: a notification (no ``id`` member) never gets a response, not
even an error; ``[]`` gets one (non-array) -32600; a batch gets an array with
one response per non-notification member, invalid members included; a batch
of only notifications gets nothing at all. Invalid JSON or invalid UTF-8 is
-32700 with ``id: null``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

import msgspec

PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
METHOD_NOT_FOUND: Final = -32601
INVALID_PARAMS: Final = -32602
SERVER_ERROR: Final = -32000

_MESSAGES: Final = {
    PARSE_ERROR: "Parse error",
    INVALID_REQUEST: "Invalid Request",
    METHOD_NOT_FOUND: "Method not found",
    INVALID_PARAMS: "Invalid params",
    SERVER_ERROR: "Server error",
}
_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()


@dataclass(frozen=True, slots=True)
class Call:
    """A valid request or notification to execute."""

    method: str
    params: Any
    id: Any = None
    notification: bool = False


@dataclass(slots=True)
class Message:
    """What one JSON text asks for: calls to run and responses already decided."""

    batch: bool
    # Each entry is a Call (to run) or a finished response dict, in input order.
    entries: list[Call | dict[str, Any]] = field(default_factory=list)

    @property
    def calls(self) -> list[Call]:
        return [e for e in self.entries if isinstance(e, Call)]


def error(id_: Any, code: int, message: str | None = None, data: Any = None) -> dict[str, Any]:
    """An error response object (``data`` omitted when None)."""
    err: dict[str, Any] = {"code": code, "message": message or _MESSAGES.get(code, "Error")}
    if data is not None:
        err["data"] = data
    return {"jsonrpc": "2.0", "error": err, "id": id_}


def result(id_: Any, value: Any) -> dict[str, Any]:
    """A success response object."""
    return {"jsonrpc": "2.0", "result": value, "id": id_}


def _valid_id(obj: dict[str, Any]) -> bool:
    v = obj.get("id")
    return v is None or (isinstance(v, (str, int, float)) and not isinstance(v, bool))


def _entry(obj: Any) -> Call | dict[str, Any]:
    if not isinstance(obj, dict):
        return error(None, INVALID_REQUEST)
    id_ok = _valid_id(obj)
    rid = obj.get("id") if id_ok else None
    if (
        obj.get("jsonrpc") != "2.0"
        or not isinstance(obj.get("method"), str)
        or not id_ok
        or ("params" in obj and not isinstance(obj["params"], (dict, list)))
    ):
        return error(rid, INVALID_REQUEST)
    return Call(obj["method"], obj.get("params"), rid, "id" not in obj)


def parse(text: bytes, max_batch: int = 0) -> Message:
    """Classify one JSON text (a request, a notification or a batch); a batch longer
    than ``max_batch`` (0 = no limit) is one -32600 error, nothing runs."""
    try:
        obj = _decoder.decode(text.decode("utf-8"))
    except (UnicodeDecodeError, msgspec.DecodeError, RecursionError):
        return Message(batch=False, entries=[error(None, PARSE_ERROR)])
    if isinstance(obj, list):
        if not obj:
            return Message(batch=False, entries=[error(None, INVALID_REQUEST)])
        if max_batch and len(obj) > max_batch:
            data = {"reason": f"a batch of {len(obj)} members exceeds max_batch ({max_batch})"}
            return Message(batch=False, entries=[error(None, INVALID_REQUEST, data=data)])
        return Message(batch=True, entries=[_entry(o) for o in obj])
    return Message(batch=False, entries=[_entry(obj)])


def encode(
    message: Message, responses: list[dict[str, Any] | None], max_bytes: int = 0
) -> bytes | None:
    """The bytes to send (one line) for the responses of ``message``, or None. Past
    ``max_bytes`` (0 = no limit) every result becomes a -32000 error giving the size:
    an error the client can act on, never a truncated answer."""
    out = [r for r in responses if r is not None]
    if not out:
        return None
    body = out if message.batch else out[0]
    data = _encoder.encode(body) + b"\n"
    if max_bytes and len(data) > max_bytes:
        reason = {
            "reason": f"the response of {len(data)} bytes exceeds max_response_bytes "
            f"({max_bytes}); ask for fewer matches (top_k) or fewer calls per batch"
        }
        out = [
            error(r.get("id"), SERVER_ERROR, "Response too large", reason) if "result" in r else r
            for r in out
        ]
        data = _encoder.encode(out if message.batch else out[0]) + b"\n"
    return data


def oversized(limit: int) -> bytes:
    """The line sent before closing a connection whose request exceeded the limit."""
    data = {"reason": f"request exceeds max_request_bytes ({limit})"}
    return _encoder.encode(error(None, INVALID_REQUEST, data=data)) + b"\n"
