"""Exact-type validation of a hook's result, run in the worker and again in the daemon.

The checked dict is then converted to its typed Decision (see ``decisions``).

``isinstance`` is not enough: a ``dict`` subclass can override ``items()`` and a
``str`` subclass can make ``==`` lie. Only the exact JSON types pass, floats
must be finite, and depth and size are capped. The daemon's check (after msgpack
decoding) is the authoritative one.
"""

from __future__ import annotations

import math
from typing import Any, Final

from daemon.errors import HookResultInvalid
from hooks_runtime.decisions import ALLOWED_DECISIONS, Decision, to_decision

MAX_DEPTH: Final = 32
INT_MIN: Final = -(2**63)
INT_MAX: Final = 2**63 - 1
_SCALARS: Final = (str, int, float, bool, type(None))


def _check_json(value: Any, depth: int, budget: list[int], where: str) -> None:
    """Recursive exact-type walk; ``budget`` counts down approximate encoded bytes."""
    t = type(value)
    if depth > MAX_DEPTH:
        raise HookResultInvalid(f"{where}: nested deeper than {MAX_DEPTH} levels")
    budget[0] -= 8
    if t is str:
        budget[0] -= len(value)
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise HookResultInvalid(f"{where}: string is not valid UTF-8") from None
    elif t is float:
        if not math.isfinite(value):
            raise HookResultInvalid(f"{where}: number is not finite ({value!r})")
    elif t is int:
        if not INT_MIN <= value <= INT_MAX:
            raise HookResultInvalid(f"{where}: integer outside the 64-bit range")
    elif t is dict:
        for k, v in value.items():
            if type(k) is not str:
                raise HookResultInvalid(f"{where}: dict key {type(k).__name__} is not a str")
            budget[0] -= len(k)
            _check_json(v, depth + 1, budget, f"{where}.{k}")
    elif t is list:
        for i, v in enumerate(value):
            _check_json(v, depth + 1, budget, f"{where}[{i}]")
    elif t not in _SCALARS:
        raise HookResultInvalid(f"{where}: {t.__name__} is not a JSON type")
    if budget[0] < 0:
        raise HookResultInvalid(f"{where}: result is larger than the size cap")


class _Bad(Exception):
    """Fast scan found a problem; the slow walk names it."""


def _scan(value: Any, depth: int, budget: int) -> int:
    """The hot path: same rules as :func:`_check_json` without building paths."""
    t = type(value)
    if t is str:
        if not value.isascii():
            value.encode("utf-8")
        return budget - 8 - len(value)
    if t is dict:
        if depth >= MAX_DEPTH:
            raise _Bad
        budget -= 8
        for k, v in value.items():
            if type(k) is not str:
                raise _Bad
            if type(v) is str and v.isascii():  # most values: no call
                budget -= 8 + len(k) + len(v)
            else:
                budget = _scan(v, depth + 1, budget - len(k))
    elif t is list:
        if depth >= MAX_DEPTH:
            raise _Bad
        budget -= 8
        for v in value:
            budget = _scan(v, depth + 1, budget)
    elif t is float:
        if not math.isfinite(value):
            raise _Bad
        budget -= 8
    elif t is int:
        if not INT_MIN <= value <= INT_MAX:
            raise _Bad
        budget -= 8
    elif t in _SCALARS:
        budget -= 8
    else:
        raise _Bad
    if budget < 0:
        raise _Bad
    return budget


def check_result(value: Any, kind: str, max_bytes: int) -> dict[str, Any]:
    """The exact-type and size checks of :func:`validate_result`, without building the
    Decision: the worker's check (the daemon converts, and names a bad decision)."""
    if kind not in ALLOWED_DECISIONS:
        raise HookResultInvalid(f"unknown hook kind {kind!r}")
    if type(value) is not dict:
        raise HookResultInvalid(f"evaluate() must return a dict, not {type(value).__name__}")
    try:
        _scan(value, 0, max_bytes)
    except (_Bad, UnicodeEncodeError, RecursionError):
        _check_json(value, 0, [max_bytes], "result")
        raise HookResultInvalid("result is not plain JSON data") from None
    return value


def validate_result(value: Any, kind: str, max_bytes: int) -> Decision:
    """Return ``value`` as a typed Decision, or raise :exc:`HookResultInvalid`."""
    return to_decision(check_result(value, kind, max_bytes), kind)
