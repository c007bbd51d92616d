"""Generated market series with known properties, written as the accepted CSVs."""

from __future__ import annotations

from pathlib import Path

import numpy as np

T0 = 1_735_689_600_000  # 2025-01-01T00:00Z, on a 4 h boundary
TF = 300_000  # 5m


def candles(n: int, seed: int = 7, start: int = T0, tf: int = TF) -> np.ndarray:
    """(n, 6) rows: a geometric random walk with spiky highs/lows, positive prices."""
    rng = np.random.default_rng(seed)
    steps = rng.normal(0, 0.004, n)
    close = 100.0 * np.exp(np.cumsum(steps))
    open_ = np.concatenate(([100.0], close[:-1]))
    spread = np.abs(rng.normal(0, 0.006, (n, 2)))
    high = np.maximum(open_, close) * (1 + spread[:, 0])
    low = np.minimum(open_, close) * (1 - spread[:, 1])
    t = start + tf * np.arange(n)
    return np.column_stack([t, open_, high, low, close, rng.uniform(1, 10, n)])


def funding(start: int, end: int, seed: int = 3) -> np.ndarray:
    """(k, 2) settlements every 8 h with both signs."""
    rng = np.random.default_rng(seed)
    t = np.arange(start, end, 8 * 3_600_000)
    return np.column_stack([t, rng.normal(0.00005, 0.0001, len(t))])


def open_interest(start: int, end: int, seed: int = 5, step: int = 3_600_000) -> np.ndarray:
    """(k, 2) hourly OI snapshots wandering enough to leave the flat band."""
    rng = np.random.default_rng(seed)
    t = np.arange(start, end, step)
    return np.column_stack([t, 1e9 * np.exp(np.cumsum(rng.normal(0, 0.01, len(t))))])


def write_csv(path: Path, header: str, rows: np.ndarray, int_cols: int = 1) -> Path:
    """Rows as CSV with the first ``int_cols`` columns as integers."""
    lines = [header]
    for r in rows:
        ints = [str(int(x)) for x in r[:int_cols]]
        lines.append(",".join(ints + [repr(float(x)) for x in r[int_cols:]]))
    path.write_text("\n".join(lines) + "\n")
    return path
