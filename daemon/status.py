"""What ``marketwake status`` shows, typed from the writer to the reader.

The daemon writes :class:`Status` to ``<state_dir>/status.json`` (atomically)
every ``status_interval_seconds`` and at a stop; ``status`` decodes the same
Structs, so a renamed counter is a type error, not a blank line. Components
add their own part under ``components`` (the hook pipeline: :class:`HooksStatus`).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Literal

import msgspec

from daemon.errors import NOT_JSON, StoreError, WorkspaceFileError
from daemon.events import iso_ms
from daemon.loopwatch import LoopStalls
from daemon.statedir import STATUS_FILE
from daemon.walkeeper import WalStatus
from hooks_runtime.safe_read import read_regular

#: The most of status.json a reader takes (the control socket's answer cap).
MAX_STATUS_BYTES = 64 * 1024 * 1024


class SubscriptionStatus(msgspec.Struct, frozen=True):
    """One bus subscriber's queue."""

    name: str
    patterns: tuple[str, ...]
    depth: int
    max_depth: int
    delivered: int
    coalesced: int
    blocked_publishes: int
    lag_ms: float
    # Events on disk (a lagging agent's overflow), and how many went there in all.
    backlog: int = 0
    spilled: int = 0


class BusStatus(msgspec.Struct, frozen=True):
    """The bus counters."""

    published: int
    delivered: int
    coalesced: int
    subscriptions: tuple[SubscriptionStatus, ...]


class FeedStatus(msgspec.Struct, frozen=True):
    """One feed's liveness and its own counters (``statistics()``, if it keeps any)."""

    name: str
    silent_seconds: float
    errors: int
    finished: bool
    stalled: bool
    stats: dict[str, Any] = {}
    failed: bool = False
    error: str = ""  # why it failed


class HookHealth(msgspec.Struct, frozen=True, kw_only=True):
    """How one hook has fared since the daemon started."""

    evaluations: int = 0
    # Failed evaluations: timeouts apart, every other error kind (runtime, invalid
    # result, memory, crash, compile, oversized request).
    timeouts: int = 0
    errors: int = 0
    # Events skipped while the hook backed off after a failure.
    backoffs: int = 0
    # ok; failing (its last evaluation failed: it backs off); paused (until resumed).
    state: Literal["ok", "failing", "paused"] = "ok"
    last_error: str | None = None


class AgentStatus(msgspec.Struct, frozen=True):
    """One loaded agent: hook revisions, pauses, its queue, files not running."""

    hooks: dict[str, str]
    paused: bool
    paused_hooks: list[str]
    queue_depth: int
    file_errors: dict[str, str] = {}
    # Hooks whose file's revision did not compile (an earlier one may still run).
    compile_errors: dict[str, str] = {}
    # Runs since 00:00 UTC (of the agent's clock) and what LLM runs among them used.
    runs_today: int = 0
    cost_today: float = 0.0
    tokens_in_today: int = 0
    tokens_out_today: int = 0
    # Runs that failed or timed out since the daemon started, those in a row up to the
    # latest run (0: it succeeded), and the last failure's error.
    runs_failed: int = 0
    runs_failing: int = 0
    last_run_error: str = ""
    # Per hook that ran: evaluations, failures, backoffs, pause.
    hook_health: dict[str, HookHealth] = {}
    # Why the agent is behind ("" = it is not), and its events waiting on disk.
    lagging: str = ""
    backlog: int = 0


class AlertsStatus(msgspec.Struct, frozen=True):
    """The ALERT webhook's part of the status (``components["alerts"]``); its URL is
    not in it (a webhook's path often holds its token)."""

    webhook: bool  # [hooks] alert_webhook is set (and posted to: live)
    posted: int = 0
    failed: int = 0  # alerts not delivered after their attempts
    retried: int = 0
    dropped: int = 0  # not posted: its queue was full, or the daemon stopping
    down: bool = False  # the last alert failed: one attempt per alert until one passes
    last_error: str = ""
    # With a durable state dir (the outbox): alerts kept until the webhook has them
    # (None: not kept), kept ones delivered later, kept ones dropped as too old.
    kept: int | None = None
    reposted: int = 0
    expired: int = 0


class HooksStatus(msgspec.Struct, frozen=True):
    """The hook pipeline's part of the status (``components["hooks"]``)."""

    sandbox_layers: list[str]
    evaluations: int
    suppressed: int
    failures: int
    agents: dict[str, AgentStatus]
    config_errors: dict[str, str] = {}
    # Event time: events whose results, evaluated ahead of their turn, were used /
    # did not hold (the account or lastOutputs a hook read had changed).
    lookahead_used: int = 0
    lookahead_missed: int = 0
    # The hook store's failure while it lasts (disk full): decisions that would act
    # are suppressed ("store").
    store_error: str = ""
    # Where the agents' workspaces were (absolute): commands given only the state dir
    # read the same agents (a backtest's or the demo's are not ./agents).
    agents_dir: str = ""


class PositionLine(msgspec.Struct, frozen=True, kw_only=True):
    """One open position of an account; ``mark`` None: no price seen yet (its
    unrealized PnL counts as 0)."""

    symbol: str
    quantity: float
    avg_price: float
    mark: float | None
    unrealized: float
    opened_ms: int


class WorkingOrderLine(msgspec.Struct, frozen=True, kw_only=True):
    """One working order of an account; ``price``: its limit or stop price."""

    client_order_id: str
    symbol: str
    side: str
    order_type: str
    role: str
    volume: float
    filled: float
    price: float | None
    status: str
    created_ms: int


class AccountStatus(msgspec.Struct, frozen=True, kw_only=True):
    """One paper account as of ``as_of_ms`` (the broker's clock: market time on a
    replay). PnL in quote currency, ``realized`` net of ``fees``; ``today`` is
    since 00:00 UTC of that clock. ``orders`` lists the oldest working orders
    (up to :data:`MAX_ORDERS_SHOWN`), ``working_orders`` counts them all."""

    agents: list[str]
    as_of_ms: int
    positions: list[PositionLine] = []
    working_orders: int = 0
    orders: list[WorkingOrderLine] = []
    realized: float = 0.0
    realized_today: float = 0.0
    unrealized: float = 0.0
    fees: float = 0.0
    fills: int = 0
    last_fill_ms: int | None = None


MAX_ORDERS_SHOWN = 20


class Status(msgspec.Struct, frozen=True):
    """The whole status file."""

    pid: int
    started_at: float
    written_at: float
    running: bool
    bus: BusStatus
    feeds: list[FeedStatus]
    state: dict[str, int]
    # What components report about themselves; "hooks" decodes as HooksStatus,
    # "accounts" as AccountStatus by account id.
    components: dict[str, Any] = {}
    run_id: str = ""
    loop: LoopStalls | None = None  # (None: written by a version before it)
    wal: WalStatus | None = None  # the WAL keeper (daemon/walkeeper.py); likewise
    # The daemon was stopped (a signal, embedding code), not stopping by itself at the
    # end of a finite replay once caught up on (so always, live): a replay's agents
    # may not have evaluated all that its feeds published.
    interrupted: bool = False

    @property
    def hooks(self) -> HooksStatus | None:
        """The hook pipeline's part, if it ran (None for an unreadable one)."""
        raw = self.components.get("hooks")
        if raw is None or isinstance(raw, HooksStatus):  # in memory / never ran
            return raw
        try:
            return msgspec.convert(raw, HooksStatus)
        except msgspec.ValidationError:
            return None

    @property
    def alerts(self) -> AlertsStatus | None:
        """The alert webhook's part (None: no hook pipeline, or unreadable)."""
        raw = self.components.get("alerts")
        if raw is None or isinstance(raw, AlertsStatus):
            return raw
        try:
            return msgspec.convert(raw, AlertsStatus)
        except msgspec.ValidationError:
            return None

    @property
    def accounts(self) -> dict[str, AccountStatus]:
        """The paper accounts (``components["accounts"]``), by id; empty when the hook
        pipeline did not run or the part is unreadable."""
        raw = self.components.get("accounts")
        if not isinstance(raw, dict):
            return {}
        if all(isinstance(a, AccountStatus) for a in raw.values()):  # in memory
            return raw
        try:
            return msgspec.convert(raw, dict[str, AccountStatus])
        except msgspec.ValidationError:
            return {}


def render_accounts(accounts: dict[str, AccountStatus]) -> list[str]:
    """What ``status`` prints per paper account: PnL and fills, then each position and
    working order."""
    lines = []
    for account, a in accounts.items():
        names = ", ".join(a.agents)
        by = f"agent{'s' if len(a.agents) > 1 else ''} {names}" if names else "no loaded agent"
        last = f", last {_when(a.last_fill_ms)}" if a.last_fill_ms is not None else ""
        lines.append(
            f"account {account} ({by}) as of {_when(a.as_of_ms)}: "
            f"realized {a.realized:+,.2f} (today {a.realized_today:+,.2f}), "
            f"unrealized {a.unrealized:+,.2f}, fees {a.fees:,.2f}, {a.fills} fills{last}"
        )
        for p in a.positions:
            mark = f"mark {_price(p.mark)}" if p.mark is not None else "no mark yet"
            lines.append(
                f"    {p.symbol} {p.quantity:+.8g} @ {_price(p.avg_price)}, {mark}, "
                f"unrealized {p.unrealized:+,.2f}"
            )
        for o in a.orders:
            price = f" at {_price(o.price)}" if o.price is not None else ""
            part = f", {o.filled:.8g} filled" if o.filled else ""
            lines.append(
                f"    working {o.role} {o.side} {o.volume:.8g} {o.symbol} {o.order_type}"
                f"{price} ({o.status}{part}; {o.client_order_id})"
            )
        if a.working_orders > len(a.orders):
            lines.append(f"    ... and {a.working_orders - len(a.orders)} more working orders")
    return lines


def _when(ms: int) -> str:
    """'DATE TIME' (UTC) of an epoch-ms time."""
    iso = iso_ms(ms)
    return f"{iso[:10]} {iso[11:19]}"


def _price(x: float) -> str:
    """Two decimals for prices from 1 up; six significant digits below (0.0001234)."""
    return f"{x:,.2f}" if abs(x) >= 1 else f"{x:.6g}"


def write_status(state_dir: Path, status: Status) -> None:
    """Write ``status.json`` atomically (temp file + rename); :exc:`StoreError` if it
    cannot be (a full disk: the half-written temp file is removed)."""
    tmp = state_dir / (STATUS_FILE + ".tmp")
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(msgspec.json.format(msgspec.json.encode(status)))
        tmp.replace(state_dir / STATUS_FILE)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise StoreError(f"cannot write {state_dir / STATUS_FILE}: {exc}") from None


def read_status(state_dir: Path) -> Status:
    """The last status written under ``state_dir``; FileNotFoundError if none,
    :exc:`StoreError` if it cannot be read or decoded. Read as a workspace file is (a
    FIFO or a link in its place must not hang ``status``), up to MAX_STATUS_BYTES."""
    path = state_dir / STATUS_FILE
    if not os.path.lexists(path):
        raise FileNotFoundError(path)
    try:
        data = read_regular(path, MAX_STATUS_BYTES, "status.json")
        return msgspec.json.decode(data, type=Status)
    except WorkspaceFileError as exc:  # (it names the file)
        raise StoreError(str(exc)) from None
    except (*NOT_JSON, msgspec.ValidationError) as exc:
        raise StoreError(f"cannot read {path}: {exc}") from None
