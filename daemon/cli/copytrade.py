"""``marketwake copytrade status``: leaders, lag, what each follower mirrored, last actions.

Read-only, from the state dir the daemon writes (run it as the service user):
the webhook's inbox (signals per leader and the newest one's lag), the state
snapshot's leaders' book (open leader positions), the paper broker's orders
(what each follower agent made of each position, and where it drifts) and the
audit log (the last signals: the doors' answers and the leader agents' signals).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import click
import msgspec

from daemon.agents.workspace import AgentConfig, load_agent_config
from daemon.audit.reader import AuditFilter, tail
from daemon.cli.common import echo, echo_json, load_config_or_defaults, state_dir_option
from daemon.config import Config
from daemon.control import CONTROL_SOCKET, ask
from daemon.copytrade.book import BookSnapshot, LiveBook
from daemon.copytrade.mirror import mirrored
from daemon.copytrade.relay import (
    LEADER_STATS_FILE,
    MAX_LEADER_STATS_BYTES,
    StrategyStats,
    decode_stats,
)
from daemon.copytrade.view import checks
from daemon.errors import NOT_JSON, MarketwakeError, StoreError, WorkspaceFileError
from daemon.events import COPYTRADE_SIGNAL_OPENED, iso_ms, parse_iso_ms, topic_matches
from daemon.state import StateCache, read_snapshot
from daemon.statedir import SNAPSHOT_FILE, holder
from daemon.status import read_status
from daemon.trading.paper_store import PaperStore
from daemon.trading.portfolio import Order
from feeds.copytrade import CopytradeWebhookFeed, TradingViewFeed
from hooks_runtime.safe_read import read_regular


@click.group("copytrade")
def copytrade_group() -> None:
    """Copy trading: leaders' signals and what followers made of them."""


def followers(root: Path) -> dict[str, AgentConfig]:
    """Agent id -> its config, for the agents under ``root`` whose topics take leader
    signals."""
    out: dict[str, AgentConfig] = {}
    for toml in sorted(root.glob("*/agent.toml")) if root.is_dir() else []:
        try:
            agent = load_agent_config(toml)
        except MarketwakeError:
            continue  # `config check` reports it
        if agent.enabled and any(topic_matches(p, COPYTRADE_SIGNAL_OPENED) for p in agent.topics):
            out[toml.parent.name] = agent
    return out


class StoredAccounts:
    """The paper accounts as the broker's store holds them (read while the daemon
    runs: marks are as of its last fill or stop)."""

    def __init__(self, store: PaperStore) -> None:
        self.store = store
        self.marks = store.marks()
        self.books = store.positions()

    def get_order(self, client_order_id: str) -> Order | None:
        return self.store.get_order(client_order_id)

    def last_price(self, symbol: str, account: str | None = None) -> float | None:
        return self.marks.get(symbol)

    def pnl(self, account: str) -> float:
        unrealized = sum(
            (self.marks.get(s, p.avg_price) - p.avg_price) * p.quantity
            for s, p in self.books.get(account, {}).items()
        )
        return self.store.realized_since(account, 0) + unrealized


def gather(
    cfg: Config, last: int, state_dir: Path | None = None, agents_dir: Path | None = None
) -> dict[str, Any]:
    """Everything the status shows, as plain data (``--json`` prints it); the state
    under ``state_dir`` (default: the config's; given, its audit log is under it too),
    the follower agents under ``agents_dir`` (default: the config's)."""
    audit_dir = state_dir / "audit" if state_dir is not None else cfg.audit_dir
    state_dir = state_dir or Path(cfg.daemon.state_dir)
    leaders: list[dict[str, Any]] = []
    configured = sorted({*cfg.feeds.copytrade_webhook.leaders, *cfg.feeds.tradingview.hooks})
    seen: dict[str, dict[str, Any]] = {}
    for door in (CopytradeWebhookFeed, TradingViewFeed):
        inbox_path = state_dir / door.inbox_file
        if not inbox_path.exists():
            continue
        inbox = door.inbox_type(inbox_path)
        try:
            for a in inbox.activity():
                sent = parse_iso_ms(a.last.ts)
                seen[a.leader] = {
                    "leader": a.leader,
                    "signals": a.signals,
                    "unpublished": a.unpublished,
                    "lastEventId": a.last.event_id,
                    "lastTopic": a.last.topic,
                    "lastTime": a.last.ts,
                    "lastReceived": iso_ms(a.last_received_ms),
                    "lagSeconds": round((a.last_received_ms - sent) / 1000, 3),
                }
        finally:
            inbox.close()
    cache = StateCache()
    live = _live_book(state_dir)
    as_of = None  # the positions and drift: the running daemon's, else the snapshot's
    if live is not None:
        cache.copytrade.load(live)
        as_of = "now"
    elif (snapshot := read_snapshot(state_dir / SNAPSHOT_FILE)) is not None:
        cache.load(snapshot)
        as_of = _written_at(state_dir / SNAPSHOT_FILE)
    positions = cache.copytrade.export()["leaders"]

    # Leader agents of this daemon: their signals never pass an inbox; their running
    # records (closed positions, win rate, PnL) are kept in the state dir.
    records = {r.leader: r for r in _leader_records(state_dir / LEADER_STATS_FILE)}
    agent_leaders = {*cfg.copytrade.leader_agents, *records}
    holding = Counter(str(p["leader"]) for p in positions)
    for name in sorted({*configured, *seen, *agent_leaders, *holding}):
        entry = seen.get(name, {"leader": name, "signals": 0})
        entry["openPositions"] = holding.get(name, 0)
        if name in agent_leaders:
            entry["agent"] = True
            if name in records:
                entry["record"] = msgspec.to_builtins(records[name])
                entry["signals"] = records[name].signals
                entry["lastTime"] = records[name].last_signal_at
        leaders.append(entry)

    agents = followers(agents_dir or Path(cfg.hooks.agents_dir))
    paper_path = state_dir / "paper.sqlite3"
    store = PaperStore(paper_path) if paper_path.exists() and agents else None
    drift: list[dict[str, Any]] = []
    try:
        for position in positions:
            position["followers"] = {}
            for agent_id, agent in agents.items():
                got: dict[str, Any] = {"orders": {}, "quantity": 0.0}
                if store is not None:
                    got = mirrored(agent_id, agent.account or agent_id, position, store.get_order)
                position["followers"][agent_id] = got
        if store is not None:
            drift = _drift(agents, cache, StoredAccounts(store))
    finally:
        if store is not None:
            store.close()

    rows = tail(audit_dir, AuditFilter(types=frozenset({"signal"})), n=last)
    return {
        "leaders": leaders,
        "positions": positions,
        "positionsAsOf": as_of,
        "drift": drift,
        "lastSignals": rows,
    }


def _live_book(state_dir: Path) -> BookSnapshot | None:
    """The running daemon's leaders' book, asked over its control socket; None when no
    daemon runs there, or it does not answer with one."""
    if holder(state_dir) is None:
        return None
    raw = ask(state_dir / CONTROL_SOCKET, "copytrade")
    if not raw:
        return None
    try:
        return msgspec.json.decode(raw, type=LiveBook).book
    except (*NOT_JSON, msgspec.ValidationError):
        return None  # an older daemon (an error answer): the snapshot, as before


def _written_at(path: Path) -> str | None:
    """When ``path`` was last written (None: it is gone since it was read)."""
    try:
        return iso_ms(int(path.stat().st_mtime * 1000))
    except OSError:
        return None


def agents_dir_of(state_dir: Path) -> Path | None:
    """The agents directory of the daemon (or backtest, or demo) that wrote
    ``state_dir``, as its last status says; None when it says nothing."""
    try:
        hooks = read_status(state_dir).hooks
    except (FileNotFoundError, StoreError):
        return None
    return Path(hooks.agents_dir) if hooks is not None and hooks.agents_dir else None


def _leader_records(path: Path) -> list[StrategyStats]:
    """The leader agents' records the daemon keeps; none when there is no such file,
    or it is not a small regular file, or it does not decode (said on stderr)."""
    if not os.path.lexists(path):
        return []
    try:
        return decode_stats(read_regular(path, MAX_LEADER_STATS_BYTES, "the leader records"))
    except (WorkspaceFileError, *NOT_JSON, msgspec.ValidationError) as exc:
        echo(f"warning: leader records not shown: {exc}", err=True)
        return []


def _drift(
    agents: dict[str, AgentConfig], cache: StateCache, stored: StoredAccounts
) -> list[dict[str, Any]]:
    """Each follower's drifts, found as its reconciliation would find them."""
    found: list[dict[str, Any]] = []
    for agent_id, agent in agents.items():
        account = agent.account or agent_id
        for check in checks(agent_id, account, agent.copytrade, cache.copytrade, stored):
            if check.drift is not None:
                d = msgspec.to_builtins(check.drift)
                found.append({"agent": agent_id, **d, "open": check.row["open"]})
    return found


@copytrade_group.command("status")
@click.option("--config", "config_path", type=click.Path(path_type=Path), help="Config file.")
@state_dir_option
@click.option(
    "--last",
    default=10,
    type=click.IntRange(min=0),
    show_default=True,
    help="How many last signals (door answers and leader agents' signals).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
def copytrade_status(
    config_path: Path | None, state_dir: Path | None, last: int, as_json: bool
) -> None:
    """Leaders (signals, the newest one's lag), open leader positions with what each
    follower agent mirrored of them, drift, and the last signals (door answers,
    leader agents' signals)."""
    if state_dir is not None and not state_dir.is_dir():
        raise click.ClickException(f"no state dir at {state_dir}: has the daemon run?")
    cfg = load_config_or_defaults(config_path)
    agents_dir = None
    if config_path is None and state_dir is not None:
        agents_dir = agents_dir_of(state_dir)
    data = gather(cfg, last, state_dir, agents_dir)
    if as_json:
        echo_json(json.dumps(data, indent=2))
        return
    echo("LEADERS")
    if not data["leaders"]:
        echo(
            "  none configured ([feeds.copytrade_webhook.leaders.<name>], "
            "[feeds.tradingview.hooks.<name>], [copytrade] leader_agents)"
        )
    for leader in data["leaders"]:
        held = leader["openPositions"]
        holds = f"; {held} open position{'s' if held != 1 else ''}" if held else ""
        if leader.get("agent"):
            r = leader.get("record")
            sent = leader["signals"]
            signals = f"; {sent} signal{'s' if sent != 1 else ''}" if sent else "; no signals yet"
            if sent and leader.get("lastTime"):
                signals += f", last at {leader['lastTime']}"
            echo(
                f"  {leader['leader']}: an agent of this daemon"
                + (
                    f": {r['closedPositions']} closed position"
                    f"{'s' if r['closedPositions'] != 1 else ''}, win rate {r['winRate']:.0%}, "
                    f"realized PnL {r['realizedPnl']:+.2f}, max drawdown {r['maxDrawdown']:.2f}"
                    if r and r["closedPositions"]
                    else ": no position closed yet"
                )
                + signals
                + holds
            )
            continue
        if not leader["signals"]:
            echo(f"  {leader['leader']}: no signals yet{holds}")
            continue
        echo(
            f"  {leader['leader']}: {leader['signals']} signals, last {leader['lastEventId']} "
            f"({leader['lastTopic'].rsplit('.', 1)[-1]}) at {leader['lastTime']}, "
            f"received {leader['lagSeconds']:+.1f} s later"
            + (f", {leader['unpublished']} not yet published" if leader["unpublished"] else "")
        )
    when = data["positionsAsOf"]
    if when == "now":
        echo("OPEN LEADER POSITIONS (as of now: asked the running daemon)")
    elif when:
        echo(
            f"OPEN LEADER POSITIONS (the state snapshot of {when}, the daemon's last: "
            "it writes one every [daemon] status_interval_seconds)"
        )
    else:
        echo("OPEN LEADER POSITIONS (no state snapshot: the daemon has not written one)")
    if not data["positions"]:
        echo("  none")
    for p in data["positions"]:
        size = p["quantity"] if p["quantity"] is not None else f"{p['equityFraction']} of equity"
        mirrored_by = ", ".join(
            f"{agent} {got['quantity']:g}" for agent, got in p["followers"].items()
        )
        echo(
            f"  {p['leader']}/{p['positionId']}: {p['side']} {size} {p['symbol']}"
            f" (signals {', '.join(p['signalIds'])})"
            + (f"; mirrored: {mirrored_by}" if mirrored_by else "")
        )
    if data["drift"]:
        echo("DRIFT")
        for d in data["drift"]:
            state = "" if d["open"] else " (closed by the leader)"
            echo(
                f"  {d['agent']} on {d['leader']}/{d['positionId']}{state}: "
                f"holds {d['held']:g} {d['symbol']}, target {d['target']:g}"
            )
    echo("LAST SIGNALS")
    if not data["lastSignals"]:
        echo("  none")
    for r in data["lastSignals"]:
        reason = f": {r['reason']}" if r.get("reason") else ""
        echo(
            f"  {r['ts']} {r['leader']}/{r.get('signalId') or '?'} "
            f"{r['status']} ({r.get('httpStatus') or 'a leader agent'}){reason}"
            + (f", leader's time {r['eventTs']}" if r.get("eventTs") else "")
        )
