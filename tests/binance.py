"""Candle files as Binance serves them (data.binance.vision), made from rows of
marketwake's own layout: for the tests that read them as downloaded."""

from __future__ import annotations

import itertools
import zipfile
from pathlib import Path


def kline_rows(rows: list[str], tf_ms: int, unit: int = 1000) -> list[str]:
    """``open_time_ms,open,high,low,close,volume`` rows as Binance's 12-column kline
    rows, times in ``unit`` per millisecond (1000: its spot files from 2025 on)."""
    out = []
    for row in rows:
        t, rest = row.split(",", 1)
        start = int(t) * unit
        out.append(f"{start},{rest},{start + tf_ms * unit - 1},0,0,0,0,0\n")
    return out


def write_zip(path: Path, lines: list[str]) -> Path:
    """A zip holding one CSV named as the zip is, as Binance's downloads do."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(path.name.removesuffix(".zip") + ".csv", "".join(lines))
    return path


def monthly_zips(rows: list[str], directory: Path, name: str, tf_ms: int, cuts: list[int]) -> None:
    """``rows`` cut at ``cuts`` into Binance's monthly files ``<name>-2025-01.zip``, ..."""
    directory.mkdir()
    bounds = [0, *cuts, len(rows)]
    for month, (a, b) in enumerate(itertools.pairwise(bounds), start=1):
        write_zip(directory / f"{name}-2025-{month:02d}.zip", kline_rows(rows[a:b], tf_ms))
