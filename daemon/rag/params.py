"""``rag.query_patterns`` params: the seed's JSON Schema as msgspec Structs.

Validation failures become -32602 listing every invalid field in
``error.data.errors`` (dotted paths, e.g. ``current_state.rsi_7``, each with a
reason; ``error.data.field`` is the first), so a client fixes a request in one
round trip. Beyond the
seed's schema: unknown members are rejected (a typo in ``query_config`` must
not silently fall back to a default), numbers must be finite and within bounds
far beyond any real market (a 1e308 price is -32602, not a NaN in the math),
and the values we divide by (price, EMAs, the 24 h OI average) must be > 0.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

import msgspec

from daemon.errors import RpcError
from daemon.events import MAX_AMOUNT, Amount

INVALID_PARAMS = -32602

# Finite is not enough: 1e308 is finite and meaningless as a price. Bounds far beyond
# any real market keep the arithmetic (deltas, squares in the embedding) finite.
Positive = Annotated[float, msgspec.Meta(gt=0, lt=1e12)]
NonNegative = Annotated[float, msgspec.Meta(ge=0, lt=MAX_AMOUNT)]
Percent = Annotated[float, msgspec.Meta(ge=0, le=100)]
Signed = Annotated[float, msgspec.Meta(gt=-1e12, lt=1e12)]
# Funding is a fraction per interval (real values are within +-0.01).
Funding = Annotated[float, msgspec.Meta(ge=-1, le=1)]
Change = Annotated[float, msgspec.Meta(ge=-100, le=100_000)]  # percent


class _Strict(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class CurrentState(msgspec.Struct, frozen=True, kw_only=True):
    """The seed's market snapshot; members it does not define are ignored (the seed's
    workflow passes a whole snapshot) and listed in ``metadata.ignored_fields``."""

    price: Positive
    rsi_7: Percent
    rsi_14: Percent
    macd: Signed
    ema_20: Positive
    ema_20_4h: Positive
    ema_50_4h: Positive
    funding_rate: Funding
    open_interest_latest: NonNegative
    open_interest_avg_24h: Amount
    price_change_1h: Change | None = None
    price_change_4h: Change | None = None


class QueryConfig(_Strict, frozen=True):
    lookback_days: Annotated[float, msgspec.Meta(ge=1, le=365)] | None = None
    # The seed types these as numbers: 5.0 is 5 (a fraction is -32602, see parse_params).
    top_k: Annotated[float, msgspec.Meta(ge=1, le=50)] | None = None
    min_similarity: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] | None = None
    include_regime_filters: bool | None = None
    # Not in the seed's params (server config there, or ours): per-query overrides.
    min_matches: Annotated[float, msgspec.Meta(ge=0, le=50)] | None = None
    min_gap_hours: Annotated[float, msgspec.Meta(ge=0, le=24 * 365)] | None = None


class QueryParams(_Strict, frozen=True):
    symbol: Annotated[str, msgspec.Meta(pattern="^[A-Z]+USDT$", max_length=16)]
    # Epoch ms; the upper bound (year ~33658) keeps it a sane int64.
    timestamp: Annotated[float, msgspec.Meta(ge=0, le=1e15)]
    current_state: CurrentState
    query_config: QueryConfig | None = None
    # Checked by the server when rag.server.api_key is set; ignored in-process.
    api_key: str | None = None


_AT = re.compile(r"^(?P<msg>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_FIELD = re.compile(r"(?:missing required|contains unknown) field `([^`]+)`")


def _field_of(text: str) -> tuple[str, str]:
    """(dotted field, reason) from a msgspec validation message."""
    m = _AT.match(text)
    msg = m.group("msg") if m else text
    path = (m.group("path") or "") if m else ""
    parts = [p for p in re.split(r"\.|\[(\d+)\]", path) if p]
    named = _FIELD.search(msg)
    if named:
        parts.append(named.group(1))
    return ".".join(parts) or "params", msg


def invalid(field: str, reason: str, more: list[tuple[str, str]] | None = None) -> RpcError:
    """The -32602 error naming ``field`` first, then every other problem found."""
    problems = [(field, reason), *(more or [])]
    return RpcError(
        INVALID_PARAMS,
        "Invalid params",
        {
            "field": field,
            "reason": reason,
            "errors": [{"field": f, "reason": r} for f, r in problems],
        },
    )


_WHOLE = frozenset({"query_config.top_k", "query_config.min_matches"})


def _struct_type(typ: Any) -> type[msgspec.Struct] | None:
    """The Struct class of ``typ`` (or of ``Struct | None``)."""
    for t in (typ, *getattr(typ, "__args__", ())):
        if isinstance(t, type) and issubclass(t, msgspec.Struct):
            return t
    return None


def _leaf(value: Any, typ: Any, path: str) -> list[tuple[str, str]]:
    try:
        out = msgspec.convert(value, typ)
    except msgspec.ValidationError as exc:
        return [(path, _field_of(str(exc))[1])]
    if isinstance(out, float) and not math.isfinite(out):
        return [(path, "must be a finite number")]
    if path in _WHOLE and isinstance(out, float) and out != int(out):
        return [(path, "must be a whole number")]
    return []


def problems(value: Any, typ: Any = None, path: str = "") -> list[tuple[str, str]]:
    """Every (dotted field, reason) wrong in raw params, field by field.

    msgspec stops at the first error; this walks the Structs' fields and checks
    each member on its own. Only run once a request has failed (it is slower).
    """
    struct = _struct_type(QueryParams if typ is None else typ)
    if struct is None:
        return _leaf(value, typ, path)
    if value is None and typ is not None and struct is not typ:
        return []  # an optional Struct member sent as null
    if not isinstance(value, dict):
        return [(path or "params", "must be an object")]
    prefix = f"{path}." if path else ""
    fields = {f.encode_name: f for f in msgspec.structs.fields(struct)}
    out: list[tuple[str, str]] = []
    if struct.__struct_config__.forbid_unknown_fields:
        out += [(f"{prefix}{k}", "unknown field") for k in value if k not in fields]
    for name, f in fields.items():
        if name in value:
            out += problems(value[name], f.type, f"{prefix}{name}")
        elif f.required:
            out.append((f"{prefix}{name}", "missing required field"))
    return out


def ignored_fields(params: Any) -> list[str]:
    """``current_state`` members the seed does not define (ignored, and said so)."""
    state = params.get("current_state") if isinstance(params, dict) else None
    if not isinstance(state, dict):
        return []
    return sorted(str(k) for k in state if k not in CurrentState.__struct_fields__)


def _checks(parsed: QueryParams) -> list[tuple[str, str]]:
    """What the Struct types cannot say: finite numbers, whole counts."""
    out = [
        (f"current_state.{name}", "must be a finite number")
        for name in CurrentState.__struct_fields__
        if isinstance(v := getattr(parsed.current_state, name), float) and not math.isfinite(v)
    ]
    qc = parsed.query_config
    for name in ("top_k", "min_matches"):
        value = getattr(qc, name) if qc is not None else None
        if value is not None and value != int(value):
            out.append((f"query_config.{name}", "must be a whole number"))
    if not math.isfinite(parsed.timestamp):
        out.append(("timestamp", "must be a finite number"))
    return out


def parse_params(params: Any) -> QueryParams:
    """Validate raw params (a dict from JSON, or an in-process dict/QueryParams)."""
    if isinstance(params, QueryParams):
        parsed = params
    elif not isinstance(params, dict):
        raise invalid("params", "params must be an object")
    else:
        try:
            parsed = msgspec.convert(params, QueryParams)
        except msgspec.ValidationError as exc:
            found = problems(params) or [_field_of(str(exc))]
            raise invalid(*found[0], found[1:]) from None
    found = _checks(parsed)
    if found:
        raise invalid(*found[0], found[1:])
    return parsed
