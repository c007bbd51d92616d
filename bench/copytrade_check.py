"""Real-data check: a leader agent and the shipped follower on real candles, flat out.

    .venv/bin/python bench/copytrade_check.py [--data FILE] [--rows N]

Replays real BTCUSDT 5m candles (``../shared/data``, not part of the repo; March
2026 by default) at speed 0 twice: the demo's leader agent alone (the baseline),
then the leader with ``agents/follower`` copying it through ``[copytrade]
leader_agents``, where every candle settles (fills, signals and copies) before the
next. Prints each account's fills, bought quantity and realized PnL, whether the
leader traded the same in both runs, the follower's share of the leader's size,
and the wall time of each run with the ratio.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import msgspec
from isolation_check import head  # bench/ is on the path when run as a script

from daemon.app import run_daemon
from daemon.config import Config
from daemon.demo import LEADER_HOOK
from daemon.logs import configure
from daemon.trading.paper_store import PaperStore

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data" / "normalized" / "binance_spot_BTCUSDT_5m_2026-03.csv.gz"


def run(root: Path, csv: Path, follower: bool) -> tuple[dict[str, tuple[int, float, float]], float]:
    agents = root / "agents"
    (agents / "leader" / "hooks").mkdir(parents=True)
    (agents / "leader" / "agent.toml").write_text('topics = ["market.candle.closed"]\n')
    (agents / "leader" / "hooks" / "autotrade_ema_trend.py").write_text(LEADER_HOOK)
    if follower:
        shutil.copytree(ROOT / "agents" / "follower", agents / "follower")
        toml = agents / "follower" / "agent.toml"
        toml.write_text(toml.read_text().replace("enabled = false", "enabled = true"))
    cfg = msgspec.convert(
        {
            "daemon": {"state_dir": str(root / "state"), "durable": False},
            "hooks": {"agents_dir": str(agents), "reload_seconds": 3600},
            "copytrade": {"leader_agents": ["leader"] if follower else []},
            "feeds": {
                "replay": {"enabled": True, "path": str(csv), "symbol": "BTCUSDT",
                           "timeframe": "5m", "speed": 0}
            },
        },
        Config,
    )  # fmt: skip
    started = time.perf_counter()
    run_daemon(cfg)
    elapsed = time.perf_counter() - started
    store = PaperStore(root / "state" / "paper.sqlite3")
    try:
        out = {}
        for account in ("leader", "follower") if follower else ("leader",):
            fills = store.fills(account)
            bought = sum(f.qty for f in fills if f.qty > 0)
            out[account] = (
                len(fills),
                round(bought, 8),
                round(store.realized_since(account, 0), 2),
            )
    finally:
        store.close()
    return out, elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--rows", type=int, default=100_000)
    args = ap.parse_args()
    if not args.data.exists():
        raise SystemExit(f"{args.data} not found: this check needs ../shared/data")
    configure("console", "warning")
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        csv = base / "btc_5m.csv"
        rows = head(args.data, csv, args.rows)
        alone, t0 = run(base / "alone", csv, follower=False)
        both, t1 = run(base / "both", csv, follower=True)
    print(f"{rows} candles of {args.data.name}, speed 0")
    for name, (fills, bought, pnl) in (("leader alone", alone["leader"]),
                                       ("leader", both["leader"]),
                                       ("follower", both["follower"])):  # fmt: skip
        print(f"  {name:<13} fills {fills:>5}  bought {bought:>8g}  realized {pnl:>10,.2f}")
    share = both["follower"][1] / both["leader"][1] if both["leader"][1] else 0.0
    print(f"leader trades the same with a follower: {alone['leader'] == both['leader']}")
    print(f"follower's size / leader's: {share:.3f} (0.5 asked, 0.01 BTC a position cap)")
    print(f"wall: leader alone {t0:.1f}s (baseline), with the follower {t1:.1f}s "
          f"(ratio {t1 / t0:.2f}; every candle settles before the next)")  # fmt: skip


if __name__ == "__main__":
    main()
