"""Candle files for the benchmarks: the first rows of a replay CSV (the shared
Binance files too, .csv.gz included)."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any


def head(src: Path, dst: Path, candles: int) -> Path:
    """Write the header and the first ``candles`` rows of ``src`` to ``dst``."""
    opener: Any = gzip.open if src.suffix == ".gz" else open
    with opener(src, "rt") as f, dst.open("w") as out:
        for i, line in enumerate(f):
            if i > candles:  # the header, then N rows
                break
            out.write(line)
    return dst
