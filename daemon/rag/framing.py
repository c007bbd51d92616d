"""Byte stream -> JSON texts, sans-I/O (the server feeds it whatever it reads).

Framing: one JSON text per line (NDJSON, ``\\n`` or ``\\r\\n``) is the documented
format, and responses are always written that way. A text starting with ``{``
or ``[`` may also span lines (the seed's pretty-printed ``nc`` example): the
scanner tracks bracket depth outside strings, so a value ends at its closing
bracket whatever the line breaks. Anything else is read up to the newline and
handed on as one (likely invalid) text, so the dispatcher can answer -32700.

A text is handed on as soon as it can no longer become valid JSON, so the
client gets its -32700 at once instead of a silence: a raw newline inside a
string (JSON strings cannot hold one) or a closing bracket that does not match
the open one (the JSON-RPC spec's batch example, ``{"method"`` then ``]``).
What is merely unfinished (an unbalanced ``{``) waits for more lines until it
completes, exceeds ``max_bytes`` or the idle timeout closes the connection.

A text longer than ``max_bytes`` yields :data:`OVERSIZED` once and the decoder
stops: the stream cannot be resynchronized, so the server answers and closes.
"""

from __future__ import annotations

import re
from typing import Final

OVERSIZED: Final = b""  # sentinel frame: never a real text (empty lines are skipped)

_WS = re.compile(rb"[ \t\r\n]*")
_OUTSIDE = re.compile(rb'[{}\[\]"]')
_INSIDE = re.compile(rb'["\\\n]')


class FrameDecoder:
    """Incremental scanner; ``feed`` returns the complete texts found so far."""

    def __init__(self, max_bytes: int) -> None:
        self._max = max_bytes
        self._buf = bytearray()
        self._pos = 0  # scan position
        self._start = -1  # start of the current text, -1 between texts
        self._open = bytearray()  # the brackets still open, innermost last
        self._in_str = False
        self._line_mode = False
        self.broken = False

    @property
    def pending(self) -> int:
        """Bytes of an unfinished text (0 between texts)."""
        return 0 if self._start < 0 else len(self._buf) - self._start

    def feed(self, data: bytes) -> list[bytes]:
        """Consume bytes; return complete texts (or OVERSIZED, after which nothing)."""
        if self.broken:
            return []
        self._buf += data
        frames: list[bytes] = []
        while self._step(frames):
            pass
        if self._start < 0:
            del self._buf[: self._pos]
            self._pos = 0
        elif self._start > 0:
            del self._buf[: self._start]
            self._pos -= self._start
            self._start = 0
        if self.pending > self._max:
            self._fail(frames)
        return frames

    def _fail(self, frames: list[bytes]) -> None:
        frames.append(OVERSIZED)
        self.broken = True
        self._buf.clear()

    def _emit(self, frames: list[bytes], end: int, resume: int) -> None:
        text = bytes(self._buf[self._start : end])
        if len(text) > self._max:
            self._fail(frames)
            return
        frames.append(text)
        self._start, self._pos = -1, resume

    def _step(self, frames: list[bytes]) -> bool:
        """Advance the scanner; False when it needs more bytes (or is broken)."""
        if self.broken:
            return False
        buf = self._buf
        if self._start < 0:
            m = _WS.match(buf, self._pos)
            self._pos = m.end() if m else self._pos
            if self._pos >= len(buf):
                return False
            self._start = self._pos
            self._line_mode = buf[self._pos] not in b"{["
            self._open.clear()
            self._in_str = False
        if self._line_mode:
            nl = buf.find(b"\n", self._pos)
            if nl < 0:
                self._pos = len(buf)
                return False
            self._emit(frames, nl, nl + 1)
            return True
        return self._scan(frames)

    def _scan(self, frames: list[bytes]) -> bool:
        buf = self._buf
        while True:
            m = (_INSIDE if self._in_str else _OUTSIDE).search(buf, self._pos)
            if m is None:
                self._pos = len(buf)
                return False
            i, c = m.start(), buf[m.start()]
            if self._in_str:
                if c == 0x0A:  # a raw newline cannot be inside a JSON string: malformed,
                    self._emit(frames, i, i + 1)  # hand it on (-32700) and resync after it
                    return True
                if c == 0x5C:  # backslash: skip the escaped byte
                    if i + 1 >= len(buf):
                        self._pos = i
                        return False
                    self._pos = i + 2
                    continue
                self._in_str, self._pos = False, i + 1
                continue
            self._pos = i + 1
            if c == 0x22:
                self._in_str = True
            elif c in b"{[":
                self._open.append(c)
            elif self._open.pop() != (0x7B if c == 0x7D else 0x5B):
                self._emit(frames, i + 1, i + 1)  # `{ ... ]`: can never be valid, answer now
                return True
            elif not self._open:
                self._emit(frames, i + 1, i + 1)
                return True
