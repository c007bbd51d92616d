"""Recorded Coinbase frames from ../shared, mutated (tests/mutate.py) and read back as
a replay reads them: every line must be refused with our own error or give events
whose symbol is a product id and whose prices are above 0.

    .venv/bin/python bench/input_fuzz.py [--lines 20000] [--seed 1]

Prints, per recording, how many mutated lines were refused, how many gave events
(and how many events), and every failure (an exception not ours, or a value a
later stage would take at its word), with the line; exits 1 if there was one.
tests/test_hostile_inputs.py runs the same checks on frames it makes itself.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.mutate: the suite's mutator, at a larger scale

from daemon.errors import MarketwakeError
from feeds.coinbase_ws.protocol import product_id
from feeds.coinbase_ws.recording import Recording
from tests.mutate import mutations

RECORDINGS = ROOT.parent / "shared" / "data" / "coinbase_ws"
PRICES = ("price", "open", "high", "low", "close")


def _wrapped(line: dict[str, Any]) -> dict[str, Any]:
    """A recorded line with its ``raw`` message as JSON (mutated as a value, sent as text)."""
    if isinstance(line.get("raw"), str):
        line["raw"] = json.loads(line["raw"])
    return line


def _untrusted(events: list[tuple[int, Any]]) -> str:
    """What a later stage should not take at its word in ``events`` ("" if nothing)."""
    for _, event in events:
        if event.symbol is not None and product_id(event.symbol) != event.symbol:
            return f"symbol {event.symbol!r}"
        for key in PRICES:
            value = event.payload.get(key)
            if key in event.payload and not (math.isfinite(value) and value > 0):
                return f"{key} {value!r}"
    return ""


def fuzz(path: Path, lines: int, seed: int) -> int:
    samples = [_wrapped(json.loads(text)) for text in path.read_text().splitlines()[:500]]
    recording = Recording()
    refused = passed = events = failed = 0
    for line in mutations(samples, lines, seed):
        if isinstance(line, dict) and isinstance(line.get("raw"), dict | list):
            line["raw"] = json.dumps(line["raw"])
        text = json.dumps(line)
        try:
            got = recording.parse(text).events
        except MarketwakeError:
            refused += 1
            continue
        except Exception:  # noqa: BLE001 - what this bench is looking for
            failed += 1
            print(f"  FAILED on {text[:300]}\n{traceback.format_exc(limit=3)}")
            continue
        why = _untrusted(got)
        if why:
            failed += 1
            print(f"  UNTRUSTED {why} from {text[:300]}")
        passed += 1
        events += len(got)
    print(f"{path.name}: {lines} mutated lines: {refused} refused, {passed} read "
          f"({events} events), {failed} failures")  # fmt: skip
    return failed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=int, default=20_000)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    files = sorted(p for p in RECORDINGS.glob("advtrade_*.jsonl"))
    if not files:
        print(f"no recordings in {RECORDINGS}", file=sys.stderr)
        return 2
    return 1 if sum(fuzz(p, args.lines, args.seed) for p in files) else 0


if __name__ == "__main__":
    sys.exit(main())
