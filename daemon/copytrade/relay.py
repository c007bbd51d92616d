"""A leader agent's paper account as copy-trade signals (sans-I/O).

``[copytrade] leader_agents`` names agents of this daemon whose trades others
may follow. Their account events become ``copytrade.signal.*`` from leader
``<agent id>``, the same signals the webhook brings from outside:

* a position opening (``account.position.opened``, also the new side of a
  flip) is ``opened``, with the stop-loss and take-profit of the entry that
  opened it; the position id is ``<symbol>:<openedMs>``;
* a fill that adds to an open position is another ``opened`` of the same
  position (pyramiding), one that reduces it without closing is a partial
  ``closed`` of that quantity;
* a position closing (``account.position.closed``) is ``closed``;
* a protective order moved (``account.order.modified`` of a stop-loss or
  take-profit) is ``modified``.

Signal ids come from the account events' ids, so they are stable. After each
close the leader's running record goes out as ``marketplace.strategy.updated``
(closed positions, win rate, realized PnL, max drawdown of realized PnL, signals
published; since the daemon first ran: the pipeline keeps them in the state dir,
see :meth:`LeaderRelay.dump_stats`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

import msgspec

from daemon.events import (
    ACCOUNT_ORDER_FILLED,
    ACCOUNT_ORDER_MODIFIED,
    ACCOUNT_POSITION_CLOSED,
    ACCOUNT_POSITION_OPENED,
    MARKETPLACE_STRATEGY_UPDATED,
    FeedEvent,
    SignalKind,
    SignalPayload,
    iso_ms,
    now_ms,
    signal_event,
)

SOURCE: Final = "copytrade_leader"
EPS: Final = 1e-12
#: Where the pipeline keeps the leader agents' running records, under the state dir.
LEADER_STATS_FILE: Final = "copytrade-leaders.json"
MAX_LEADER_STATS_BYTES: Final = 1024 * 1024


class StrategyStats(msgspec.Struct, kw_only=True, rename="camel"):
    """The payload of ``marketplace.strategy.updated``."""

    leader: str
    closed_positions: int = 0
    wins: int = 0
    win_rate: float = 0.0
    realized_pnl: float = 0.0
    max_drawdown: float = 0.0
    peak_pnl: float = 0.0
    signals: int = 0  # published, of every kind
    last_signal_at: str | None = None  # the newest one's market time


def decode_stats(data: bytes) -> list[StrategyStats]:
    """The records :meth:`LeaderRelay.dump_stats` kept; raises ``msgspec.DecodeError``
    / ``ValidationError`` on bad bytes."""
    return msgspec.json.decode(data, type=list[StrategyStats])


class _Open(msgspec.Struct, kw_only=True):
    position_id: str
    quantity: float  # signed: > 0 long


class LeaderRelay:
    """Turns account events of the leader accounts into signal events."""

    def __init__(
        self,
        leaders: Mapping[str, str],
        equity: Callable[[str], float | None] = lambda account: None,
    ) -> None:
        self.leaders = dict(leaders)  # account -> leader name (the agent id)
        self.equity = equity  # account -> its equity now, as signals' leaderEquity
        self.open: dict[tuple[str, str], _Open] = {}
        self.stats = {name: StrategyStats(leader=name) for name in leaders.values()}
        self._entry: dict[tuple[str, str], dict[str, Any]] = {}  # last fill, for its levels

    def dump_stats(self) -> bytes:
        """The leaders' running records, to keep across restarts."""
        return msgspec.json.encode(list(self.stats.values()))

    def load_stats(self, data: bytes) -> None:
        """Continue the records :meth:`dump_stats` kept (leaders no longer named are
        dropped); raises ``msgspec.DecodeError`` / ``ValidationError`` on bad bytes."""
        for s in decode_stats(data):
            if s.leader in self.stats:
                self.stats[s.leader] = s

    def seed(self, account: str, symbol: str, quantity: float, opened_ms: int) -> None:
        """A position the account already holds at start."""
        self.open[(account, symbol)] = _Open(position_id=f"{symbol}:{opened_ms}", quantity=quantity)

    def on_event(self, event: FeedEvent) -> list[FeedEvent]:
        """The signals (and stats) one account event makes; none for other accounts."""
        leader = self.leaders.get(event.account_id or "")
        if leader is None or event.symbol is None:
            return []
        key, p = (event.account_id or "", event.symbol), event.payload
        if event.topic == ACCOUNT_ORDER_FILLED:
            return self._on_fill(leader, key, event)
        if event.topic == ACCOUNT_POSITION_OPENED:
            qty = float(p["quantity"])
            position_id = f"{event.symbol}:{p['openedMs']}"
            self.open[key] = _Open(position_id=position_id, quantity=qty)
            entry = self._entry.get(key, {})
            return [
                self._signal(
                    leader, event, "opened", position_id, qty, abs(qty), p.get("avgPrice"),
                    stop_loss=entry.get("stopLoss"), take_profit=entry.get("takeProfit"),
                )
            ]  # fmt: skip
        if event.topic == ACCOUNT_POSITION_CLOSED:
            self.open.pop(key, None)
            qty = float(p["quantity"])
            position_id = f"{event.symbol}:{p['openedMs']}"
            out = [
                self._signal(leader, event, "closed", position_id, qty, None, p.get("closePrice"))
            ]
            return [*out, self._record(leader, float(p.get("realizedPnl") or 0.0), event)]
        if event.topic == ACCOUNT_ORDER_MODIFIED and p.get("role") in ("stop_loss", "take_profit"):
            held = self.open.get(key)
            if held is None:
                return []
            level = p.get("stopPrice") if p["role"] == "stop_loss" else p.get("limitPrice")
            levels = {"stop_loss" if p["role"] == "stop_loss" else "take_profit": level}
            return [
                self._signal(leader, event, "modified", held.position_id, held.quantity, None,
                             None, **levels)
            ]  # fmt: skip
        return []

    def _on_fill(self, leader: str, key: tuple[str, str], event: FeedEvent) -> list[FeedEvent]:
        """Adds and partial reductions; opening and closing fills are left to the
        position events that follow them."""
        p = event.payload
        self._entry[key] = p
        held = self.open.get(key)
        if held is None or p.get("role") not in ("entry", "close"):
            return []
        size = p.get("lastFillVolume") or p["volume"]  # one part of an order filled in parts
        signed = float(size) * (1.0 if p["side"] == "buy" else -1.0)
        after = held.quantity + signed
        if abs(after) < EPS or (after > 0) != (held.quantity > 0):
            return []  # a close or a flip: account.position.closed / opened follow
        before, held.quantity = held.quantity, after
        if abs(after) > abs(before):  # an add, with the levels of its own entry
            levels = {"stop_loss": p.get("stopLoss"), "take_profit": p.get("takeProfit")}
            return [
                self._signal(leader, event, "opened", held.position_id, before, abs(signed),
                             p.get("fillPrice"), **levels)
            ]  # fmt: skip
        return [
            self._signal(leader, event, "closed", held.position_id, before, abs(signed),
                         p.get("fillPrice"))
        ]  # fmt: skip

    def _signal(
        self,
        leader: str,
        event: FeedEvent,
        kind: SignalKind,
        position_id: str,
        signed_qty: float,
        quantity: float | None,
        price: Any,
        *,
        stop_loss: Any = None,
        take_profit: Any = None,
    ) -> FeedEvent:
        signal_id = event.event_id.split(":", 1)[-1][:128]
        stats = self.stats[leader]
        stats.signals += 1
        stats.last_signal_at = event.ts
        signal = SignalPayload(
            leader=leader,
            signal_id=signal_id,
            kind=kind,
            position_id=position_id,
            symbol=event.symbol or "",
            side="long" if signed_qty > 0 else "short",
            time=event.ts,
            quantity=quantity,
            price=float(price) if price is not None else None,
            stop_loss=float(stop_loss) if stop_loss is not None else None,
            take_profit=float(take_profit) if take_profit is not None else None,
            leader_equity=self.equity(event.account_id or ""),
        )
        return signal_event(signal, SOURCE, now_ms())

    def _record(self, leader: str, realized: float, event: FeedEvent) -> FeedEvent:
        s = self.stats[leader]
        s.closed_positions += 1
        s.wins += realized > 0
        s.win_rate = round(s.wins / s.closed_positions, 6)
        s.realized_pnl = round(s.realized_pnl + realized, 10)
        s.peak_pnl = max(s.peak_pnl, s.realized_pnl)
        s.max_drawdown = round(max(s.max_drawdown, s.peak_pnl - s.realized_pnl), 10)
        return FeedEvent(
            event_id=f"strategy:{leader}:{event.event_id.split(':', 1)[-1]}",
            ts=event.ts,
            source=SOURCE,
            topic=MARKETPLACE_STRATEGY_UPDATED,
            payload=msgspec.to_builtins(s),
            partition_key=f"strategy:{leader}",
            received_ts=iso_ms(now_ms()),
        )
