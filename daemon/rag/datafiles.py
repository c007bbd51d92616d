"""Reading the input CSVs (plain, .gz or a one-file .zip) into Bars and Observations.

Accepted formats (header row required, extra columns ignored):

* candles: ``open_time_ms,open,high,low,close,volume``, or Binance's kline files
  as they come (:mod:`feeds.candle_csv`: 12 columns, no header or Binance's;
  times in milliseconds or microseconds)
* funding: ``funding_time_ms,funding_rate`` (known at ``funding_time_ms``), or
  Binance's fundingRate files (``calc_time,funding_interval_hours,last_funding_rate``)
* open interest, either
  ``time_ms,open_interest`` (a snapshot known at ``time_ms``), or the daily
  ``date,day_start_ms,<symbol>_oi_value_usd,...`` (lower-case symbol, e.g.
  ``btcusdt_oi_value_usd``); a daily row is taken as known at the *end* of its
  day (``day_start_ms + 24 h``) so it can never leak into that day's bars; or
  Binance's metrics files (``create_time,...,sum_open_interest_value``, the USD
  value as of each 5 minutes).
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

import numpy as np
from numpy.typing import NDArray

from daemon.errors import DataFileError
from daemon.inputfile import open_text
from daemon.rag.features import DAY_MS, Bars, Observations
from feeds import candle_csv

CANDLE_COLUMNS = ("open_time_ms", "open", "high", "low", "close", "volume")
MAX_HEADER_CHARS = 64 * 1024


def _open(path: Path) -> IO[str]:
    try:
        return open_text(path)  # a FIFO or device is an error, never a wait
    except OSError as exc:
        raise DataFileError(f"{path}: cannot open: {exc}") from None


def _read_header(f: IO[str], path: Path) -> list[str]:
    """The header's column names; a first line past MAX_HEADER_CHARS (a file with no
    newlines) is an error, not read whole."""
    line = f.readline(MAX_HEADER_CHARS + 1)
    if len(line) > MAX_HEADER_CHARS:
        raise DataFileError(f"{path}: the first line is longer than {MAX_HEADER_CHARS:,} "
                            "characters: not a CSV with a header")  # fmt: skip
    return [h.strip() for h in line.strip().split(",")]


def _table(path: Path, wanted: tuple[str, ...], *, binance: bool = False) -> NDArray[np.float64]:
    """The wanted columns as an (n, len(wanted)) float array; ``binance``: candles in
    Binance's layout, with or without its header (the first columns, in order)."""
    with _open(path) as f:
        rows: Iterable[str] = f
        try:
            if binance:
                first = f.readline(MAX_HEADER_CHARS + 1)
                if first[:1].isdigit():  # no header: the first line is a row
                    rows = itertools.chain((first,), f)
                cols = list(range(len(wanted)))
            else:
                header = _read_header(f, path)
                missing = [w for w in wanted if w not in header]
                if missing:
                    raise DataFileError(
                        f"{path}: header lacks {', '.join(missing)} (found {','.join(header)})"
                    )
                cols = [header.index(w) for w in wanted]
            with warnings.catch_warnings():  # an empty body is reported below, not warned
                warnings.simplefilter("ignore", UserWarning)
                data = np.loadtxt(rows, delimiter=",", usecols=cols, ndmin=2, dtype=np.float64)
        except (ValueError, OSError, EOFError, UnicodeDecodeError) as exc:
            raise DataFileError(f"{path}: malformed data: {exc}") from None
    if data.size and not np.isfinite(data).all():
        raise DataFileError(f"{path}: non-finite numbers")
    return data.reshape(-1, len(wanted))


def _header(path: Path) -> list[str]:
    with _open(path) as f:
        try:
            return _read_header(f, path)
        except (OSError, EOFError, UnicodeDecodeError) as exc:
            raise DataFileError(f"{path}: cannot read header: {exc}") from None


def read_candles(path: Path, *more: Path) -> Bars:
    """Candles of one series from one file or several (Binance's monthly files), sorted
    by open time, duplicates resolved to the last row read."""
    return Bars.from_rows(np.vstack([_candles(p) for p in (path, *more)]))


def _candles(path: Path) -> NDArray[np.float64]:
    binance = candle_csv.binance_layout(",".join(_header(path))) is not None
    data = _table(path, CANDLE_COLUMNS, binance=binance)
    if len(data) == 0:
        raise DataFileError(f"{path}: no candles")
    if binance:  # microseconds (Binance's spot files from 2025 on) to milliseconds
        micro = data[:, 0] >= candle_csv.MICROSECONDS
        data[micro, 0] = np.floor(data[micro, 0] / 1000)
    if (data[:, 1:5] <= 0).any():
        raise DataFileError(f"{path}: prices must be positive")
    return data


def read_funding(path: Path, *more: Path) -> Observations:
    """Funding settlements from one file or several: ``funding_time_ms,funding_rate``,
    or Binance's fundingRate files (``calc_time,funding_interval_hours,last_funding_rate``)."""
    data = np.vstack([_funding(p) for p in (path, *more)])
    return Observations.of(data[:, 0].astype(np.int64), data[:, 1])


def _funding(path: Path) -> NDArray[np.float64]:
    binance = {"calc_time", "last_funding_rate"} <= set(_header(path))
    columns = ("calc_time", "last_funding_rate") if binance else ("funding_time_ms", "funding_rate")
    return _table(path, columns)


def read_open_interest(path: Path, symbol: str, *more: Path) -> Observations:
    """Open interest from one file or several, in any accepted format (see the module
    docstring; Binance's daily metrics files come a file a day)."""
    parts = [_open_interest(p, symbol) for p in (path, *more)]
    return Observations.levels(
        np.concatenate([p.time_ms for p in parts]), np.concatenate([p.value for p in parts])
    )


def _open_interest(path: Path, symbol: str) -> Observations:
    header = _header(path)
    if "time_ms" in header and "open_interest" in header:
        data = _table(path, ("time_ms", "open_interest"))
        return Observations.of(data[:, 0].astype(np.int64), data[:, 1])
    column = f"{symbol.lower()}_oi_value_usd"
    if "day_start_ms" in header and column in header:
        data = _table(path, ("day_start_ms", column))
        return Observations.of(data[:, 0].astype(np.int64) + DAY_MS, data[:, 1])
    if "create_time" in header and "sum_open_interest_value" in header:
        return _binance_metrics(path, header)
    raise DataFileError(
        f"{path}: expected columns time_ms,open_interest, day_start_ms,{column}, or "
        f"Binance's create_time,...,sum_open_interest_value (found {','.join(header)})"
    )


def _binance_metrics(path: Path, header: list[str]) -> Observations:
    """Binance's metrics files: the open interest's USD value as of each ``create_time``
    (UTC ``2025-01-01 00:05:00``, or epoch ms); an empty value is a gap."""
    at, value = header.index("create_time"), header.index("sum_open_interest_value")
    times: list[int] = []
    values: list[float] = []
    line_no = 1
    with _open(path) as f:
        try:
            f.readline(MAX_HEADER_CHARS + 1)  # the header (checked by _header)
            while line := f.readline(MAX_HEADER_CHARS + 1):
                line_no += 1
                if len(line) > MAX_HEADER_CHARS:  # no newline: never read whole
                    raise ValueError(f"a line longer than {MAX_HEADER_CHARS:,} characters")
                if not line.strip():
                    continue
                fields = line.rstrip("\r\n").split(",")
                times.append(_moment(fields[at].strip()))
                values.append(float(fields[value]) if fields[value].strip() else math.nan)
        except (ValueError, IndexError, OSError, EOFError, UnicodeDecodeError) as exc:
            raise DataFileError(f"{path}:{line_no}: malformed data: {exc}") from None
    return Observations.of(np.array(times, dtype=np.int64), np.array(values, dtype=np.float64))


def _moment(text: str) -> int:
    """Epoch ms of a time given as digits (ms, or us past 1e14) or as UTC text."""
    if text.isdigit():
        return candle_csv.to_ms(int(text))
    moment = datetime.fromisoformat(text)
    return int(moment.replace(tzinfo=moment.tzinfo or UTC).timestamp() * 1000)
