"""``marketwake rag ...``: ingest, serve and query similar market states."""

from __future__ import annotations

import json
import re
import socket
import sys
from pathlib import Path
from typing import Any

import anyio
import click
import msgspec
import structlog

from daemon.cli.common import Number, load_config_or_defaults, matching
from daemon.events import now_ms
from daemon.inputfile import read_input
from daemon.rag.config import RagConfig
from daemon.rag.features import DAY_MS, TIMEFRAME_MS, Bars, Observations

MAX_PARAMS_BYTES = 1024 * 1024  # the server's default max_request_bytes

_SYMBOL = re.compile(r"^[A-Z]+USDT$")
_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)


def rag_config(path: Path | None) -> RagConfig:
    """The [rag] section of ``path``, of ./config.toml if present, else the defaults."""
    return load_config_or_defaults(path).rag


@click.group("rag")
def rag_group() -> None:
    """Similar historical market states (embedded store or Qdrant; JSON-RPC 2.0 on TCP 7879)."""


def _fetch(
    cfg: RagConfig, symbol: str, timeframe: str, days: float
) -> tuple[Bars, Observations, Observations]:
    from daemon.rag.exchange import fetch_history

    now = now_ms()
    start = now - int(days * DAY_MS)
    ex = cfg.exchange
    return anyio.run(
        fetch_history, ex.base_url, symbol, timeframe, start, now, ex.request_timeout_seconds
    )


def _files(
    symbol: str, candles: list[Path], funding: list[Path], oi: list[Path]
) -> tuple[Bars, Observations | None, Observations | None]:
    from daemon.rag.datafiles import read_candles, read_funding, read_open_interest

    return (
        read_candles(*candles),
        read_funding(*funding) if funding else None,
        read_open_interest(oi[0], symbol, *oi[1:]) if oi else None,
    )


def _named(specs: tuple[str, ...], option: str) -> list[Path]:
    """The files ``specs`` name (paths, or quoted patterns), each one that exists."""
    paths = [path for spec in specs for path in matching(spec, option)]
    for path in paths:
        if not path.exists():
            raise click.BadParameter(f"{str(path)!r}: no such file", param_hint=option)
    return paths


@rag_group.command("ingest")
@click.option("--symbol", required=True, help="e.g. BTCUSDT")
@click.option(
    "--candles",
    multiple=True,
    metavar="FILE",
    help="CSV(.gz, .zip): open_time_ms,open,high,low,close,volume, or Binance's kline files. "
    "Repeat it, or quote a pattern ('BTCUSDT-5m-*.zip'), for one series in several files.",
)
@click.option("--timeframe", default="5m", show_default=True, type=click.Choice(list(TIMEFRAME_MS)))
@click.option(
    "--funding",
    multiple=True,
    metavar="FILE",
    help="CSV(.gz, .zip): funding_time_ms,funding_rate, or Binance's fundingRate files "
    "(repeat it, or quote a pattern, for several).",
)
@click.option(
    "--open-interest",
    "open_interest",
    multiple=True,
    metavar="FILE",
    help="CSV(.gz, .zip), see docs/rag.md; Binance's daily metrics files too (repeat it, "
    "or quote a pattern, for several).",
)
@click.option("--from-exchange", is_flag=True, help="Fetch from Binance USD-M REST instead.")
@click.option(
    "--days",
    default=30.0,
    type=Number(min=0, min_open=True),
    show_default=True,
    help="History to fetch with --from-exchange.",
)
@click.option("--config", "config_path", type=_FILE, help="config.toml ([rag] section)")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def ingest_cmd(
    symbol: str,
    candles: tuple[str, ...],
    timeframe: str,
    funding: tuple[str, ...],
    open_interest: tuple[str, ...],
    from_exchange: bool,
    days: float,
    config_path: Path | None,
    quiet: bool,
) -> None:
    """Compute features and outcomes per bar and upsert them (incremental, idempotent)."""
    from daemon.rag.ingest import ingest
    from daemon.rag.store import open_store

    if not _SYMBOL.match(symbol):
        raise click.BadParameter("must look like BTCUSDT (^[A-Z]+USDT$)", param_hint="--symbol")
    if from_exchange == bool(candles):
        raise click.UsageError("give exactly one of --candles FILE or --from-exchange")
    cfg = rag_config(config_path)
    if from_exchange:
        bars, fund, oi = _fetch(cfg, symbol, timeframe, days)
    else:
        files = (
            _named(candles, "--candles"),
            _named(funding, "--funding"),
            _named(open_interest, "--open-interest"),
        )
        bars, fund, oi = _files(symbol, *files)  # type: ignore[assignment]
    store = open_store(cfg.store)
    try:
        batch = 0 if cfg.store.kind == "embedded" else 512
        report = ingest(
            store, symbol, timeframe, bars, fund, oi, cfg, progress=not quiet, batch_size=batch
        )
    finally:
        store.close()
    click.echo(
        f"{symbol} {timeframe}: {report.bars} bars, {report.points} points "
        f"({report.new} new, {report.written} written, {report.unchanged} unchanged), "
        f"{report.incomplete} without funding/OI (kept, not searchable), "
        f"{report.pending_outcomes} awaiting their 24 h outcome (not searchable yet), {report.seconds:.2f} s"
    )


@rag_group.command("serve")
@click.option("--host", default=None, help="Default: rag.server.host (127.0.0.1)")
@click.option(
    "--port",
    default=None,
    type=click.IntRange(1, 65535),
    help="Default: rag.server.port (7879)",
)
@click.option("--config", "config_path", type=_FILE, help="config.toml ([rag] section)")
@click.option(
    "--log-format",
    type=click.Choice(["auto", "console", "json"]),
    help="Override daemon.log_format of the config.",
)
def serve_cmd(
    host: str | None, port: int | None, config_path: Path | None, log_format: str | None
) -> None:
    """Serve rag.query_patterns as JSON-RPC 2.0 over TCP (one JSON text per line).

    Logs as the daemon does ([daemon] log_format and log_level of the config);
    deploy/marketwake-rag.service runs it under systemd."""
    from daemon.logs import configure as configure_logging
    from daemon.rag.server import RagServer, methods_for
    from daemon.rag.service import RagService
    from daemon.rag.store import open_store

    full = load_config_or_defaults(config_path)
    configure_logging(log_format or full.daemon.log_format, full.daemon.log_level)
    cfg = full.rag
    server_cfg = msgspec.structs.replace(
        cfg.server,
        host=host if host is not None else cfg.server.host,
        port=port if port is not None else cfg.server.port,
    )
    store = open_store(cfg.store)
    server = RagServer(server_cfg, methods_for(RagService(cfg, store)))
    structlog.get_logger("rag").info(
        "rag serving", store=cfg.store.kind, host=server_cfg.host, port=server_cfg.port
    )
    try:
        anyio.run(server.serve)
    except KeyboardInterrupt:
        pass
    finally:
        store.close()


def _send(host: str, port: int, request: dict[str, Any], timeout: float) -> dict[str, Any]:
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(msgspec.json.encode(request) + b"\n")
        buf = b""
        while b"\n" not in buf:
            chunk = sock.recv(65536)
            if not chunk:
                break
            buf += chunk
    if not buf.strip():
        raise click.ClickException(f"{host}:{port} closed the connection without a reply")
    reply: dict[str, Any] = json.loads(buf.split(b"\n", 1)[0])
    return reply


@rag_group.command("query")
@click.option(
    "--params", "params_file", default="-", show_default=True, help="JSON params file, - = stdin"
)
@click.option("--method", default="rag.query_patterns", show_default=True)
@click.option("--host", default=None)
@click.option("--port", default=None, type=click.IntRange(1, 65535))
@click.option(
    "--api-key", default=None, help="Sent as params.api_key (default: rag.server.api_key)"
)
@click.option("--in-process", is_flag=True, help="Query the store directly, no server.")
@click.option("--config", "config_path", type=_FILE, help="config.toml ([rag] section)")
def query_cmd(
    params_file: str,
    method: str,
    host: str | None,
    port: int | None,
    api_key: str | None,
    in_process: bool,
    config_path: Path | None,
) -> None:
    """Send one request and print the JSON response (exit 1 on an error response)."""
    cfg = rag_config(config_path)
    if params_file == "-" and sys.stdin.isatty():
        click.echo(
            "reading params JSON from stdin (end with Ctrl-D; or pass --params FILE)", err=True
        )
    if params_file == "-":
        text = sys.stdin.read(MAX_PARAMS_BYTES + 1)
    else:
        try:
            text = read_input(Path(params_file), MAX_PARAMS_BYTES).decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise click.ClickException(f"{params_file}: cannot read params: {exc}") from None
    if len(text) > MAX_PARAMS_BYTES:
        raise click.ClickException(f"params: larger than {MAX_PARAMS_BYTES} bytes")
    try:
        params = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as exc:
        raise click.ClickException(f"params are not JSON: {exc}") from None
    if in_process:
        reply = _in_process(cfg, method, params)
    else:
        key = api_key if api_key is not None else cfg.server.api_key.reveal()
        if key and isinstance(params, dict):
            params = {**params, "api_key": key}
        request = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
        timeout = cfg.server.timeout_ms / 1000 + 5
        try:
            reply = _send(host or cfg.server.host, port or cfg.server.port, request, timeout)
        except OSError as exc:
            raise click.ClickException(f"cannot reach the rag server: {exc}") from None
    click.echo(json.dumps(reply, indent=2))
    if "error" in reply:
        sys.exit(1)


def _in_process(cfg: RagConfig, method: str, params: Any) -> dict[str, Any]:
    from daemon.errors import RpcError
    from daemon.rag.server import methods_for
    from daemon.rag.service import RagService
    from daemon.rag.store import open_store

    store = open_store(cfg.store)
    try:
        handler = methods_for(RagService(cfg, store)).get(method)
        if handler is None:
            return {
                "jsonrpc": "2.0",
                "id": 1,
                "error": {"code": -32601, "message": "Method not found"},
            }
        try:
            return {"jsonrpc": "2.0", "id": 1, "result": handler(params)}
        except RpcError as exc:
            err = {"code": exc.code, "message": exc.message, "data": exc.data}
            return {"jsonrpc": "2.0", "id": 1, "error": err}
    finally:
        store.close()
