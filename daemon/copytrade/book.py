"""The leaders' positions as their signals describe them (sans-I/O).

Every follower reads the same book (``state["copytrade"]["leaders"]``): one
entry per (leader, positionId) from its ``opened`` signal, changed by each
``modified`` (size, price, stop-loss, take-profit) and reduced or removed by
``closed`` (no size: the whole position). Signals may arrive out of order: a
``modified`` or ``closed`` for a position not opened yet is **held** and
applied when the ``opened`` comes. A signal id already applied is ignored
(a redelivery). The last closed positions are kept (a hook evaluating the
``closed`` signal sees what was closed). Bounded: past ``max_positions`` open
positions or held signals the oldest go first, counted in ``dropped``.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Literal

import msgspec

from daemon.events import SignalPayload

Applied = Literal["applied", "held", "resolved", "duplicate", "dropped"]
MAX_POSITIONS = 10_000
MAX_SEEN = 50_000
MAX_CLOSED = 1_000  # closed positions kept, so a close's hook can see what it closed


class LeaderPosition(msgspec.Struct, kw_only=True, rename="camel"):
    """One leader position, as its signals so far describe it."""

    leader: str
    position_id: str
    symbol: str
    side: Literal["long", "short"]
    quantity: float | None = None
    equity_fraction: float | None = None
    price: float | None = None
    stop_loss: float | None = None
    take_profit: float | None = None
    # the leader's equity as its last signal gave it (sizing by equity ratio)
    leader_equity: float | None = None
    # the size at the opening (``fixed`` sizing keeps its proportion through changes)
    opened_quantity: float | None = None
    opened_equity_fraction: float | None = None
    opened_at: str
    updated_at: str
    # opened first, then every modified and partial close, in order
    signal_ids: list[str] = msgspec.field(default_factory=list)


class BookSnapshot(msgspec.Struct, kw_only=True, rename="camel"):
    """What :meth:`LeaderBook.dump` keeps across a restart."""

    positions: list[LeaderPosition] = msgspec.field(default_factory=list)
    held: list[SignalPayload] = msgspec.field(default_factory=list)
    closed: list[LeaderPosition] = msgspec.field(default_factory=list)
    seen: list[tuple[str, str]] = msgspec.field(default_factory=list)  # (leader, signalId)


class LiveBook(msgspec.Struct, frozen=True, kw_only=True):
    """A running daemon's answer to ``copytrade`` on its control socket: the book
    under a key of its own (every member of a snapshot has a default, so an error
    answer would read as an empty book)."""

    book: BookSnapshot


def _key(s: SignalPayload) -> tuple[str, str]:
    return (s.leader, s.position_id)


class LeaderBook:
    """Open leader positions and held signals (see the module doc)."""

    def __init__(self, max_positions: int = MAX_POSITIONS) -> None:
        self.max_positions = max_positions
        self.positions: OrderedDict[tuple[str, str], LeaderPosition] = OrderedDict()
        self.held: OrderedDict[tuple[str, str], list[SignalPayload]] = OrderedDict()
        self.closed: OrderedDict[tuple[str, str], LeaderPosition] = OrderedDict()
        self._seen: OrderedDict[tuple[str, str], None] = OrderedDict()
        self.dropped = 0

    def position(self, leader: str, position_id: str) -> tuple[LeaderPosition, bool] | None:
        """A leader position, open or recently closed, and whether it is open."""
        key = (leader, position_id)
        if key in self.positions:
            return self.positions[key], True
        if key in self.closed:
            return self.closed[key], False
        return None

    def apply(self, s: SignalPayload) -> Applied:
        """Take one signal; what became of it."""
        sid = (s.leader, s.signal_id)
        if sid in self._seen:
            return "duplicate"
        self._seen[sid] = None
        if len(self._seen) > MAX_SEEN:
            self._seen.popitem(last=False)
        key = _key(s)
        if s.kind == "opened" and key not in self.positions:
            self.positions[key] = LeaderPosition(
                leader=s.leader,
                position_id=s.position_id,
                symbol=s.symbol,
                side=s.side,
                quantity=s.quantity,
                equity_fraction=s.equity_fraction,
                price=s.price,
                stop_loss=s.stop_loss,
                take_profit=s.take_profit,
                leader_equity=s.leader_equity,
                opened_quantity=s.quantity,
                opened_equity_fraction=s.equity_fraction,
                opened_at=s.time,
                updated_at=s.time,
                signal_ids=[s.signal_id],
            )
            self._bound(self.positions)
            waiting = self.held.pop(key, [])
            for h in waiting:
                self._change(key, h)
            return "resolved" if waiting else "applied"
        if key not in self.positions:
            self.held.setdefault(key, []).append(s)
            self._bound(self.held)
            return "held"
        self._change(key, s)
        return "applied"

    def _change(self, key: tuple[str, str], s: SignalPayload) -> None:
        """A modified, a close, or a second opened (an add) on an open position."""
        p = self.positions.get(key)
        if p is None:  # closed by an earlier held signal
            return
        p.signal_ids.append(s.signal_id)
        p.updated_at = s.time
        if s.kind == "closed":
            if s.quantity is None or p.quantity is None or s.quantity >= p.quantity - 1e-12:
                self.closed[key] = self.positions.pop(key)
                while len(self.closed) > MAX_CLOSED:
                    self.closed.popitem(last=False)
            else:
                p.quantity -= s.quantity
            return
        if s.kind == "opened" and s.quantity is not None and p.quantity is not None:
            p.quantity += s.quantity  # pyramiding: an add to the same position
        elif s.quantity is not None or s.equity_fraction is not None:
            p.quantity, p.equity_fraction = s.quantity, s.equity_fraction
        for name in ("price", "stop_loss", "take_profit", "leader_equity"):
            value = getattr(s, name)
            if value is not None:
                setattr(p, name, value)

    def _bound(self, table: OrderedDict[Any, Any]) -> None:
        while len(table) > self.max_positions:
            table.popitem(last=False)
            self.dropped += 1

    def export(self) -> dict[str, Any]:
        """Open positions and held signals, oldest first."""
        leaders = [msgspec.to_builtins(p) for p in self.positions.values()]
        return {"leaders": leaders, "held": self.export_held()}

    def export_held(self) -> list[dict[str, Any]]:
        """The held signals, oldest first, for the hooks' view."""
        return [msgspec.to_builtins(s) for ss in self.held.values() for s in ss]

    def dump(self) -> BookSnapshot:
        """For the state snapshot."""
        return BookSnapshot(
            positions=list(self.positions.values()),
            held=[s for ss in self.held.values() for s in ss],
            closed=list(self.closed.values()),
            seen=list(self._seen),
        )

    def load(self, snap: BookSnapshot) -> None:
        """Restore a :meth:`dump` (replacing what is here)."""
        self.positions = OrderedDict(((p.leader, p.position_id), p) for p in snap.positions)
        self.closed = OrderedDict(((p.leader, p.position_id), p) for p in snap.closed)
        self.held = OrderedDict()
        for s in snap.held:
            self.held.setdefault(_key(s), []).append(s)
        self._seen = OrderedDict((pair, None) for pair in snap.seen)
