"""HTTP helpers shared by the REST feeds, the tools that poll public APIs, and the
servers (the copy-trade doors, MCP over HTTP)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from daemon.errors import FeedError

if TYPE_CHECKING:
    import aiohttp

CHUNK_BYTES = 64 * 1024
# A REST answer we parse whole (candle pages, a product, an exchange page): far
# above any real one (Binance's 1,500 klines are ~250 KB).
MAX_REST_BYTES = 16 * 1024 * 1024
# What a server writes to a connection past its cap before closing it: the sender (or
# its HTTP library) sees a busy server to retry, not a dropped connection.
BUSY_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nConnection: close\r\n"
    b"Content-Length: 0\r\n\r\n"
)


async def read_capped(resp: aiohttp.ClientResponse, limit: int, what: str) -> bytes:
    """The whole body of ``resp``, or FeedError once it passes ``limit`` bytes.

    A server (or a proxy in front of it) that answers with an endless or huge
    body must cost at most ``limit`` bytes of memory, whatever Content-Length says."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_chunked(CHUNK_BYTES):
        size += len(chunk)
        if size > limit:
            raise FeedError(f"{what}: the answer is over {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
