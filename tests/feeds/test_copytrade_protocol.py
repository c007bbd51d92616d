"""The copy-trade webhook's sans-I/O part: signatures and signal bodies, as bytes."""

from __future__ import annotations

import json

import pytest

from daemon.errors import SignalRejected
from daemon.events import (
    COPYTRADE_SIGNAL_CLOSED,
    COPYTRADE_SIGNAL_OPENED,
    signal_event,
    signal_of,
)
from feeds.copytrade.protocol import SOURCE, parse, sign, verify
from tests.feeds.copytrade_client import SECRET, signal

NOW = 1_764_072_000.0
NONCE = "0123456789abcdef"


def check(body: bytes, *, ts: str = "1764072000", nonce: str = NONCE, sig: str | None = None,
          secret: str = SECRET) -> int:  # fmt: skip
    return verify(
        SECRET,
        ts,
        nonce,
        sign(secret, ts, nonce, body) if sig is None else sig,
        body,
        now_s=NOW,
        skew_s=300,
    )


def test_a_signed_request_verifies_and_gives_its_time() -> None:
    assert check(b'{"a": 1}') == 1_764_072_000
    assert check(b"{}", ts="1764072299") == 1_764_072_299  # inside the skew


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"sig": ""}, "missing X-Marketwake-Signature"),
        ({"ts": ""}, "missing X-Marketwake-Timestamp"),
        ({"ts": "12.5"}, "unix seconds"),
        ({"nonce": "short"}, "16-64"),
        ({"sig": "sha256=XYZ"}, "64 lowercase hex"),
        ({"secret": "someone-elses-secret"}, "bad signature"),
        ({"ts": "1764071600"}, "stale timestamp: +400 s"),
        ({"ts": "1764072400"}, "stale timestamp: -400 s"),
    ],
)
def test_each_bad_header_is_a_401_that_says_which(kwargs: dict[str, str], says: str) -> None:
    with pytest.raises(SignalRejected) as err:
        check(b"{}", **kwargs)
    assert err.value.status == 401 and says in err.value.reason


def test_the_signature_covers_body_time_and_nonce() -> None:
    body = b'{"quantity": 1}'
    good = sign(SECRET, "1764072000", NONCE, body)
    for changed in (
        {"body": b'{"quantity": 9}'},
        {"ts": "1764072001"},
        {"nonce": "0123456789abcdeX"},
    ):
        args = {"body": body, "ts": "1764072000", "nonce": NONCE} | changed
        with pytest.raises(SignalRejected, match="bad signature"):
            verify(SECRET, args["ts"], args["nonce"], good, args["body"], now_s=NOW, skew_s=300)  # type: ignore[arg-type]


def body(**changes: object) -> bytes:
    return json.dumps(signal(**changes)).encode()  # type: ignore[arg-type]


def test_a_valid_signal_becomes_one_event_per_leader_partition() -> None:
    got = parse(body(stopLoss=60000, takeProfit=70000.5, leaderEquity=25000), "alice")
    assert got.leader_equity == 25000.0
    event = signal_event(got, SOURCE, received_ms=1_764_072_000_123)
    assert event.event_id == "copytrade:alice:s1" and event.topic == COPYTRADE_SIGNAL_OPENED
    assert event.partition == "copytrade:alice" and event.ts == "2026-11-25T12:00:00.000Z"
    assert signal_of(event.payload) == got and event.payload["stopLoss"] == 60000
    closed = signal_event(parse(json.dumps(signal("s2", "closed")).encode(), "alice"), SOURCE, 0)
    assert closed.topic == COPYTRADE_SIGNAL_CLOSED and closed.payload["quantity"] is None


@pytest.mark.parametrize(
    ("raw", "status", "says"),
    [
        (b"not json", 400, "not JSON"),
        (b"[1, 2]", 422, "Expected `object`"),
        (body(extra=1), 422, "unknown field `extra`"),
        (body(leader="bob"), 422, "does not match the path's 'alice'"),
        (body(side="buy"), 422, "side must be"),
        (body(quantity=-1), 422, "Expected `float` >"),
        (body(quantity="1"), 422, "Expected `float | null`"),
        (
            body(quantity=None)[:-1] + b', "quantity": 1e400}',
            422,
            "out of range",
        ),
        (body(time="yesterday"), 422, "RFC 3339"),
        (body(signalId="has space"), 422, "signalId"),
        (body(symbol="../etc"), 422, "symbol"),
        (body(equityFraction=0.1), 422, "not both"),
        (body(equityFraction=1.5), 422, "<= 1"),
        (body(leaderEquity=0), 422, "> 0"),
        (body(stopLoss=1e308), 422, "< 1000000000000000.0 - at `$.stopLoss`"),
        (body(price=2e15), 422, "< 1000000000000000.0 - at `$.price`"),
        (body(kind="opened", quantity=None), 422, "needs quantity or equityFraction"),
        (json.dumps(signal("m", "modified")).encode(), 422, "a modified signal changes"),
        (body(kind="flipped"), 422, "kind"),
    ],
)
def test_each_bad_body_is_refused_with_its_reason(raw: bytes, status: int, says: str) -> None:
    with pytest.raises(SignalRejected) as err:
        parse(raw, "alice")
    assert err.value.status == status and says in err.value.reason, err.value.reason
