"""History from Binance USD-M public REST (protocols.md §3) for ``ingest --from-exchange``.

Klines (``/fapi/v1/klines``, max 1500 per page), funding (``/fapi/v1/fundingRate``,
max 1000) and open-interest history (``/futures/data/openInterestHist``, max 500,
only the last 30 days exist). Pages are walked forward from ``startTime``; the
still-open last kline is dropped (a bar becomes a point only once closed). The
base URL is configurable so tests point it at a loopback server.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Final

import aiohttp
import numpy as np

from daemon.errors import FeedError, FeedProtocolError
from daemon.rag.features import DAY_MS, TIMEFRAME_MS, Bars, Observations
from feeds.http import MAX_REST_BYTES, read_capped

_OI_PERIODS: Final = {"5m", "15m", "30m", "1h"}
_MAX_PAGES: Final = 10_000


async def _get(session: aiohttp.ClientSession, url: str, params: dict[str, Any]) -> Any:
    try:
        return await _get_once(session, url, params)
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise FeedError(f"GET {url}: {type(exc).__name__}: {exc}") from None


async def _get_once(session: aiohttp.ClientSession, url: str, params: dict[str, Any]) -> Any:
    async with session.get(url, params=params) as resp:
        if resp.status != 200:
            body = (await resp.content.read(200)).decode(errors="replace")
            hint = (
                f" (retry after {resp.headers.get('Retry-After')} s)"
                if resp.status in (418, 429)
                else ""
            )
            raise FeedError(f"GET {url} -> HTTP {resp.status}{hint}: {body}")
        try:
            return json.loads(await read_capped(resp, MAX_REST_BYTES, f"GET {url}"))
        except ValueError as exc:
            raise FeedProtocolError(f"GET {url}: not JSON: {exc}") from None


async def _pages(
    session: aiohttp.ClientSession,
    url: str,
    params: dict[str, Any],
    start: int,
    end: int,
    time_of: Callable[[Any], int],
) -> list[Any]:
    """Every row in [start, end], walking ``startTime`` forward page by page."""
    rows: list[Any] = []
    cursor = start
    for _ in range(_MAX_PAGES):
        page = await _get(session, url, {**params, "startTime": cursor, "endTime": end})
        if not isinstance(page, list):
            raise FeedProtocolError(f"GET {url}: expected a JSON array, got {type(page).__name__}")
        if not page:
            return rows
        rows.extend(page)
        try:
            nxt = max(time_of(r) for r in page) + 1
        except (TypeError, ValueError, KeyError, IndexError) as exc:
            raise FeedProtocolError(f"GET {url}: a row without its time: {exc!r}") from None
        if nxt <= cursor or nxt > end or len(page) < params["limit"]:
            return rows
        cursor = nxt
    return rows


def _kline_time(row: Any) -> int:
    return int(row[0])


def _parse_klines(rows: list[Any], now: int) -> Bars:
    """The closed klines, checked as a candle file's are (numbers finite, prices above
    0): a bad bar would become a pattern every later search could return."""
    try:
        closed = [r for r in rows if int(r[6]) < now]
        data = np.array([[float(r[k]) for k in range(6)] for r in closed], dtype=np.float64)
    except (TypeError, ValueError, IndexError) as exc:
        raise FeedProtocolError(f"klines: unexpected row layout: {exc}") from None
    if len(data) == 0:
        raise FeedError("klines: no closed candles in the requested range")
    bad = ~np.isfinite(data).all(axis=1) | (data[:, 1:5] <= 0).any(axis=1)
    if bad.any():
        row = closed[int(np.flatnonzero(bad)[0])]
        raise FeedProtocolError(
            f"klines: {int(bad.sum())} not finite or priced at 0 or below; the first: {row[:6]!r}"
        )
    return Bars.from_rows(data)


def _parse_obs(
    rows: list[Any], time_key: str, value_key: str, what: str, *, level: bool = False
) -> Observations:
    try:
        t = np.array([int(r[time_key]) for r in rows], dtype=np.int64)
        v = np.array([float(r[value_key]) for r in rows], dtype=np.float64)
    except (TypeError, ValueError, KeyError) as exc:
        raise FeedProtocolError(f"{what}: unexpected object shape: {exc}") from None
    return Observations.levels(t, v) if level else Observations.of(t, v)


async def fetch_history(
    base_url: str, symbol: str, timeframe: str, start_ms: int, now_ms: int, timeout_s: float
) -> tuple[Bars, Observations, Observations]:
    """Closed candles, funding settlements and OI value (USD) from ``start_ms`` to now."""
    base = base_url.rstrip("/")
    timeout = aiohttp.ClientTimeout(total=None, sock_read=timeout_s, sock_connect=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        klines = await _pages(
            session,
            f"{base}/fapi/v1/klines",
            {"symbol": symbol, "interval": timeframe, "limit": 1500},
            start_ms,
            now_ms,
            _kline_time,
        )
        funding = await _pages(
            session,
            f"{base}/fapi/v1/fundingRate",
            {"symbol": symbol, "limit": 1000},
            start_ms - DAY_MS,
            now_ms,
            lambda r: int(r["fundingTime"]),
        )
        period = timeframe if timeframe in _OI_PERIODS else "5m"
        oi = await _pages(
            session,
            f"{base}/futures/data/openInterestHist",
            {"symbol": symbol, "period": period, "limit": 500},
            max(start_ms - DAY_MS, now_ms - 30 * DAY_MS + TIMEFRAME_MS[period]),
            now_ms,
            lambda r: int(r["timestamp"]),
        )
    return (
        _parse_klines(klines, now_ms),
        _parse_obs(funding, "fundingTime", "fundingRate", "fundingRate"),
        _parse_obs(oi, "timestamp", "sumOpenInterestValue", "openInterestHist", level=True),
    )


async def fetch_context(
    session: aiohttp.ClientSession, base_url: str, symbol: str, timeframe: str, now_ms: int
) -> tuple[Observations, Observations]:
    """Funding settlements (last 2 days) and OI value in USD (last 26 h) known at
    ``now_ms``: what a live state needs, asked as ingest asks for history."""
    base = base_url.rstrip("/")
    funding = await _pages(
        session,
        f"{base}/fapi/v1/fundingRate",
        {"symbol": symbol, "limit": 1000},
        now_ms - 2 * DAY_MS,
        now_ms,
        lambda r: int(r["fundingTime"]),
    )
    period = timeframe if timeframe in _OI_PERIODS else "5m"
    oi = await _pages(
        session,
        f"{base}/futures/data/openInterestHist",
        {"symbol": symbol, "period": period, "limit": 500},
        now_ms - 26 * 3_600_000,
        now_ms,
        lambda r: int(r["timestamp"]),
    )
    return (
        _parse_obs(funding, "fundingTime", "fundingRate", "fundingRate"),
        _parse_obs(oi, "timestamp", "sumOpenInterestValue", "openInterestHist", level=True),
    )
