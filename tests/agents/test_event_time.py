"""Event time: a replay gives the same wakes, runs, orders and fills at any speed."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import anyio
import msgspec

from daemon.agents.pipeline import open_agents
from daemon.app import build_feeds
from daemon.config import Config
from daemon.service import Service
from feeds.synthetic import generate_candles
from tests.agents.test_isolation import EXAMPLE
from tests.agents.test_pipeline import audit


def replay(root: Path, agents: Path, csv: Path, speed: float, **sandbox: Any) -> Config:
    return msgspec.convert(
        {
            "daemon": {"state_dir": str(root / "state")},
            "hooks": {"agents_dir": str(agents), "reload_seconds": 60, "sandbox": sandbox},
            "feeds": {
                "replay": {"enabled": True, "path": str(csv), "symbol": "BTC-USD",
                           "timeframe": "1m", "speed": speed}
            },
        },
        Config,
    )  # fmt: skip


def story(root: Path) -> dict[str, list[tuple[Any, ...]]]:
    """What happened, without wall-clock fields or random run ids."""
    out: dict[str, list[tuple[Any, ...]]] = {"hook": [], "wake": [], "run": [], "trade": []}
    for r in audit(root):
        kind = r["type"]
        if kind == "hook":
            out["hook"].append(
                (r["eventId"], r["hookId"], r["decision"], r["suppressedBy"], r["error"])
            )
        elif kind == "wake":
            out["wake"].append((r["eventId"], r["outcome"], r["suppressedBy"]))
        elif kind == "run":
            out["run"].append((r["status"], tuple(r["eventIds"])))
        elif kind in ("risk", "order"):
            out["trade"].append(
                (kind, r.get("eventId"), r.get("approved"), r.get("clientOrderId"),
                 r.get("status"), r.get("price"))
            )  # fmt: skip
    return out


async def run(root: Path, csv: Path, speed: float, agents_src: Path, **sandbox: Any) -> Any:
    agents = root / "agents"
    shutil.copytree(agents_src, agents)
    svc = Service(
        replay(root, agents, csv, speed, **sandbox), build_feeds, components=[open_agents]
    )
    with anyio.fail_after(120):
        await svc.run()
    return story(root)


async def test_speed_zero_and_a_speed_factor_give_the_same_story(tmp_path: Path) -> None:
    """The example agent over 150 1m candles, flat out and at 6000x (10 ms a candle):
    identical hook decisions, wakes, runs, verdicts, orders and fills."""
    csv = tmp_path / "c.csv"
    generate_candles(csv, seed=5, n=150, timeframe="1m", start_price=60_000.0)
    src = tmp_path / "src"
    shutil.copytree(EXAMPLE, src / "example")
    fast = await run(tmp_path / "fast", csv, 0, src)
    paced = await run(tmp_path / "paced", csv, 6000, src)
    assert fast["run"], "the example agent must run on this data"
    assert any(w[1] != "woke" for w in fast["wake"]), "budget/collect/cooldown must show"
    assert fast == paced


FLAKY = """
def evaluate(event, state):
    return 1 / 0
"""


async def test_a_failing_hook_backs_off_in_event_time(tmp_path: Path) -> None:
    """Backoff is measured in event time: a failing hook is skipped for the same events
    flat out as paced (on the wall clock, a fast replay skipped everything)."""
    csv = tmp_path / "c.csv"
    generate_candles(csv, seed=5, n=12, timeframe="1m")
    src = tmp_path / "src"
    (src / "alpha" / "hooks").mkdir(parents=True)
    (src / "alpha" / "hooks" / "wake_flaky.py").write_text(FLAKY)
    policy = {"backoff_base_seconds": 30.0, "backoff_max_seconds": 300.0,
              "pause_after_failures": 100}  # fmt: skip
    fast = await run(tmp_path / "fast", csv, 0, src, **policy)
    paced = await run(tmp_path / "paced", csv, 6000, src, **policy)
    kinds = [(h[4] or "").split(":")[0] for h in fast["hook"]]
    # 1st failure: 30 s off, 2nd: 60 s, 3rd: 120 s (skips one candle), 4th: 240 s...
    assert kinds[:5] == ["runtime", "runtime", "runtime", "backoff", "runtime"]
    assert kinds.count("runtime") >= 5
    assert fast == paced
