"""The movers scanner: parsing Coinbase's product list, announcing each move once."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import anyio
import pytest
from aiohttp import web

from daemon.errors import FeedProtocolError
from daemon.events import MARKET_MOVERS_DETECTED, FeedEvent
from feeds.base import FeedHealth
from feeds.config import MoversSection
from feeds.movers import MoversFeed
from feeds.movers.protocol import MoverTracker, Quote, parse_products
from tests.loopback import serve_app

T0 = 1_764_000_000_000  # 2025-11-24T16:00:00Z


def product(pid: str, change: str, **kw: Any) -> dict[str, Any]:
    return {
        "product_id": pid, "price": "10.5", "price_percentage_change_24h": change,
        "volume_24h": "1000", "quote_currency_id": pid.split("-")[1], "status": "online",
        "trading_disabled": False, **kw,
    }  # fmt: skip


def body(*products: dict[str, Any]) -> bytes:
    return json.dumps({"products": list(products), "num_products": len(products)}).encode()


def test_parse_keeps_tradable_products_of_the_wanted_quotes() -> None:
    """Offline, disabled, other quotes and empty numbers (real frames have them) drop out."""
    raw = body(
        product("SOL-USD", "7.25"),
        product("ETH-EUR", "9"),
        product("OLD-USD", "50", status="delisted"),
        product("HALT-USD", "50", trading_disabled=True),
        product("NEW-USD", ""),
        product("ZERO-USD", "12", price=""),
        product("X" * 65 + "-USD", "12"),  # ids no symbol may have
        product("\x1b[2J-USD", "12"),
        product("  -USD", "12", product_id="  "),
    )
    assert parse_products(raw, frozenset({"USD"})) == [Quote("SOL-USD", 10.5, 7.25, 1000.0)]
    assert len(parse_products(raw, frozenset())) == 2
    with pytest.raises(FeedProtocolError, match="products response"):
        parse_products(b"<html>", frozenset())


def test_a_move_is_announced_once_per_direction_and_day() -> None:
    """The same mover on the next poll is quiet; a flip of direction is news; a move
    that ends and comes back on the same day gets the same id (agents skip it)."""
    t = MoverTracker(5.0)
    up = [Quote("SOL-USD", 10.0, 6.0, 1.0), Quote("BTC-USD", 1.0, 1.0, 1.0)]
    (first,) = t.update(up, T0)
    assert first.topic == MARKET_MOVERS_DETECTED and first.symbol == "SOL-USD"
    assert first.event_id == "movers:SOL-USD:up:2025-11-24"
    assert first.payload["direction"] == "up" and first.payload["percentChange24h"] == 6.0
    assert t.update(up, T0 + 60_000) == []
    (down,) = t.update([Quote("SOL-USD", 9.0, -5.5, 1.0)], T0 + 120_000)
    assert down.event_id == "movers:SOL-USD:down:2025-11-24"
    assert t.update([], T0 + 180_000) == []
    (again,) = t.update([Quote("SOL-USD", 9.0, -8.0, 1.0)], T0 + 240_000)
    assert again.event_id == down.event_id


async def test_the_feed_polls_publishes_and_survives_a_bad_poll() -> None:
    """Against a loopback product list: a 500 is a recorded error, the next poll
    publishes the movers."""
    answers = [web.json_response({"error": "INTERNAL"}, status=500)]
    asked: list[str] = []

    async def products(request: web.Request) -> web.Response:
        asked.append(request.query.get("product_type", ""))
        if answers:
            return answers.pop(0)
        return web.Response(body=body(product("SOL-USD", "-12"), product("BTC-USD", "0.4")),
                            content_type="application/json")  # fmt: skip

    app = web.Application()
    app.router.add_get("/market/products", products)
    got: list[FeedEvent] = []
    first = anyio.Event()

    async def publish(event: FeedEvent) -> None:
        got.append(event)
        first.set()

    async with serve_app(app) as url:
        # Built in Python, not decoded: the 5 s floor of the config file does not apply.
        cfg = MoversSection(enabled=True, base_url=url, poll_seconds=0.05)
        feed, health = MoversFeed(cfg, clock=lambda: T0), FeedHealth("movers")
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                await tg.start(feed.run, publish, health)
                await first.wait()
                tg.cancel_scope.cancel()
    assert health.errors == 1 and asked[0] == "SPOT"
    assert [(e.symbol, e.payload["direction"]) for e in got] == [("SOL-USD", "down")]
    assert feed.statistics() == {"polls": 1, "movers_published": 1}


async def test_an_oversized_answer_is_an_error_not_a_memory_spike(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A product list over the cap is refused as a recorded error; nothing is published."""
    import feeds.movers.feed as feed_mod

    monkeypatch.setattr(feed_mod, "MAX_BODY_BYTES", 1000)
    big = body(*[product(f"C{i}-USD", "9") for i in range(50)])

    async def products(_: web.Request) -> web.Response:
        return web.Response(body=big, content_type="application/json")

    app = web.Application()
    app.router.add_get("/market/products", products)
    got: list[FeedEvent] = []

    async def publish(event: FeedEvent) -> None:
        got.append(event)

    async with serve_app(app) as url:
        feed = MoversFeed(MoversSection(enabled=True, base_url=url), clock=lambda: T0)
        health = FeedHealth("movers")
        async with aiohttp.ClientSession() as session:
            await feed._poll(session, publish, health)
    assert health.errors == 1 and got == [] and feed.polls == 0
