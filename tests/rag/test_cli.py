"""`marketwake rag ingest|serve|query` end to end (CSV files, fake exchange, subprocess server)."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from aiohttp import web
from click.testing import CliRunner

from daemon.cli.main import cli
from daemon.events import now_ms
from tests.binance import monthly_zips
from tests.rag import synth
from tests.rag.conftest import TF_MS, params_from
from tests.rag.fake_binance import FakeBinance

H = 3_600_000


def _files(tmp_path: Path) -> tuple[Path, Path, Path, Path]:
    rows = synth.candles(2000, seed=21, tf=TF_MS)
    start, end = int(rows[0, 0]), int(rows[-1, 0]) + TF_MS
    candles = synth.write_csv(tmp_path / "c.csv", "open_time_ms,open,high,low,close,volume", rows)
    funding = synth.write_csv(
        tmp_path / "f.csv", "funding_time_ms,funding_rate", synth.funding(start - 8 * H, end)
    )
    oi = synth.write_csv(
        tmp_path / "oi.csv", "time_ms,open_interest", synth.open_interest(start - 24 * H, end)
    )
    config = tmp_path / "config.toml"
    config.write_text(f'[rag.store]\npath = "{tmp_path / "store"}"\n[rag.server]\nport = 0\n')
    return candles, funding, oi, config


def _ingest_args(tmp_path: Path) -> list[str]:
    candles, funding, oi, config = _files(tmp_path)
    return ["rag", "ingest", "--symbol", "BTCUSDT", "--timeframe", "15m", "--candles", str(candles),
            "--funding", str(funding), "--open-interest", str(oi), "--config", str(config), "--quiet"]  # fmt: skip


def test_ingest_twice_then_query_in_process(tmp_path: Path) -> None:
    """Ingest reports new points, a re-run reports none, and an in-process query answers."""
    args = _ingest_args(tmp_path)
    runner = CliRunner()
    first = runner.invoke(cli, args, catch_exceptions=False)
    assert first.exit_code == 0 and " 0 new" not in first.output
    second = runner.invoke(cli, args, catch_exceptions=False)
    assert "(0 new, 0 written" in second.output
    pts = np.load(next((tmp_path / "store" / "trading_patterns").glob("gen-*")) / "points.npy")
    params = tmp_path / "p.json"
    params.write_text(
        json.dumps(params_from(pts[pts["complete"]][500], int(pts["t_ms"][-1]), min_similarity=0.5))
    )
    out = runner.invoke(
        cli, ["rag", "query", "--in-process", "--params", str(params), "--config", args[-2]]
    )
    assert out.exit_code == 0, out.output
    assert len(json.loads(out.output)["result"]["matches"]) == 5


def test_ingest_of_binance_monthly_zips_by_pattern_is_the_ingest_of_one_csv(
    tmp_path: Path,
) -> None:
    """``--candles 'BTCUSDT-15m-*.zip'`` and ``--funding`` twice (Binance's files as they
    come: kline rows in microseconds, fundingRate columns) store the points one CSV of
    each stores."""
    args = _ingest_args(tmp_path)
    candles, funding = (
        Path(args[args.index("--candles") + 1]),
        Path(args[args.index("--funding") + 1]),
    )
    rows = candles.read_text().splitlines()[1:]
    months = tmp_path / "months"
    monthly_zips(rows, months, "BTCUSDT-15m", TF_MS, [700, 1500])
    settlements = funding.read_text().splitlines()[1:]
    halves = (settlements[: len(settlements) // 2], settlements[len(settlements) // 2 :])
    paid = []
    for i, half in enumerate(halves):
        paid.append(months / f"BTCUSDT-fundingRate-2025-0{i + 1}.csv")
        paid[-1].write_text(
            "calc_time,funding_interval_hours,last_funding_rate\n"
            + "".join(f"{t},8,{r}\n" for t, r in (line.split(",") for line in half))
        )
    stores = []
    for name, source in (
        ("one", ["--candles", str(candles), "--funding", str(funding)]),
        ("many", ["--candles", f"{months}/BTCUSDT-15m-*.zip", "--funding", str(paid[0]),
                  "--funding", str(paid[1])]),
    ):  # fmt: skip
        config = tmp_path / f"{name}.toml"
        config.write_text(f'[rag.store]\npath = "{tmp_path / name}"\n')
        common = ["rag", "ingest", "--symbol", "BTCUSDT", "--timeframe", "15m", "--quiet"]
        oi = ["--open-interest", args[args.index("--open-interest") + 1]]
        res = CliRunner().invoke(cli, [*common, *source, *oi, "--config", str(config)])
        assert res.exit_code == 0, res.output
        stores.append(
            np.load(next((tmp_path / name / "trading_patterns").glob("gen-*")) / "points.npy")
        )
    assert len(stores[0]) > 1000
    for field in stores[0].dtype.names:
        a, b = stores[0][field], stores[1][field]
        same = np.array_equal(a, b, equal_nan=a.dtype.kind == "f")
        assert same, (field, a[a != b][:3], b[a != b][:3])


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--symbol", "btc", "--candles", "X"], "BTCUSDT"),
        (["--symbol", "BTCUSDT"], "exactly one of"),
    ],
)
def test_ingest_usage_errors(tmp_path: Path, extra: list[str], message: str) -> None:
    """Bad symbols and a missing source are usage errors with a clear message."""
    x = tmp_path / "X"
    x.write_text("")
    extra = [str(x) if e == "X" else e for e in extra]
    res = CliRunner().invoke(cli, ["rag", "ingest", *extra])
    assert res.exit_code == 2 and message in res.output


@pytest.fixture
def fake_exchange() -> Iterator[str]:
    """FakeBinance serving data that ends now, on a loop in a background thread."""
    now = now_ms()
    start = (now - 15 * 24 * H) // (4 * H) * (4 * H)
    rows = synth.candles(int((now - start) // TF_MS) + 1, seed=9, start=start, tf=TF_MS)
    fund = synth.funding(start - 8 * H, now)
    oi = synth.open_interest(start - 24 * H, now, step=TF_MS)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(FakeBinance(rows, fund, oi).app())
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


def test_ingest_from_exchange(tmp_path: Path, fake_exchange: str) -> None:
    """--from-exchange pulls klines, funding and OI from the configured base URL."""
    config = tmp_path / "config.toml"
    config.write_text(
        f'[rag.store]\npath = "{tmp_path}"\n[rag.exchange]\nbase_url = "{fake_exchange}"\n'
    )
    args = ["rag", "ingest", "--symbol", "BTCUSDT", "--timeframe", "15m", "--from-exchange", "--days", "14",
            "--config", str(config), "--quiet"]  # fmt: skip
    res = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    bars, points = map(int, re.search(r"(\d+) bars, (\d+) points", res.output).groups())  # type: ignore[union-attr]
    assert bars == 14 * 24 * 4 - 1 or bars == 14 * 24 * 4  # the open kline is never stored
    assert points > 0 and "0 without funding/OI" in res.output


def test_serve_and_query_over_tcp(tmp_path: Path) -> None:
    """`rag serve` in a subprocess answers `rag query` (the operator client)."""
    args = _ingest_args(tmp_path)
    assert CliRunner().invoke(cli, args).exit_code == 0
    config = args[-2]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from daemon.cli.main import main; main()",
            "rag",
            "serve",
            "--config",
            config,
            "--log-format",
            "json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        port = None
        assert proc.stdout is not None
        for line in proc.stdout:  # JSON log lines, as under systemd
            rec = json.loads(line)
            if rec["event"] == "rag server listening":
                port = int(rec["port"])
                break
        assert port
        params = tmp_path / "p.json"
        params.write_text("{}")
        res = CliRunner().invoke(cli, ["rag", "query", "--method", "rag.health", "--params", str(params),
                                       "--port", str(port), "--config", config])  # fmt: skip
        assert res.exit_code == 0, res.output
        assert json.loads(res.output)["result"]["points"] > 0
        bad = CliRunner().invoke(
            cli, ["rag", "query", "--params", str(params), "--port", str(port), "--config", config]
        )
        assert bad.exit_code == 1 and '"code": -32602' in bad.output
    finally:
        proc.terminate()
        proc.wait(5)
        if proc.stdout:
            proc.stdout.close()
