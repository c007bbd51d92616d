"""Instructions the main process executes per event of a backtest, counted by
valgrind (callgrind): a figure that does not move with the machine's load, for
judging a change of a few percent that wall or CPU time on a shared 2-core box
(+-10% run to run) cannot show.

    .venv/bin/python bench/instructions.py [--data FILE] [--candles N] [--agent DIR]

Runs ``marketwake backtest`` twice under callgrind: on the first 10 candles (the
fixed cost: start-up, the report) and on the first N (default 3,000); prints
(instructions(N) - instructions(10)) / (N - 10). Without ``--data`` it runs on
generated 5m candles. The sandbox workers run natively (only the main process is
counted), so under valgrind's ~50x slowdown lookahead always finds its results:
compare two commits with this script, not with wall-clock figures. Kernel time
(SQLite's writes, pipes) is not counted. Needs ``valgrind`` (Debian package);
~2 minutes for 3,000 candles.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from candles import head  # bench/ is the script's directory, first on sys.path

from feeds.synthetic import generate_candles

ROOT = Path(__file__).resolve().parent.parent
COLLECTED = re.compile(rb"Collected : (\d+)")


def _generated(dst: Path, candles: int) -> Path:
    generate_candles(dst, seed=11, n=candles, timeframe="5m")
    return dst


def count(data: Path, agent: Path, out: Path) -> int:
    """Instructions of one backtest's main process."""
    cmd = [
        "valgrind", "--tool=callgrind", f"--callgrind-out-file={out / 'callgrind.out'}",
        sys.executable, "-m", "daemon.cli", "backtest", "--agent", str(agent),
        "--data", str(data), "--symbol", "BTCUSDT", "--timeframe", "5m",
        "--out", str(out / "bt"),
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, check=False)
    found = COLLECTED.search(done.stderr)
    if done.returncode or found is None:
        sys.exit(f"backtest under valgrind failed ({done.returncode}):\n{done.stderr[-2000:]!r}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, help="candle CSV (.csv.gz too); else generated")
    parser.add_argument("--candles", type=int, default=3000)
    parser.add_argument("--agent", type=Path, default=ROOT / "agents" / "example")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (apt-get install valgrind)")
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        sizes, counts = (10, args.candles), []
        for n in sizes:
            csv = base / f"candles_{n}.csv"
            data = head(args.data, csv, n) if args.data else _generated(csv, n)
            (base / str(n)).mkdir()
            counts.append(count(data, args.agent.resolve(), base / str(n)))
            print(f"{n:>7} candles: {counts[-1]:,} instructions", flush=True)
    per_event = (counts[1] - counts[0]) / (sizes[1] - sizes[0])
    print(f"per event: {per_event / 1e6:.3f} M instructions (fixed cost {counts[0] / 1e9:.2f} G)")


if __name__ == "__main__":
    main()
