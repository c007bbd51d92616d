"""Processes as /proc shows them, for the benchmarks that watch a daemon's memory."""

from __future__ import annotations

from pathlib import Path


def rss_kib(pid: int) -> int:
    """The resident set of ``pid`` in KiB (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def children(pid: int) -> list[int]:
    """The child processes of ``pid`` (the sandbox workers of a daemon), any thread's."""
    found: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                found += [int(x) for x in (task / "children").read_text().split()]
            except OSError:
                continue  # a thread that just ended
    except OSError:
        pass
    return found
