"""A leader's side of the copy-trade webhook, for tests: signed requests on loopback."""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

import aiohttp

from feeds.copytrade.protocol import NONCE_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER, sign

SECRET = "alice-secret-0123456789"


def signal(signal_id: str = "s1", kind: str = "opened", **extra: Any) -> dict[str, Any]:
    """A valid body (the documented example), changed by ``extra``."""
    body: dict[str, Any] = {
        "leader": "alice",
        "signalId": signal_id,
        "kind": kind,
        "positionId": "p1",
        "symbol": "BTC-USD",
        "side": "long",
        "time": "2026-11-25T12:00:00.000Z",
    }
    if kind == "opened":
        body["quantity"] = 0.5
    body.update(extra)
    return body


def signed_headers(
    body: bytes, secret: str = SECRET, *, at: float | None = None, nonce: str | None = None
) -> dict[str, str]:
    """The three headers a leader sends with ``body``."""
    ts = str(int(time.time() if at is None else at))
    nonce = nonce or secrets.token_hex(12)
    return {
        TIMESTAMP_HEADER: ts,
        NONCE_HEADER: nonce,
        SIGNATURE_HEADER: sign(secret, ts, nonce, body),
        "content-type": "application/json",
    }


async def post(
    url: str, body: bytes | dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    """POST ``body`` (signed unless ``headers`` are given); the status and JSON answer."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with (
        aiohttp.ClientSession() as s,
        s.post(url, data=raw, headers=signed_headers(raw) if headers is None else headers) as r,
    ):
        return r.status, await r.json()
