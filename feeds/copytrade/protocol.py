"""Sans-I/O part of the copy-trade webhook: signatures and the signal body (its bus
event is built by :func:`daemon.events.signal_event`).

A leader POSTs one JSON signal to ``/copytrade/<leader>`` with three headers::

    X-Marketwake-Timestamp: 1764072000            (unix seconds)
    X-Marketwake-Nonce:     4f1c2a9e0b7d4c55a1e3  (16-64 of A-Z a-z 0-9 _ -, new per request)
    X-Marketwake-Signature: sha256=<hex HMAC-SHA256(secret, "<timestamp>.<nonce>." + body)>

The signature covers the time, the nonce and the exact body bytes, so none can
be changed or replayed: a timestamp outside the skew limit is refused, and a
nonce seen before is a replay (the inbox keeps them for twice the limit). The
body is :class:`daemon.events.SignalPayload` (camelCase, unknown members
refused so a typo is an error, not a silently dropped stop-loss).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from typing import Annotated, Final, TypeVar

import msgspec

from daemon.errors import NOT_JSON, SignalRejected
from daemon.events import (
    Amount,
    SignalKind,
    SignalPayload,
    iso_ms,
    parse_iso_ms,
)

SOURCE: Final = "copytrade_webhook"
TIMESTAMP_HEADER: Final = "X-Marketwake-Timestamp"
NONCE_HEADER: Final = "X-Marketwake-Nonce"
SIGNATURE_HEADER: Final = "X-Marketwake-Signature"
_NONCE: Final = re.compile(r"^[A-Za-z0-9_-]{16,64}$")
_SIGNATURE: Final = re.compile(r"^sha256=([0-9a-f]{64})$")
_ID = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")]
_SYMBOL = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,31}$")]
_POSITIVE = Amount  # an intent's bound: a signal that passes can become an order
T = TypeVar("T")


class _WireSignal(msgspec.Struct, kw_only=True, rename="camel", forbid_unknown_fields=True):
    """The body as sent: the payload's fields, checked for shape and range."""

    leader: str
    signal_id: _ID
    kind: SignalKind
    position_id: _ID
    symbol: _SYMBOL
    side: str
    time: str
    quantity: _POSITIVE | None = None
    equity_fraction: Annotated[float, msgspec.Meta(gt=0, le=1)] | None = None
    price: _POSITIVE | None = None
    stop_loss: _POSITIVE | None = None
    take_profit: _POSITIVE | None = None
    leader_equity: _POSITIVE | None = None


_decoder = msgspec.json.Decoder(_WireSignal)


def sign(secret: str, timestamp: str, nonce: str, body: bytes) -> str:
    """The ``X-Marketwake-Signature`` value a leader sends (for senders and tests)."""
    mac = hmac.new(secret.encode(), f"{timestamp}.{nonce}.".encode() + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def verify(
    secret: str,
    timestamp: str | None,
    nonce: str | None,
    signature: str | None,
    body: bytes,
    *,
    now_s: float,
    skew_s: float,
) -> int:
    """Check the three headers against ``body``; the request's unix time, or
    :exc:`SignalRejected` (401) saying which check failed."""
    for name, value in (
        (TIMESTAMP_HEADER, timestamp),
        (NONCE_HEADER, nonce),
        (SIGNATURE_HEADER, signature),
    ):
        if not value:
            raise SignalRejected(401, f"missing {name} header")
    assert timestamp is not None and nonce is not None and signature is not None
    if not timestamp.isascii() or not timestamp.isdigit() or len(timestamp) > 12:
        raise SignalRejected(401, f"{TIMESTAMP_HEADER} must be unix seconds")
    if not _NONCE.match(nonce):
        raise SignalRejected(401, f"{NONCE_HEADER} must be 16-64 of A-Z a-z 0-9 _ -")
    if not _SIGNATURE.match(signature):
        raise SignalRejected(401, f"{SIGNATURE_HEADER} must be sha256=<64 lowercase hex>")
    if not hmac.compare_digest(sign(secret, timestamp, nonce, body), signature):
        raise SignalRejected(401, "bad signature (HMAC-SHA256 of '<timestamp>.<nonce>.' + body)")
    sent = int(timestamp)
    if abs(now_s - sent) > skew_s:
        raise SignalRejected(
            401, f"stale timestamp: {now_s - sent:+.0f} s from our clock (limit {skew_s:g} s)"
        )
    return sent


def decode_body(decoder: msgspec.json.Decoder[T], body: bytes, what: str) -> T:
    """``body`` decoded; :exc:`SignalRejected` 400 for what is not JSON, 422 for JSON
    that breaks the schema (the message names ``what`` and the field)."""
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise SignalRejected(422, f"invalid {what}: {exc}") from None
    except NOT_JSON as exc:
        raise SignalRejected(400, f"body is not JSON: {exc}") from None


def parse(body: bytes, leader: str) -> SignalPayload:
    """The signal in ``body`` from ``leader`` (the path's); :exc:`SignalRejected`
    400 for what is not a JSON object, 422 for a signal that breaks the schema."""
    wire = decode_body(_decoder, body, "signal")
    if wire.leader != leader:
        raise SignalRejected(422, f"leader {wire.leader!r} does not match the path's {leader!r}")
    if wire.side not in ("long", "short"):
        raise SignalRejected(422, f"side must be 'long' or 'short' (got {wire.side!r})")
    try:
        at = parse_iso_ms(wire.time)
    except ValueError:
        raise SignalRejected(422, f"time must be RFC 3339 (got {wire.time!r})") from None
    sized = wire.quantity is not None or wire.equity_fraction is not None
    if wire.quantity is not None and wire.equity_fraction is not None:
        raise SignalRejected(422, "give quantity or equityFraction, not both")
    if wire.kind == "opened" and not sized:
        raise SignalRejected(422, "an opened signal needs quantity or equityFraction")
    if wire.kind == "modified" and not (sized or wire.stop_loss or wire.take_profit or wire.price):
        raise SignalRejected(
            422, "a modified signal changes quantity, equityFraction, price, stopLoss or takeProfit"
        )
    return SignalPayload(
        leader=wire.leader,
        signal_id=wire.signal_id,
        kind=wire.kind,
        position_id=wire.position_id,
        symbol=wire.symbol,
        side="long" if wire.side == "long" else "short",
        time=iso_ms(at),
        quantity=wire.quantity,
        equity_fraction=wire.equity_fraction,
        price=wire.price,
        stop_loss=wire.stop_loss,
        take_profit=wire.take_profit,
        leader_equity=wire.leader_equity,
    )
