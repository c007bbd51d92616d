"""query_similar_patterns: the live state is computed as ingest computed the stored
points, funding and OI come from the exchange, and a missing value is never a zero."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import numpy as np
import pytest

from daemon.events import MARKET_CANDLE_CLOSED, Candle, FeedEvent, candle_event_id, iso_ms
from daemon.rag.config import RagConfig
from daemon.rag.features import STATE_COLUMNS
from daemon.state import StateCache
from daemon.tools import registry
from daemon.tools.base import ToolError
from daemon.tools.context import ToolContext
from daemon.tools.patterns import PatternsResult, perp_symbol
from tests.loopback import serve_app
from tests.rag.conftest import TF_MS, Collection, make_collection
from tests.rag.fake_binance import FakeBinance


@pytest.fixture(scope="module")
def collection(tmp_path_factory: pytest.TempPathFactory) -> Collection:
    return make_collection(tmp_path_factory.mktemp("patterns"))


def state_of(rows: np.ndarray, symbol: str = "BTC-USD", timeframe: str = "15m") -> StateCache:
    state = StateCache(max_candles=len(rows))
    for r in rows:
        open_ms = int(r[0])
        o, h, lo, cl, v = (float(x) for x in r[1:6])
        c = Candle(open=o, high=h, low=lo, close=cl, volume=v,
                   open_time_ms=open_ms, close_time_ms=open_ms + TF_MS)  # fmt: skip
        state.apply(
            FeedEvent(
                event_id=candle_event_id("t", symbol, timeframe, c.close_time_ms),
                ts=iso_ms(c.close_time_ms),
                source="t",
                topic=MARKET_CANDLE_CLOSED,
                symbol=symbol,
                timeframe=timeframe,
                partition_key=f"t:{symbol}:{timeframe}",
                payload=c.payload(),
            )
        )
    return state


@asynccontextmanager
async def context(
    col: Collection, rows: np.ndarray, *, exchange_up: bool = True, **files: str
) -> AsyncIterator[ToolContext]:
    fake = FakeBinance(col.rows, col.funding, col.oi)
    async with serve_app(fake.app()) as url, aiohttp.ClientSession() as session:
        base_url = url if exchange_up else "http://127.0.0.1:9"
        cfg = msgspec.convert(
            {
                "store": {"path": str(col.path)},
                "query_defaults": {"timeframe": "15m", "min_matches": 1},
                "exchange": {"base_url": base_url, **files},
            },
            RagConfig,
        )
        ctx = ToolContext(state=state_of(rows), rag=cfg, http=session)
        try:
            yield ctx
        finally:
            ctx.close()


def stored_state(col: Collection, open_ms: int) -> dict[str, float]:
    (point,) = [p for p in col.points() if int(p["open_time_ms"]) == open_ms]
    return {c: float(point[c]) for c in STATE_COLUMNS}


async def test_the_live_state_is_the_stored_state_and_matches_come_back(
    collection: Collection,
) -> None:
    """Asked at a bar that ingest also stored, every one of the twelve values equals
    the stored point's (same code, same inputs); the query answers seed 004's shape."""
    rows = collection.rows[:2000]
    async with context(collection, rows) as ctx:
        out = await registry().call(
            ctx, "query_similar_patterns",
            {"symbol": "BTC-USD", "query_config": {"lookback_days": 365, "min_similarity": 0.0}},
        )  # fmt: skip
    assert isinstance(out, PatternsResult), out
    last_open = int(rows[-1, 0])
    assert out.symbol == "BTCUSDT" and out.timestamp == last_open + TF_MS
    expected = stored_state(collection, last_open)
    funding = expected.pop("funding_rate")  # Binance sends it with 8 decimals
    assert out.current_state.pop("funding_rate") == pytest.approx(funding, abs=1e-8)
    assert out.current_state == pytest.approx(expected, rel=1e-9)
    assert out.matches and all(m["timestamp"] <= out.timestamp for m in out.matches)
    assert set(out.statistics) >= {"total_matches"} and out.metadata["embedding_model"]


async def test_funding_and_open_interest_from_files_need_no_exchange(
    collection: Collection, tmp_path: Path
) -> None:
    """[rag.exchange] funding_file and open_interest_file (the CSVs ingest reads): the
    same state as from the exchange, with the exchange down (a backtest offline);
    values after the query time are in the files but never used. A file that cannot
    be read names itself in the answer."""
    from tests.rag.synth import write_csv

    funding = write_csv(tmp_path / "f.csv", "funding_time_ms,funding_rate", collection.funding)
    oi = write_csv(tmp_path / "oi.csv", "time_ms,open_interest", collection.oi)
    rows = collection.rows[:2000]
    files = {"funding_file": str(funding), "open_interest_file": str(oi)}
    async with context(collection, rows, exchange_up=False, **files) as ctx:
        out = await registry().call(ctx, "query_similar_patterns", {"symbol": "BTC-USD"})
    assert isinstance(out, PatternsResult), out
    expected = stored_state(collection, int(rows[-1, 0]))
    assert out.current_state == pytest.approx(expected, rel=1e-9)
    assert collection.oi[-1, 0] > out.timestamp  # the file goes on past the query
    gone = {**files, "funding_file": str(tmp_path / "gone.csv")}
    async with context(collection, rows, exchange_up=False, **gone) as ctx:
        bad = await registry().call(ctx, "query_similar_patterns", {"symbol": "BTC-USD"})
    assert isinstance(bad, ToolError) and [p.path for p in bad.problems] == [
        "current_state.funding_rate"
    ]
    assert "gone.csv: cannot open" in bad.problems[0].message
    garbage = tmp_path / "oi-bad.csv"
    garbage.write_bytes(b"time_ms,open_interest\n1,not a number\n\xff\xfe")
    broken = {**files, "open_interest_file": str(garbage)}
    async with context(collection, rows, exchange_up=False, **broken) as ctx:
        worse = await registry().call(ctx, "query_similar_patterns", {"symbol": "BTC-USD"})
    assert isinstance(worse, ToolError)  # only OI is missing; funding came from its file
    assert [p.path for p in worse.problems] == [
        "current_state.open_interest_latest", "current_state.open_interest_avg_24h",
    ]  # fmt: skip
    assert "oi-bad.csv: cannot read header" in worse.problems[0].message


async def test_runs_share_one_open_store(collection: Collection) -> None:
    """Each LLM run calls with its own copy of the context: the store is opened once
    for all of them, and closing the daemon's context closes it."""
    import dataclasses

    from daemon.tools.calls import AgentCall

    args = {"symbol": "BTC-USD", "query_config": {"lookback_days": 365, "min_similarity": 0.0}}
    async with context(collection, collection.rows[:2000]) as ctx:
        runs = [dataclasses.replace(ctx, agent=AgentCall("a", f"run-{i}")) for i in range(3)]
        for run in runs:
            assert isinstance(
                await registry().call(run, "query_similar_patterns", args), PatternsResult
            )
        services = {id(await run.rag_service.get(run.rag)) for run in [ctx, *runs]}
        assert len(services) == 1
    assert ctx.rag_service._service is None


async def test_missing_values_are_named_never_zero_filled(collection: Collection) -> None:
    """Exchange down: funding and OI are missing, each with the reason. Too few
    candles: the indicators that need more history are named too."""
    async with context(collection, collection.rows[:2000], exchange_up=False) as ctx:
        down = await registry().call(ctx, "query_similar_patterns", {"symbol": "BTCUSDT"})
    assert isinstance(down, ToolError) and down.error == "unavailable"
    assert [p.path for p in down.problems] == [
        "current_state.funding_rate",
        "current_state.open_interest_latest",
        "current_state.open_interest_avg_24h",
    ]
    assert down.problems[0].message.startswith("the exchange did not answer")
    async with context(collection, collection.rows[1990:2000]) as ctx:
        short = await registry().call(ctx, "query_similar_patterns", {"symbol": "BTC-USD"})
    assert isinstance(short, ToolError)
    paths = [p.path for p in short.problems]
    assert "current_state.rsi_14" in paths and "current_state.ema_50_4h" in paths
    assert "add 4h to [feeds.candles]" in next(
        p.message for p in short.problems if p.path == "current_state.ema_50_4h"
    )


async def test_unknown_products_and_a_missing_store_are_clear(
    collection: Collection, tmp_path: Path
) -> None:
    async with context(collection, collection.rows[:2000]) as ctx:
        none = await registry().call(ctx, "query_similar_patterns", {"symbol": "ETH-USD"})
        assert isinstance(none, ToolError) and none.error == "not_found"
        assert "no 15m candles for ETH-USD" in none.message
        ctx.rag = msgspec.structs.replace(
            ctx.rag, store=msgspec.structs.replace(ctx.rag.store, path=str(tmp_path / "none"))
        )
        missing = await registry().call(ctx, "query_similar_patterns", {"symbol": "BTC-USD"})
    assert isinstance(missing, ToolError) and missing.error == "unavailable"
    assert "run `marketwake rag ingest` first" in missing.message


def test_perp_symbols() -> None:
    assert [perp_symbol(s) for s in ("BTC-USD", "ETH-USDC", "SOLUSDT")] == [
        "BTCUSDT", "ETHUSDT", "SOLUSDT",
    ]  # fmt: skip


async def test_bad_arguments() -> None:
    args: dict[str, Any] = {"symbol": "btc", "query_config": {"top_k": 500}}
    out = await registry().call(ToolContext(), "query_similar_patterns", args)
    assert isinstance(out, ToolError) and out.error == "invalid_arguments"
