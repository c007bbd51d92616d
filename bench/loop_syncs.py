"""Which thread waits for the disk: the syncs of a durable replay, by thread and file.

    .venv/bin/python bench/loop_syncs.py [--data FILE] [--candles 3000]

Runs the daemon (``marketwake run``, the durable defaults of the config
``bench/kill9_check.py`` writes) over the first candles of the shared BTCUSDT 5m
data (synthetic candles when ``../shared`` is absent) through ``agents/example``,
under ``strace -f``, and counts every ``fsync``/``fdatasync`` by the thread that
made it and the file it synced. A sync on the event loop's thread holds every
feed, hook and agent run for as long as the disk takes (67-363 ms each on a
loaded disk here); docs/daemon.md ("Event loop stalls") lists what moved off it.
The baseline is the same run's total: the line to read is the loop's share.
Needs ``strace`` (Debian's package); it says so when it is missing.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from candles import head  # bench/ is on the path when run as a script
from kill9_check import DATA, ROOT, command, config

from feeds.synthetic import generate_candles

# 123 fdatasync(14</state/hooks.sqlite3-wal>) = 0 <0.000241>
# 123 fdatasync(14</state/hooks.sqlite3-wal> <unfinished ...>
# 123 <... fdatasync resumed>) = 0 <0.055442>
_CALL = re.compile(r"^(\d+) +(fsync|fdatasync)\(\d+<([^>]*)>")
_RESUMED = re.compile(r"^(\d+) +<\.\.\. (?:fsync|fdatasync) resumed>")
_TOOK = re.compile(r"<(\d+\.\d+)>\s*$")


@dataclass
class Syncs:
    """Syncs seen in one strace log, split into the loop's thread and the rest."""

    loop: Counter[str] = field(default_factory=Counter)
    elsewhere: Counter[str] = field(default_factory=Counter)
    loop_seconds: list[float] = field(default_factory=list)
    elsewhere_seconds: list[float] = field(default_factory=list)


def _kind(path: str, state: str) -> str:
    """A synced file, named as the docs do: ``paper.sqlite3-wal``, ``state dir``..."""
    if path == state:
        return "state dir"
    name = Path(path).name
    if name.startswith("audit-"):
        return "audit part"
    if Path(path).parent.name == "revisions":
        return "hook revision"
    return name


def count(lines: Iterable[str], loop_tid: int, state: str) -> Syncs:
    """Count the syncs in ``strace -f -y -T -e trace=fsync,fdatasync`` lines (no I/O)."""
    out = Syncs()
    pending: dict[int, str] = {}
    for line in lines:
        call = _CALL.match(line)
        tid, path = (int(call[1]), call[3]) if call else (0, "")
        if call is None:
            resumed = _RESUMED.match(line)
            if resumed is None or int(resumed[1]) not in pending:
                continue
            tid = int(resumed[1])
            path = pending.pop(tid)
        elif "<unfinished" in line:
            pending[tid] = path
            continue
        took = _TOOK.search(line)
        seconds = float(took[1]) if took else 0.0
        kind = _kind(path, state)
        if tid == loop_tid:
            out.loop[kind] += 1
            out.loop_seconds.append(seconds)
        else:
            out.elsewhere[kind] += 1
            out.elsewhere_seconds.append(seconds)
    return out


def _summary(where: str, counts: Counter[str], seconds: list[float]) -> str:
    total = sum(counts.values())
    if not total:
        return f"{where}: none"
    files = ", ".join(f"{kind} {n}" for kind, n in counts.most_common())
    return (
        f"{where}: {total} (median {statistics.median(seconds) * 1000:.2f} ms, longest "
        f"{max(seconds) * 1000:.2f} ms): {files}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--candles", type=int, default=3000)
    args = parser.parse_args()
    strace = shutil.which("strace")
    if strace is None:
        sys.exit("strace not found: install Debian's strace package")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        csv = tmp / "candles.csv"
        if args.data.exists():
            head(args.data, csv, args.candles)
            what = f"the first {args.candles} candles of {args.data.name}"
        else:
            generate_candles(csv, seed=7, n=args.candles, timeframe="5m")
            what = f"{args.candles} synthetic candles ({args.data} not found)"
        trace = tmp / "strace.txt"
        cmd = [strace, "-f", "--seccomp-bpf", "-y", "-T", "-e", "trace=fsync,fdatasync,execve"]
        cmd += ["-o", str(trace)]  # (seccomp-bpf: only these calls stop the daemon)
        start = time.perf_counter()
        with (tmp / "daemon.log").open("wb") as log:
            proc = subprocess.Popen(
                [*cmd, *command(config(tmp, csv, "state"))], cwd=ROOT, stdout=log, stderr=log
            )
            if proc.wait() != 0:
                sys.exit(
                    f"the daemon failed ({proc.returncode}): {(tmp / 'daemon.log').read_text()}"
                )
        took = time.perf_counter() - start
        lines = trace.read_text().splitlines()
        # The daemon's execve comes first; its pid is its first thread's, the loop's.
        loop_tid = int(next(line for line in lines if "execve(" in line).split()[0])
        syncs = count(lines, loop_tid, str(tmp / "state"))
    total = sum(syncs.loop.values()) + sum(syncs.elsewhere.values())
    print(f"a durable replay of {what} through agents/example: {took:.1f} s under strace")
    print(_summary("syncs on the event loop's thread", syncs.loop, syncs.loop_seconds))
    print(
        _summary(
            "syncs elsewhere (worker threads, sandbox processes)",
            syncs.elsewhere,
            syncs.elsewhere_seconds,
        )
    )
    share = sum(syncs.loop.values()) / total if total else 0.0
    print(f"the loop's share of all {total} syncs: {share:.2f}")


if __name__ == "__main__":
    main()
