"""A loopback Coinbase Advanced Trade market-data server (``websockets``), for tests.

``FakeCoinbase`` speaks the real format: it acks subscriptions, sends a
snapshot per newly subscribed product, and on request sends updates,
heartbeats (``heartbeat_counter`` as a string, as Coinbase does), error frames
and garbage, drops the TCP connection, or goes silent.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

TS = "2026-05-06T07:08:09.123456789Z"
WAIT = 5.0


def ticker(product: str, price: str, **extra: str) -> dict[str, str]:
    """One ticker entry with string numbers, as Coinbase sends them."""
    return {
        "type": "ticker",
        "product_id": product,
        "price": price,
        "volume_24_h": "10.5",
        "low_24_h": "1",
        "high_24_h": "999999",
        "low_52_w": "",
        "high_52_w": "1000000",
        "price_percent_chg_24_h": "-2.5",
        "best_bid": price,
        "best_ask": price,
        "best_bid_quantity": "0.1",
        "best_ask_quantity": "0.2",
        **extra,
    }


class FakeCoinbase:
    """A scripted Advanced Trade market-data server."""

    def __init__(self) -> None:
        self.connections: list[ServerConnection] = []
        self.received: list[list[dict[str, Any]]] = []
        self.connected_at: list[float] = []
        self.received_at: list[list[float]] = []
        self.prices: dict[str, str] = {}
        self.seq: list[int] = []
        self.frames: list[str] = []  # every message sent, in order (a raw recording)
        self._changed = anyio.Event()

    def _bump(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def wait_for(self, predicate: Callable[[], bool]) -> None:
        """Wait (bounded) until ``predicate`` holds; re-checked on every server event."""
        with anyio.fail_after(WAIT):
            while not predicate():
                await self._changed.wait()

    def sent_by(self, conn: int) -> list[dict[str, Any]]:
        """Control messages the client sent on connection ``conn``."""
        return self.received[conn] if conn < len(self.received) else []

    async def handler(self, ws: ServerConnection) -> None:
        index = len(self.connections)
        self.connections.append(ws)
        self.received.append([])
        self.received_at.append([])
        self.connected_at.append(time.monotonic())
        self.seq.append(0)
        self._bump()
        try:
            async for text in ws:
                msg = json.loads(text)
                self.received[index].append(msg)
                self.received_at[index].append(time.monotonic())
                self._bump()
                await self._answer(index, msg)
        except ConnectionClosed:
            pass
        finally:
            self._bump()

    async def _answer(self, index: int, msg: dict[str, Any]) -> None:
        channel, products = msg["channel"], msg["product_ids"]
        subs = {channel: products or [channel]}
        await self.send(index, "subscriptions", [{"subscriptions": subs}])
        if channel == "ticker" and msg["type"] == "subscribe":
            tickers = [ticker(p, self.prices.get(p, "100")) for p in products]
            await self.send(index, "ticker", [{"type": "snapshot", "tickers": tickers}])

    async def send(
        self, index: int, channel: str, events: list[dict[str, Any]], skip: int = 0
    ) -> None:
        """An envelope with the connection's next sequence_num (plus ``skip``)."""
        self.seq[index] += 1 + skip
        frame = {
            "channel": channel,
            "client_id": "",
            "timestamp": TS,
            "sequence_num": self.seq[index],
            "events": events,
        }
        text = json.dumps(frame)
        self.frames.append(text)
        await self.connections[index].send(text)

    async def update(self, index: int, *prices: tuple[str, str], skip: int = 0) -> None:
        """One ``update`` event with a ticker per (product, price)."""
        tickers = [ticker(p, price) for p, price in prices]
        await self.send(index, "ticker", [{"type": "update", "tickers": tickers}], skip)

    async def heartbeat(self, index: int, counter: int) -> None:
        """A heartbeats frame; the counter is a string, as Coinbase sends it."""
        now = "2026-05-06 07:08:09.123456789 +0000 UTC m=+91717.525857105"
        await self.send(
            index, "heartbeats", [{"current_time": now, "heartbeat_counter": str(counter)}]
        )

    async def raw(self, index: int, events: list[dict[str, Any]]) -> None:
        """A ticker frame with the given events as they are (missing or empty fields)."""
        await self.send(index, "ticker", events)

    def drop(self, index: int) -> None:
        """Cut the TCP connection without a closing handshake."""
        transport = self.connections[index].transport
        assert transport is not None
        transport.abort()


@asynccontextmanager
async def fake_server() -> AsyncIterator[tuple[FakeCoinbase, str]]:
    fake = FakeCoinbase()
    async with serve(fake.handler, "127.0.0.1", 0) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        yield fake, f"ws://127.0.0.1:{port}"
