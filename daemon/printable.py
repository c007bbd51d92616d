"""Text that others wrote (hooks, models, webhooks), made safe for an operator's terminal.

A hook's reason or error, a model's answer or a leader's signal can hold escape
sequences (clear the screen, recolour, set the window title) or a line break
followed by a line that looks like another agent's. Everything the CLI prints
from such text goes through :func:`visible` or :func:`visible_lines`.
"""

from __future__ import annotations

import unicodedata

# Invisible or layout-changing characters beyond the C0/C1 controls: line and paragraph
# separators and the bidi overrides/isolates that can reorder what a terminal shows.
_INVISIBLE = frozenset("\u2028\u2029\u200e\u200f") | frozenset(
    chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))
)


def _hidden(ch: str) -> bool:
    """Whether ``ch`` would act on a terminal or hide there (spaces of any width are
    shown as they are)."""
    return ch in _INVISIBLE or (not ch.isprintable() and unicodedata.category(ch) != "Zs")


def visible(text: str) -> str:
    """``text`` with every control or layout character escaped visibly (``\\x1b``,
    ``\\n``, ``\\u202e``): hook-controlled strings can then neither move the cursor,
    recolour the terminal nor forge a line that looks like another agent's."""
    if text.isprintable() and not _INVISIBLE.intersection(text):
        return text
    return "".join(
        ch.encode("unicode_escape").decode("ascii") if _hidden(ch) else ch for ch in text
    )


def visible_lines(text: str) -> str:
    """:func:`visible` for text of several lines: its own line breaks and tabs stay,
    so the caller's layout does; a carriage return, an escape or a bidi override in
    any line is shown, not obeyed."""
    return "\n".join(
        "\t".join(visible(cell) for cell in line.split("\t")) for line in text.split("\n")
    )


def _json_escape(ch: str) -> str:
    code = ord(ch)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000  # a UTF-16 surrogate pair, as JSON spells a character past the BMP
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def visible_json(text: str) -> str:
    """JSON text (one document, maybe indented) with every character :func:`visible`
    would escape spelled as a JSON ``\\u`` escape: the same JSON for a parser, harmless
    on a terminal. Outside its strings JSON holds only printable ASCII and layout
    whitespace, so only string contents change."""
    plain = text.replace("\n", "").replace("\t", "")
    if plain.isprintable() and not _INVISIBLE.intersection(plain):
        return text
    return "".join(_json_escape(ch) if ch not in "\n\t" and _hidden(ch) else ch for ch in text)
