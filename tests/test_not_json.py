"""Bytes that are JSON but for a string that is not UTF-8 (a hostile peer, a line a
kill tore inside a character): msgspec raises UnicodeDecodeError for them, which
is no DecodeError. Every parser of outside bytes answers them as it answers bytes
that are not JSON, and none lets the exception through."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from daemon.audit.reader import parse_line
from daemon.errors import FeedError, FeedProtocolError, HookCrashed, SignalRejected
from daemon.tools import dflow, news
from feeds.candles import protocol as candles
from feeds.copytrade import protocol as copytrade
from feeds.movers import protocol as movers
from hooks_runtime.protocol import decode_from_worker

# A string cut inside a two-byte character, and two bytes that start none.
TORN = '{"leader":"al\u00e9'.encode()[:-1] + b'"}'
BAD = b'{"leader":"\xff\xfe"}'


@pytest.mark.parametrize("body", [TORN, BAD])
@pytest.mark.parametrize(
    ("parse", "raises"),
    [
        (lambda b: copytrade.parse(b, "alice"), SignalRejected),
        (candles.parse_server_time, FeedProtocolError),
        (lambda b: movers.parse_products(b, frozenset()), FeedProtocolError),
        (lambda b: dflow.decode(b, dict), dflow.DflowError),
        (lambda b: news.parse_search(b, "tavily"), news.SourceError),
        (news.parse_fear_greed, news.SourceError),
        (decode_from_worker, HookCrashed),
    ],
)
def test_a_string_that_is_not_utf8_is_bad_input_not_a_crash(
    parse: Callable[[bytes], Any], raises: type[Exception], body: bytes
) -> None:
    with pytest.raises(raises) as info:
        parse(body)
    assert not isinstance(info.value, UnicodeDecodeError)
    if isinstance(info.value, SignalRejected):
        assert info.value.status == 400  # not JSON, as for any other bad body
    assert isinstance(info.value, FeedError | HookCrashed | SignalRejected)


@pytest.mark.parametrize("body", [TORN, BAD])
def test_answers_that_only_describe_an_error_or_a_line_skip_it(body: bytes) -> None:
    assert candles.describe_error(502, body).startswith("HTTP 502")
    assert dflow.error_message(502, body)
    assert parse_line(body) is None  # an audit line: skipped and counted
