"""The restricted-execution policy: compile rules, guards, builtins and imports.

RestrictedPython only rewrites attribute, item, iteration, write and print
operations into calls to the guards defined here; everything that matters is
the host policy (research/sandbox.md §0-1). The rules:

* classes are rejected at compile time (no metaclass tricks, no ``__build_class__``);
* ``_getattr_`` raises, requires an exact ``str`` name, refuses ``_`` names,
  frame/generator internals and ``format``/``format_map``/``mro``, refuses to
  read attributes of (or return) modules, frames, code and tracebacks;
* imports resolve only to curated, immutable :class:`Namespace` objects, never
  to real modules, and never ``operator`` or ``string``;
* writes go through ``full_write_guard`` (only ``dict``/``list`` are writable);
* ``print`` goes to a size-capped collector, never to a file descriptor.
"""

from __future__ import annotations

import ast
import builtins
import datetime as _datetime
import decimal
import importlib
import math
import operator
import random
import statistics
import types
from collections.abc import Callable, Iterable
from typing import Any, Final

from RestrictedPython.compile import compile_restricted_exec
from RestrictedPython.Guards import (
    full_write_guard,
    guarded_iter_unpack_sequence,
    guarded_unpack_sequence,
)
from RestrictedPython.transformer import INSPECT_ATTRIBUTES, RestrictingNodeTransformer

from daemon.errors import HookCompileError


class HookPolicy(RestrictingNodeTransformer):
    """RestrictedPython's transformer, minus classes (hooks do not need them) and minus
    imports of private modules (``import _x as y`` and ``from _x import y`` compile in
    stock RestrictedPython; only ``_strptime`` would resolve, but nothing should)."""

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.AST:
        self.error(node, "class definitions are not allowed in hooks")
        return node

    def visit_Import(self, node: ast.Import) -> ast.AST | Iterable[ast.AST] | None:
        for alias in node.names:
            self._check_module(node, alias.name)
        return super().visit_Import(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> ast.AST | Iterable[ast.AST] | None:
        self._check_module(node, node.module or "")
        return super().visit_ImportFrom(node)

    def _check_module(self, node: ast.AST, name: str) -> None:
        if any(part.startswith("_") for part in name.split(".")):
            self.error(node, f'import of private module "{name}" is not allowed')


def compile_hook(source: str, filename: str, max_source_bytes: int) -> types.CodeType:
    """Compile hook source under the policy; every failure is a HookCompileError."""
    if len(source) > max_source_bytes or len(source.encode("utf-8")) > max_source_bytes:
        raise HookCompileError(f"source is larger than {max_source_bytes} bytes")
    try:
        result = compile_restricted_exec(source, filename=filename, policy=HookPolicy)
    except (SyntaxError, ValueError, RecursionError, MemoryError, TypeError) as exc:
        raise HookCompileError(f"{type(exc).__name__}: {exc}") from None
    if result.errors or result.code is None:
        raise HookCompileError("; ".join(result.errors) or "compile produced no code")
    code: types.CodeType = result.code
    return code


# --- curated namespaces -----------------------------------------------------


class Namespace:
    """An immutable bag of allowed names, standing in for a module."""

    __slots__ = ("_members", "_name")

    def __init__(self, name: str, members: dict[str, Any]) -> None:
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_members", types.MappingProxyType(dict(members)))

    def __getattr__(self, attr: str) -> Any:
        try:
            return self._members[attr]
        except KeyError:
            raise AttributeError(f"{self._name} has no attribute {attr!r}") from None

    def __setattr__(self, attr: str, value: Any) -> None:
        raise TypeError(f"{self._name} is read-only")

    def __delattr__(self, attr: str) -> None:
        raise TypeError(f"{self._name} is read-only")

    def __repr__(self) -> str:
        return f"<namespace {self._name}>"

    def names(self) -> list[str]:
        """The public members, for documentation and tests."""
        return sorted(self._members)


def _pick(module: Any, names: str) -> dict[str, Any]:
    return {n: getattr(module, n) for n in names.split()}


MATH: Final = Namespace(
    "math",
    _pick(
        math,
        "acos asin atan atan2 ceil copysign cos cosh degrees dist e exp expm1 fabs floor "
        "fmod fsum hypot inf isclose isfinite isinf isnan log log10 log1p log2 modf nan pi "
        "radians remainder sin sinh sqrt tan tanh tau trunc",
    ),
)
STATISTICS: Final = Namespace(
    "statistics",
    _pick(
        statistics,
        "StatisticsError correlation covariance fmean geometric_mean harmonic_mean "
        "linear_regression mean median median_high median_low mode multimode pstdev "
        "pvariance quantiles stdev variance",
    ),
)
DATETIME: Final = Namespace(
    "datetime",
    {**_pick(_datetime, "date datetime time timedelta timezone"), "UTC": _datetime.UTC},
)
DECIMAL: Final = Namespace(
    "decimal",
    _pick(
        decimal,
        "Decimal DecimalException DivisionByZero InvalidOperation ROUND_CEILING ROUND_DOWN "
        "ROUND_FLOOR ROUND_HALF_DOWN ROUND_HALF_EVEN ROUND_HALF_UP ROUND_UP localcontext",
    ),
)
_RANDOM_NAMES: Final = "choice gauss randint random randrange sample shuffle uniform"
_FIXED_IMPORTS: Final = {"math": MATH, "statistics": STATISTICS, "datetime": DATETIME}
_FIXED_IMPORTS["decimal"] = DECIMAL
ALLOWED_IMPORTS: Final = (*sorted(_FIXED_IMPORTS), "random")


_STRPTIME: Final = importlib.import_module("_strptime")


class Importer:
    """A hook's ``__import__``: curated namespaces only; ``random`` is seeded from
    (revision, eventId) so replays decide like live runs."""

    __slots__ = ("event_id", "revision")

    def __init__(self, revision: str, event_id: Any) -> None:
        self.revision = revision
        self.event_id = event_id

    def __call__(
        self, name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0
    ) -> Any:
        if level != 0 or type(name) is not str:
            raise ImportError("relative imports are not allowed in hooks")
        ns = _FIXED_IMPORTS.get(name)
        if ns is not None:
            return ns
        if name == "random":
            rng = random.Random(f"{self.revision}:{self.event_id}")
            return Namespace("random", _pick(rng, _RANDOM_NAMES))
        if name == "_strptime" and not fromlist:
            # datetime.strptime's C code imports this through the *caller's*
            # __import__ (HA #132469; 3.11 caches it after the worker's warm-up
            # call, 3.12+ asks every time). HookPolicy rejects the name in source.
            return _STRPTIME
        raise ImportError(f"import of {name!r} is not allowed (allowed: {ALLOWED_IMPORTS})")


def make_import(seed: str) -> Importer:
    """An importer whose ``random`` is seeded from ``seed`` (tests, tools)."""
    return Importer(seed, None)


# --- guards ------------------------------------------------------------------

_OPAQUE: Final = (types.ModuleType, types.FrameType, types.CodeType, types.TracebackType)
# Types that are never opaque: checked first because isinstance on a tuple is slower.
_PLAIN: Final = frozenset(
    {str, int, float, bool, type(None), dict, list, tuple, types.MappingProxyType}
)
_BLOCKED_NAMES: Final = frozenset(INSPECT_ATTRIBUTES) | {"format", "format_map", "mro"}
_MISSING: Final = object()


def guarded_getattr(obj: Any, name: Any, default: Any = _MISSING) -> Any:
    """``a.b`` and ``getattr(a, b)``: raising, exact-str, refusing opaque objects."""
    if type(name) is not str:
        raise TypeError("attribute name must be a str")
    if name.startswith("_") or name in _BLOCKED_NAMES:
        raise AttributeError(f"access to attribute {name!r} is not allowed")
    if type(obj) not in _PLAIN and isinstance(obj, _OPAQUE):
        raise AttributeError(f"attributes of {type(obj).__name__} objects are not accessible")
    if type(obj) is Namespace:
        value = obj._members.get(name, _MISSING)
        if value is _MISSING:
            if default is not _MISSING:
                return default
            raise AttributeError(f"{obj._name} has no attribute {name!r}")
        return value
    try:
        value = getattr(obj, name)
    except AttributeError:
        if default is not _MISSING:
            return default
        raise AttributeError(f"{type(obj).__name__!s} has no attribute {name!r}") from None
    if type(value) not in _PLAIN and isinstance(value, _OPAQUE):
        raise AttributeError(f"{name!r} refers to a {type(value).__name__}, not accessible")
    return value


def guarded_getitem(obj: Any, key: Any) -> Any:
    """``a[b]``: plain item access, but never hands out a module, frame or code object."""
    value = obj[key]
    if type(value) not in _PLAIN and isinstance(value, _OPAQUE):
        raise TypeError(f"item refers to a {type(value).__name__}, not accessible")
    return value


_INPLACE: Final[dict[str, Callable[[Any, Any], Any]]] = {
    "+=": operator.iadd,
    "-=": operator.isub,
    "*=": operator.imul,
    "/=": operator.itruediv,
    "//=": operator.ifloordiv,
    "%=": operator.imod,
    "**=": operator.ipow,
    "|=": operator.ior,
    "&=": operator.iand,
    "^=": operator.ixor,
    "<<=": operator.ilshift,
    ">>=": operator.irshift,
}
_INPLACE_TYPES: Final = (int, float, bool, str, list, tuple, decimal.Decimal)


def guarded_inplacevar(op: str, x: Any, y: Any) -> Any:
    """``x op= y`` on names, for numbers, str, list and tuple only."""
    fn = _INPLACE.get(op)
    if fn is None:
        raise TypeError(f"operator {op} is not allowed")
    if type(x) not in _INPLACE_TYPES:
        raise TypeError(f"{op} is not allowed on {type(x).__name__}")
    return fn(x, y)


def guarded_apply(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``f(*a, **k)``."""
    return fn(*args, **kwargs)


class OutputBuffer:
    """Collects print() output of one evaluation, up to a character cap."""

    __slots__ = ("cap", "parts", "size", "truncated")

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.parts: list[str] = []
        self.size = 0
        self.truncated = False

    def write(self, text: str) -> None:
        """Append ``text``; past the cap it is dropped and a marker is added."""
        room = self.cap - self.size
        if len(text) > room:
            self.truncated = True
            text = text[: max(room, 0)]
        if text:
            self.parts.append(text)
            self.size += len(text)

    def text(self) -> str:
        """Everything printed so far."""
        return "".join(self.parts) + ("…[truncated]" if self.truncated else "")

    def collector(self, _getattr_: Any = None) -> _Collector:
        """The ``_print_`` factory RestrictedPython calls once per function."""
        return _Collector(self)


class _Collector:
    """What ``_print`` is inside a restricted function: never touches a file."""

    __slots__ = ("out",)

    def __init__(self, out: OutputBuffer) -> None:
        self.out = out

    def _call_print(self, *objects: Any, sep: Any = " ", end: Any = "\n", **_kw: Any) -> None:
        self.out.write(str(sep).join([str(o) for o in objects]) + str(end))

    def __call__(self) -> str:
        return self.out.text()


def _checked_sorted(iterable: Any, *, key: Any = None, reverse: bool = False) -> list[Any]:
    return sorted(iterable, key=key, reverse=bool(reverse))


_BUILTIN_NAMES: Final = (
    "abs all any bool callable chr dict divmod enumerate filter float frozenset hex int "
    "isinstance issubclass iter len list map max min next oct ord pow range repr reversed "
    "round set slice str sum tuple zip ArithmeticError AssertionError AttributeError "
    "Exception IndexError KeyError LookupError OverflowError RuntimeError StopIteration "
    "TypeError ValueError ZeroDivisionError"
)
SAFE_BUILTINS: Final[dict[str, Any]] = {
    **_pick(builtins, _BUILTIN_NAMES),
    "None": None,
    "True": True,
    "False": False,
    "sorted": _checked_sorted,
    "getattr": guarded_getattr,
}


def fresh_globals(hook_name: str, importer: Importer, out: OutputBuffer) -> dict[str, Any]:
    """The globals one evaluation runs in: new dicts every time, nothing shared mutable."""
    b = dict(SAFE_BUILTINS)
    b["__import__"] = importer
    return {
        "__builtins__": b,
        "__name__": hook_name,
        "_getattr_": guarded_getattr,
        "_getitem_": guarded_getitem,
        "_getiter_": iter,
        "_iter_unpack_sequence_": guarded_iter_unpack_sequence,
        "_unpack_sequence_": guarded_unpack_sequence,
        "_write_": full_write_guard,
        "_inplacevar_": guarded_inplacevar,
        "_apply_": guarded_apply,
        "_print_": out.collector,
    }


_LEAVES: Final = frozenset({str, int, float, bool, type(None)})
_BRANCHES: Final = (dict, list)


def freeze(value: Any) -> Any:
    """A read-only deep view of decoded JSON data: dicts become mapping proxies, lists
    tuples. Takes ownership: nested dicts are updated in place, not copied (the worker
    owns what it just decoded), and all-scalar containers are wrapped at C speed."""
    t = type(value)
    if t is dict:
        if not _LEAVES.issuperset(map(type, value.values())):
            for k, v in value.items():
                if type(v) in _BRANCHES:
                    value[k] = freeze(v)
        return types.MappingProxyType(value)
    if t is list:
        if _LEAVES.issuperset(map(type, value)):
            return tuple(value)
        return tuple([freeze(v) if type(v) in _BRANCHES else v for v in value])
    return value
