"""The test suite on a machine busier than it is: timing assumptions that hold on a
quiet box and fail on a loaded CI runner show up here first.

    .venv/bin/python bench/loaded_tests.py [--busy 4] [--workers 2] [-- PYTEST ARGS]

Starts ``--busy`` processes that spin on a CPU each, runs ``pytest -q -n
--workers`` beside them, stops them, and exits with pytest's code. On this
2-core machine, busy loops found a test that slept 50 ms waiting for a thread,
a control socket briefly at its umask's mode, and a test whose watching thread
could miss the whole moment it watched for and then wait forever (stop 56).
Pass test paths after ``--`` to repeat a few files (``-- tests/test_control.py``).
"""

from __future__ import annotations

import argparse
import multiprocessing
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def spin() -> None:
    while True:
        pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--busy", type=int, default=4, help="busy processes beside the suite")
    ap.add_argument("--workers", type=int, default=2, help="pytest-xdist workers")
    ap.add_argument("pytest_args", nargs="*", help="passed to pytest (after --)")
    args = ap.parse_args()
    busy = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.busy)]
    for p in busy:
        p.start()
    start = time.monotonic()
    try:
        cmd = [sys.executable, "-m", "pytest", "-q", "-n", str(args.workers), *args.pytest_args]
        code = subprocess.call(cmd, cwd=ROOT)
    finally:
        for p in busy:
            p.terminate()
        for p in busy:
            p.join()
    print(f"{args.busy} busy processes beside the suite: pytest exit {code} "
          f"after {time.monotonic() - start:.0f} s")  # fmt: skip
    return code


if __name__ == "__main__":
    sys.exit(main())
