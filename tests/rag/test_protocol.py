"""Framing and JSON-RPC 2.0 rules, tested with bytes only (no sockets)."""

from __future__ import annotations

import json
import random
from typing import Any

from daemon.rag import jsonrpc
from daemon.rag.framing import OVERSIZED, FrameDecoder

PRETTY = b"""{
  "jsonrpc": "2.0",
  "id": 1,
  "method": "rag.query_patterns",
  "params": {
    "symbol": "BTCUSDT",
    "note": "braces } { ] [ and \\" quotes inside strings"
  }
}
"""


def _run(text: bytes) -> Any:
    """Parse, answer every call with its params echoed, decode the reply (None if silent)."""
    msg = jsonrpc.parse(text)
    responses = []
    for e in msg.entries:
        if isinstance(e, jsonrpc.Call):
            responses.append(None if e.notification else jsonrpc.result(e.id, e.params))
        else:
            responses.append(e)
    out = jsonrpc.encode(msg, responses)
    if out is None:
        return None
    assert out.endswith(b"\n") and out.count(b"\n") == 1
    return json.loads(out)


def test_ndjson_lines_split_anywhere() -> None:
    """Two NDJSON texts fed one byte at a time come out as two frames, CRLF tolerated."""
    data = b'{"a":1}\r\n[1,2]\n'
    dec = FrameDecoder(1000)
    frames = [f for i in range(len(data)) for f in dec.feed(data[i : i + 1])]
    assert frames == [b'{"a":1}', b"[1,2]"]
    assert dec.pending == 0


def test_pretty_printed_request_is_one_frame() -> None:
    """The seed's multi-line nc example (with brackets and escapes in strings) is one text."""
    dec = FrameDecoder(10_000)
    frames = dec.feed(PRETTY[:40]) + dec.feed(PRETTY[40:])
    assert len(frames) == 1
    assert json.loads(frames[0])["params"]["note"].startswith("braces }")


def test_concatenated_values_without_newline() -> None:
    """Back-to-back objects on one line are separate texts."""
    assert FrameDecoder(100).feed(b'{"a":1}{"b":[2]} ') == [b'{"a":1}', b'{"b":[2]}']


def test_scalar_garbage_is_read_to_end_of_line() -> None:
    """A line not starting with { or [ is one frame, answered with -32700 by the parser."""
    frames = FrameDecoder(100).feed(b"hello world\n")
    assert frames == [b"hello world"]
    assert _run(frames[0])["error"]["code"] == -32700


def test_oversized_text_yields_marker_once() -> None:
    """A text growing past the limit produces OVERSIZED once, then the decoder stays broken."""
    dec = FrameDecoder(64)
    assert dec.feed(b'{"a": "' + b"x" * 40) == []
    assert dec.feed(b"y" * 40) == [OVERSIZED]
    assert dec.broken and dec.feed(b'"}\n{"b":1}\n') == []


def test_oversized_line_in_one_chunk() -> None:
    """A complete but too-long line is refused too."""
    assert FrameDecoder(16).feed(b'{"k": "' + b"z" * 30 + b'"}\n') == [OVERSIZED]


def test_invalid_utf8_is_parse_error() -> None:
    """Bytes that are not UTF-8 get -32700 with id null."""
    out = _run(b'{"jsonrpc":"2.0","id":1,"method":"\xff\xfe"}')
    assert out == {
        "jsonrpc": "2.0",
        "error": {"code": -32700, "message": "Parse error"},
        "id": None,
    }


def test_deep_nesting_is_parse_error_not_crash() -> None:
    """Pathological nesting is answered, not a RecursionError escaping."""
    assert _run(b"[" * 50_000 + b"]" * 50_000)["error"]["code"] == -32700


def test_spec_examples_invalid_json_and_requests() -> None:
    """Spec §7: invalid JSON, invalid Request object, batch with invalid JSON."""
    assert (
        _run(b'{"jsonrpc": "2.0", "method": "foobar, "params": "bar", "baz]')["error"]["code"]
        == -32700
    )
    bad = _run(b'{"jsonrpc": "2.0", "method": 1, "params": "bar"}')
    assert bad == {
        "jsonrpc": "2.0",
        "error": {"code": -32600, "message": "Invalid Request"},
        "id": None,
    }
    assert (
        _run(b'[{"jsonrpc": "2.0", "method": "sum", "id": "1"},{"jsonrpc": "2.0", "method"]')[
            "error"
        ]["code"]
        == -32700
    )


SPEC_BATCH = b"""[
  {"jsonrpc": "2.0", "method": "sum", "params": [1,2,4], "id": "1"},
  {"jsonrpc": "2.0", "method"
]
"""


def test_spec_multiline_batch_with_invalid_json_answers_at_once() -> None:
    """The spec's batch example, as the multi-line text it is printed as, is one text as
    soon as its `]` arrives (it can never become valid): a -32700, not a silence."""
    dec = FrameDecoder(10_000)
    lines = SPEC_BATCH.splitlines(keepends=True)
    assert [dec.feed(line) for line in lines[:3]] == [[], [], []]
    frames = dec.feed(lines[3])
    assert frames == [SPEC_BATCH.rstrip(b"\n")]
    assert _run(frames[0]) == {
        "jsonrpc": "2.0",
        "error": {"code": -32700, "message": "Parse error"},
        "id": None,
    }
    # The stream goes on: the next request is read normally.
    assert dec.feed(b'{"jsonrpc": "2.0", "method": "x", "id": 2}\n') == [
        b'{"jsonrpc": "2.0", "method": "x", "id": 2}'
    ]
    # Mismatched closers inside strings do not count; unfinished texts still wait.
    dec = FrameDecoder(10_000)
    assert dec.feed(b'{"a": "]}",\n') == [] and dec.feed(b'"b": [1,\n2]}\n') == [
        b'{"a": "]}",\n"b": [1,\n2]}'
    ]
    assert FrameDecoder(100).feed(b"[1, {]\n") == [b"[1, {]"]


def test_empty_batch_is_single_invalid_request() -> None:
    """[] gets one non-array -32600."""
    out = _run(b"[]")
    assert isinstance(out, dict) and out["error"]["code"] == -32600 and out["id"] is None


def test_batch_of_non_objects() -> None:
    """[1] and [1,2,3] get arrays of -32600, one per member."""
    assert [r["error"]["code"] for r in _run(b"[1]")] == [-32600]
    assert [r["error"]["code"] for r in _run(b"[1,2,3]")] == [-32600] * 3


def test_all_notification_batch_returns_nothing() -> None:
    """A batch of only notifications produces no bytes at all."""
    assert (
        _run(b'[{"jsonrpc":"2.0","method":"a"},{"jsonrpc":"2.0","method":"b","params":[1]}]')
        is None
    )


def test_mixed_batch_keeps_slots() -> None:
    """Valid calls, a notification and invalid members: responses for all but the notification."""
    out = _run(
        b'[{"jsonrpc":"2.0","method":"m","params":[1],"id":"1"},'
        b'{"jsonrpc":"2.0","method":"n","params":{}},'
        b'{"foo":"boo"},'
        b'{"jsonrpc":"2.0","method":"m","params":[2],"id":2},'
        b'{"jsonrpc":"1.0","method":"m","id":3}]'
    )
    assert out == [
        {"jsonrpc": "2.0", "result": [1], "id": "1"},
        {"jsonrpc": "2.0", "error": {"code": -32600, "message": "Invalid Request"}, "id": None},
        {"jsonrpc": "2.0", "result": [2], "id": 2},
        {"jsonrpc": "2.0", "error": {"code": -32600, "message": "Invalid Request"}, "id": 3},
    ]


def test_notification_vs_null_id() -> None:
    """No id member = notification (silent); "id": null is a request answered with id null."""
    assert _run(b'{"jsonrpc":"2.0","method":"m"}') is None
    assert _run(b'{"jsonrpc":"2.0","method":"m","id":null}') == {
        "jsonrpc": "2.0",
        "result": None,
        "id": None,
    }


def test_invalid_params_type_and_id_type() -> None:
    """params must be array/object; id must not be a bool or object."""
    assert _run(b'{"jsonrpc":"2.0","method":"m","params":3,"id":1}')["error"]["code"] == -32600
    assert _run(b'{"jsonrpc":"2.0","method":"m","id":true}')["error"]["code"] == -32600
    assert _run(b'{"jsonrpc":"2.0","method":"m","id":{"a":1}}')["error"]["code"] == -32600


def test_unterminated_string_resyncs_at_newline() -> None:
    """A line with an unclosed string is one bad text; the next line is read normally."""
    frames = FrameDecoder(1000).feed(b'{"jsonrpc": "2.0, "id": 1}\n{"a":1}\n')
    assert frames == [b'{"jsonrpc": "2.0, "id": 1}', b'{"a":1}']
    assert _run(frames[0])["error"]["code"] == -32700


def test_random_garbage_never_raises() -> None:
    """Seeded random bytes (with JSON-ish punctuation) through decoder and parser never raise."""
    rng = random.Random(4)
    alphabet = b'{}[]",:\\\n \t0123456789abcxyz\xff\xc3\x80-.eE'
    for _ in range(300):
        dec = FrameDecoder(256)
        blob = bytes(rng.choice(alphabet) for _ in range(rng.randint(1, 600)))
        for i in range(0, len(blob), 37):
            for frame in dec.feed(blob[i : i + 37]):
                if frame != OVERSIZED:
                    msg = jsonrpc.parse(frame)
                    jsonrpc.encode(msg, [e if isinstance(e, dict) else None for e in msg.entries])
