"""Seeded mutations of valid JSON values, for the parsers that read what others send.

Each mutation replaces a leaf with an odd value (0, -1, 2**64, "nan", "1e309", "",
a long string, a control character, a container), drops a key or adds one, or
repeats a list item, one to three times. A parser must refuse such input with
our own error (:class:`daemon.errors.MarketwakeError`), never another exception,
and never pass on a value a later stage would take at its word (a price of 0).
"""

from __future__ import annotations

import copy
import random
from collections.abc import Iterator, Sequence
from typing import Any

ODD: tuple[Any, ...] = (
    None, True, False, 0, -1, 2**64, -(2**63), 1e308, -0.0, 1.5, "", "nan", "NaN", "inf",
    "-inf", "1e309", "0x10", " 1", "-5", "0", "1e-400", "\x1b[2J", "\u202e", "é" * 3,
    "x" * 5000, [], {}, [[[[]]]], {"a": {}}, "2026-13-45T99:99:99Z", "1970-01-01T00:00:00Z",
    "9999-12-31T23:59:59.999999999Z",
)  # fmt: skip


def mutations(samples: Sequence[Any], n: int, seed: int) -> Iterator[Any]:
    """``n`` mutated copies of values drawn from ``samples`` (deterministic per ``seed``)."""
    rnd = random.Random(seed)
    for _ in range(n):
        value = copy.deepcopy(rnd.choice(samples))
        for _ in range(rnd.randint(1, 3)):
            value = _mutate(value, rnd)
        yield value


def _mutate(value: Any, rnd: random.Random) -> Any:
    roll = rnd.random()
    if isinstance(value, dict) and value:
        key = rnd.choice(list(value))
        if roll < 0.1:
            del value[key]
        elif roll < 0.15:
            value[f"zz{rnd.randint(0, 9)}"] = copy.deepcopy(rnd.choice(ODD))
        else:
            value[key] = _mutate(value[key], rnd)
        return value
    if isinstance(value, list) and value:
        i = rnd.randrange(len(value))
        if roll < 0.1:
            del value[i]
        elif roll < 0.15:
            value.append(copy.deepcopy(value[i]))
        else:
            value[i] = _mutate(value[i], rnd)
        return value
    return copy.deepcopy(rnd.choice(ODD))
