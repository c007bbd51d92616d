"""The paper broker: simulated execution against the live (or replayed) market.

Orders are recorded in SQLite as PENDING_SUBMIT before anything else happens,
then opened (``account.order.placed``), then filled by the rules in
:mod:`daemon.trading.matching` as ticks and closed candles arrive. An entry
with a stop-loss and/or take-profit grows bracket children when it fills
(one cancels the other). Positions are netted per symbol within an account:
every agent trades its own account unless its ``agent.toml`` shares one, so one
agent's orders, fills, PnL and risk state never depend on another's.

Market data reaches the broker on its own route (:mod:`daemon.trading.route`),
once and in order per partition, whatever the agents do; resting orders fill
with no agent running.

Clock: order times and "today" follow the market clock, the latest event
timestamp seen (wall clock until the first event), so a replay fills the same
way as the live run it recorded. Use :meth:`PaperBroker.now_ms` as the
``now`` for the risk engine.

Events are published after the database commit. A crash between the two loses
the event, never the order or the fill (the state is what the store says).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import anyio
import msgspec
import structlog

from daemon import events as ev
from daemon.errors import BrokerError, StoreError
from daemon.events import Candle, FeedEvent, Publish
from daemon.logs import Outage
from daemon.trading.amend import amended, misfit
from daemon.trading.broker import Broker, OrderRequest, child_order_id
from daemon.trading.intents import TradeIntent
from daemon.trading.matching import (
    Applied,
    FillCosts,
    apply_fill,
    candle_fill,
    marketable_price,
    tick_fill,
)
from daemon.trading.paper_store import PaperStore
from daemon.trading.portfolio import (
    WORKING,
    FillTotals,
    Order,
    OrderRole,
    PortfolioView,
    Position,
)

SOURCE = "paper"
log = structlog.get_logger("paper")

_CHILD_ROLES: frozenset[str] = frozenset({"stop_loss", "take_profit"})


def _utc_midnight(ms: int) -> int:
    day = datetime.fromtimestamp(ms / 1000, tz=UTC).replace(
        hour=0, minute=0, second=0, microsecond=0
    )
    return int(day.timestamp() * 1000)


class _Cursor(msgspec.Struct, kw_only=True):
    """One view of the market: marks, when each was taken (this run), the market
    clock, and the last event applied per partition (each applied once, in order)."""

    marks: dict[str, float]
    mark_ms: dict[str, int] = msgspec.field(default_factory=dict)
    market_ms: int = 0
    applied: dict[str, tuple[int, str]] = msgspec.field(default_factory=dict)

    def price_now(self, symbol: str) -> float | None:
        """The price an order arriving now fills at: one seen in this run. The store's
        last price (the last fill's, maybe hours old after a restart) is not a
        market: the order waits for the next."""
        return self.marks.get(symbol) if symbol in self.mark_ms else None

    def advance(self, symbol: str, price: float, ts_ms: int) -> None:
        self.marks[symbol] = price
        self.mark_ms[symbol] = max(self.mark_ms.get(symbol, 0), ts_ms)
        self.market_ms = max(self.market_ms, ts_ms)

    def copy(self) -> _Cursor:
        return _Cursor(
            marks=dict(self.marks),
            mark_ms=dict(self.mark_ms),
            market_ms=self.market_ms,
            applied=dict(self.applied),
        )


class PaperBroker:
    """A simulated broker persisted under ``state_dir`` (``paper.sqlite3``)."""

    name = "paper"

    def __init__(
        self,
        state_dir: Path,
        publish: Publish,
        *,
        clock: Callable[[], int] | None = None,
        synchronous: Literal["OFF", "NORMAL", "FULL"] = "FULL",
        sync_before_emit: bool = False,
        max_participation: float = 0.0,
        costs: FillCosts | None = None,
    ) -> None:
        self._store = PaperStore(Path(state_dir) / "paper.sqlite3", synchronous)
        # With ``sync_before_emit`` (and the store NORMAL: its commits do not sync),
        # the account events of what was committed wait for a sync of the store in a
        # worker thread, and leave in commit order: no event, and no answer to
        # submit/cancel/modify, tells of an order or a fill the disk may still lose
        # (docs/trading.md, "Store"), and the event loop never waits for the disk (a
        # FULL commit's fdatasync took it up to ~4.5 ms idle, far longer under load).
        self._sync_before_emit = sync_before_emit
        self._unsynced: list[list[FeedEvent]] = []  # committed, in commit order
        self._emit_lock = anyio.Lock()
        self.syncs = 0
        self._sync_outage = Outage(log, "paper store not synced", "paper store syncs again")
        # The share of a closed candle's volume one order may fill in that candle
        # (0: fills whole); the rest keeps working, filled in parts.
        self.max_participation = max_participation
        self.costs = costs or FillCosts()
        self._publish = publish
        self._clock = clock
        # The market as each cursor has seen it: "" for every account without its
        # own (all of them live), an account's own on event time (open_cursor).
        self._cursors = {"": _Cursor(marks=self._store.marks())}
        self._working = {o.client_order_id: o for o in self._store.working_orders()}
        self._books = self._store.positions()  # account -> symbol -> position
        self.ignored_events = 0

    # --- cursors ------------------------------------------------------------

    def open_cursor(self, account: str) -> None:
        """From now on ``account``'s orders trade on the market events given with
        ``cursor=account`` only, starting from the shared cursor's view."""
        if account and account not in self._cursors:
            self._cursors[account] = self._cursors[""].copy()

    def _cursor(self, account: str | None) -> _Cursor:
        return self._cursors.get(account or "") or self._cursors[""]

    def _cursor_key(self, account: str) -> str:
        return account if account in self._cursors else ""

    # --- queries ------------------------------------------------------------

    def now_ms(self, account: str | None = None) -> int:
        """The broker's clock: the injected one, else the market clock (as the
        account's cursor has seen it)."""
        if self._clock is not None:
            return self._clock()
        return self._cursor(account).market_ms or ev.now_ms()

    def get_order(self, client_order_id: str) -> Order | None:
        """The order with this id, if recorded."""
        return self._store.get_order(client_order_id)

    def orders(self) -> list[Order]:
        """Every recorded order, oldest first."""
        return self._store.all_orders()

    def accounts(self) -> list[str]:
        """Accounts with an open position or a working order."""
        return sorted({*self._books, *(o.account_id for o in self._working.values())})

    def positions(self, account: str) -> dict[str, Position]:
        """The account's open positions by symbol."""
        return dict(self._books.get(account, {}))

    def open_orders(self, account: str) -> tuple[Order, ...]:
        """The account's working orders (entries and their stop-loss / take-profit)."""
        return tuple(o for o in self._working.values() if o.account_id == account)

    def last_price(self, symbol: str, account: str | None = None) -> float | None:
        """The last price seen for ``symbol`` (by the account's cursor)."""
        return self._cursor(account).marks.get(symbol)

    def unrealized_pnl(self, account: str) -> float:
        """Mark-to-market PnL of the account's open positions."""
        marks = self._cursor(account).marks
        return sum(
            (marks.get(s, p.avg_price) - p.avg_price) * p.quantity
            for s, p in self._books.get(account, {}).items()
        )

    def realized_pnl(self, account: str, since_ms: int = 0) -> float:
        """Realized PnL of the account's fills since ``since_ms``."""
        return self._store.realized_since(account, since_ms)

    def fill_totals(self, account: str) -> FillTotals:
        """The account's fills summed: count, realized PnL net of fees, fees, last time."""
        return self._store.fill_totals(account)

    def pnl(self, account: str) -> float:
        """Realized PnL of every fill of the account plus its unrealized PnL."""
        return self.realized_pnl(account) + self.unrealized_pnl(account)

    def view(self, account: str) -> PortfolioView:
        """The risk engine's input for ``account`` as of :meth:`now_ms`."""
        now = self.now_ms(account)
        realized = self._store.realized_since(account, _utc_midnight(now))
        return PortfolioView(
            positions=self.positions(account),
            open_orders=self.open_orders(account),
            marks=dict(self._cursor(account).marks),
            pnl_today=realized + self.unrealized_pnl(account),
            recent_order_ms=tuple(self._store.order_times_since(account, now - 60_000)),
        )

    # --- commands -----------------------------------------------------------

    async def submit(self, request: OrderRequest) -> Order:
        """Record, then open (and maybe fill) the order; a known id returns what we have."""
        existing = self._store.get_order(request.client_order_id)
        if existing is not None and existing.status != "PENDING_SUBMIT":
            return existing
        order = existing or self._record(request)
        return await self._open(order)

    async def recover(self, *, as_recorded: bool = False) -> list[Order]:
        """Finish orders recorded but never opened (a crash between the two).

        ``as_recorded`` (event time: a replay's market is not the wall clock's) opens
        each at the time and price it was recorded at, as it would have been without
        the crash; otherwise now, at the last known price (live: the venue gets it
        late)."""
        pending = [o for o in self._working.values() if o.status == "PENDING_SUBMIT"]
        return [await self._open(o, as_recorded=as_recorded) for o in pending]

    async def cancel(self, client_order_id: str) -> Order:
        """Cancel a working order."""
        order = self._working.get(client_order_id)
        if order is None:
            known = self._store.get_order(client_order_id)
            state = f"is {known.status}" if known else "is unknown"
            raise BrokerError(f"cannot cancel order {client_order_id}: it {state}")
        out: list[FeedEvent] = []
        with self._store.transaction():
            self._cancel(order, "canceled by request", self.now_ms(order.account_id), out)
        await self._emit(out)
        return self._store.get_order(client_order_id) or order

    async def modify(self, client_order_id: str, change: TradeIntent) -> Order:
        """Change a working order (see :mod:`daemon.trading.amend`); a limit moved
        through the market fills at once, as a new one would."""
        order = self._working.get(client_order_id)
        if order is None or order.status != "OPEN":
            raise BrokerError(f"cannot modify order {client_order_id}: it is not open")
        why = misfit(order, change)
        if why is not None:
            raise BrokerError(why)
        out: list[FeedEvent] = []
        changed = amended(order, change, max(self.now_ms(order.account_id), order.updated_ms))
        digest = hashlib.blake2b(msgspec.json.encode(changed), digest_size=6).hexdigest()
        last = self._cursor(order.account_id).price_now(order.symbol)
        fill = marketable_price(changed, last) if last is not None else None
        with self._store.transaction():  # the change and a fill it causes: both or neither
            self._save(changed)
            out.append(self._order_event(ev.ACCOUNT_ORDER_MODIFIED, changed, f"modified:{digest}"))
            if changed.role == "entry":  # filled in part: its bracket is live, move it too
                for role, level in (
                    ("stop_loss", change.stop_loss),
                    ("take_profit", change.take_profit),
                ):
                    child = self._working.get(child_order_id(order.client_order_id, role))
                    if level is not None and child is not None:
                        moved = amended(child, change, changed.updated_ms)
                        self._save(moved)
                        out.append(
                            self._order_event(
                                ev.ACCOUNT_ORDER_MODIFIED, moved, f"modified:{digest}"
                            )
                        )
            if fill is not None and changed.role == "entry":
                self._fill_in_txn(changed, fill, changed.updated_ms, out, arrival=True)
        await self._emit(out)
        return self._store.get_order(client_order_id) or changed

    async def on_market_event(self, event: FeedEvent, cursor: str = "") -> None:
        """Take prices from ticks and closed candles (trades that fill orders) and from
        movers (a mark only: a scanner's agent may trade a product no feed follows),
        for the orders of ``cursor``'s accounts (see :meth:`open_cursor`)."""
        c = self._cursors.get(cursor)
        if c is None:
            return
        if event.symbol is None or event.topic not in (
            ev.MARKET_PRICE_TICK,
            ev.MARKET_CANDLE_CLOSED,
            ev.MARKET_MOVERS_DETECTED,
        ):
            return
        try:
            ts = ev.parse_iso_ms(event.ts)
        except ValueError:
            self.ignored_events += 1
            return
        # Several agents hand the broker the same market events, each in its own
        # order: apply each partition's events once, oldest first.
        last = c.applied.get(event.partition)
        if last is not None and (ts < last[0] or (ts == last[0] and event.event_id == last[1])):
            return
        c.applied[event.partition] = (ts, event.event_id)
        if event.topic == ev.MARKET_MOVERS_DETECTED:
            mover = ev.mover_of(event.payload)
            if mover is None:
                self.ignored_events += 1
            elif ts >= c.mark_ms.get(event.symbol, 0):  # never over a newer price
                c.advance(event.symbol, mover.price, ts)
            return
        if event.topic == ev.MARKET_PRICE_TICK:
            tick = ev.tick_of(event.payload)
            if tick is None:
                self.ignored_events += 1
            elif tick.stale_after_reconnect:
                c.advance(event.symbol, tick.price, ts)  # a snapshot, not a trade: mark only
            else:
                await self.on_tick(event.symbol, tick.price, ts, cursor)
            return
        candle = ev.candle_of(event.payload)
        if candle is None or not candle.consistent or candle.close <= 0:
            self.ignored_events += 1
            return
        # The event's time is the close the broker fills at (the payload's is the same
        # for every feed we have; the event's is what the route ordered by).
        candle = msgspec.structs.replace(candle, close_time_ms=ts)
        await self.on_candle(event.symbol, candle, cursor)

    async def on_tick(self, symbol: str, price: float, ts_ms: int, cursor: str = "") -> None:
        """A trade at ``price``: update the mark, fill what it reaches."""
        self._cursors[cursor].advance(symbol, price, ts_ms)
        out: list[FeedEvent] = []
        orders = self._symbol_orders(symbol, cursor=cursor)
        self._expire(orders, ts_ms, ts_ms, out)
        for order in orders:
            stale = order.created_ms > ts_ms and order.order_type != "market"
            if order.status != "OPEN" or stale:
                continue  # a tick older than a resting order cannot have traded against it
            fill = tick_fill(order, price)
            if fill is not None and order.client_order_id in self._working:
                self._fill_in_txn(order, fill, ts_ms, out)
        await self._emit(out)

    async def on_candle(self, symbol: str, candle: Candle, cursor: str = "") -> None:
        """A closed candle: entries first, then brackets with the stop before the target.

        A bracket born inside this candle may only be stopped out in it (we cannot
        know the target traded after the entry; the loss we must assume).
        """
        self._cursors[cursor].advance(symbol, candle.close, candle.close_time_ms)
        out: list[FeedEvent] = []
        filled_now: set[str] = set()
        entries = self._symbol_orders(symbol, entries=True, cursor=cursor)
        for order in entries:
            if order.expires_ms is not None and order.expires_ms <= candle.open_time_ms:
                continue  # it expired before any of the candle's trades
            fill = candle_fill(order, candle)
            if fill is not None and order.status == "OPEN":
                part = self._part(order, candle)
                self._fill_in_txn(order, fill, candle.close_time_ms, out, part)
                filled_now.add(order.client_order_id)
        # An entry that expired within the candle may have traded in it (above); what
        # is left of it, and of one that expired before it, is canceled now.
        self._expire(entries, candle.close_time_ms, candle.close_time_ms, out)
        for order in self._symbol_orders(symbol, entries=False, cursor=cursor):
            if order.client_order_id not in self._working:
                continue  # its sibling filled earlier in this loop
            if order.parent_id in filled_now and order.role == "take_profit":
                continue
            fill = candle_fill(order, candle)
            if fill is not None:
                self._fill_in_txn(order, fill, candle.close_time_ms, out)
        await self._emit(out)

    def close(self) -> None:
        """Save marks (each symbol's newest, whichever cursor saw it) and close the store;
        marks that cannot be saved are logged, not raised (the stop goes on)."""
        marks: dict[str, tuple[int, float]] = {}
        for c in self._cursors.values():
            for symbol, price in c.marks.items():
                at = c.mark_ms.get(symbol, 0)
                if symbol not in marks or at > marks[symbol][0]:
                    marks[symbol] = (at, price)
        try:
            with self._store.transaction():
                self._store.put_marks({s: price for s, (_, price) in marks.items()})
        except StoreError as exc:  # (a full disk) a price cache: the next prices refill it
            log.error("paper marks not saved at the stop", error=str(exc))
        finally:
            self._store.close()

    # --- internals ----------------------------------------------------------

    def _symbol_orders(
        self, symbol: str, entries: bool | None = None, cursor: str = ""
    ) -> list[Order]:
        orders = [
            o
            for o in self._working.values()
            if o.symbol == symbol and self._cursor_key(o.account_id) == cursor
        ]
        if entries is not None:
            orders = [o for o in orders if (o.role in _CHILD_ROLES) != entries]
        return sorted(orders, key=lambda o: (o.role == "take_profit", o.created_ms))

    def _record(self, request: OrderRequest) -> Order:
        """Write the order as PENDING_SUBMIT; this commit is what prevents a double submit."""
        intent = request.intent
        if intent.action == "CLOSE_POSITION" or intent.side is None or intent.volume is None:
            raise BrokerError("resolve CLOSE_POSITION with the risk engine before submitting")
        now = self.now_ms(request.account)
        order = Order(
            client_order_id=request.client_order_id,
            agent_id=request.agent_id,
            account_id=request.account,
            symbol=intent.symbol,
            side=intent.side,
            order_type="limit" if intent.is_limit else "market",
            role=request.role,
            volume=intent.volume,
            status="PENDING_SUBMIT",
            created_ms=now,
            updated_ms=now,
            limit_price=intent.open_price if intent.is_limit else None,
            stop_loss=intent.stop_loss,
            take_profit=intent.take_profit,
            trace_id=request.trace_id,
            reason=intent.comment,
            expires_ms=(
                None
                if intent.expires_in_seconds is None
                else now + round(intent.expires_in_seconds * 1000)
            ),
        )
        last = self._cursor(request.account).marks.get(intent.symbol)
        with self._store.transaction():
            self._store.put_order(order)
            if last is not None:
                self._store.put_arrival(order.client_order_id, last)
        self._working[order.client_order_id] = order
        return order

    async def _open(self, order: Order, *, as_recorded: bool = False) -> Order:
        """'Send' the order to the simulated venue, then fill it if it is marketable
        (``as_recorded``: at the time and price it was recorded at, see :meth:`recover`)."""
        out: list[FeedEvent] = []
        now = order.created_ms if as_recorded else self.now_ms(order.account_id)
        if order.expires_ms is not None and order.expires_ms <= now:  # (recovered late)
            with self._store.transaction():
                self._cancel(order, f"expired: good till {ev.iso_ms(order.expires_ms)}", now, out)
            await self._emit(out)
            return self._store.get_order(order.client_order_id) or order
        opened = msgspec.structs.replace(order, status="OPEN", updated_ms=now)
        # Opened and filled on arrival in one transaction: a crash between the two left
        # a market order open, to fill a candle later than it did without the crash.
        with self._store.transaction():
            arrival = self._store.take_arrival(order.client_order_id)
            last = self._cursor(order.account_id).price_now(order.symbol)
            if as_recorded and arrival is not None:
                last = arrival
            fill = marketable_price(opened, last) if last is not None else None
            self._save(opened)
            out.append(self._order_event(ev.ACCOUNT_ORDER_PLACED, opened, "placed"))
            if fill is not None:
                self._fill_in_txn(opened, fill, max(now, opened.created_ms), out, arrival=True)
        await self._emit(out)
        return self._store.get_order(order.client_order_id) or opened

    def _save(self, order: Order) -> None:
        self._store.put_order(order)
        if order.status in WORKING:
            self._working[order.client_order_id] = order
        else:
            self._working.pop(order.client_order_id, None)

    def _part(self, order: Order, candle: Candle) -> float | None:
        """How much of ``order`` ``candle`` can fill under ``max_participation`` (None:
        the rest of it)."""
        if not self.max_participation or candle.volume <= 0:
            return None
        left = order.volume - order.filled
        cap = self.max_participation * candle.volume
        return cap if cap < left - 1e-12 else None

    def _fill_in_txn(
        self,
        order: Order,
        price: float,
        ts_ms: int,
        out: list[FeedEvent],
        part: float | None = None,
        *,
        arrival: bool = False,
    ) -> None:
        with self._store.transaction():
            self._fill(order, price, ts_ms, out, part, arrival=arrival)

    def _fill(
        self,
        order: Order,
        market: float,
        ts_ms: int,
        out: list[FeedEvent],
        part: float | None = None,
        *,
        arrival: bool = False,
    ) -> None:
        """Execute ``order`` (or ``part`` of what it has left) at ``market`` price:
        position, PnL, fee, brackets, OCO; all in one txn. A part leaves the order
        OPEN. A limit that rested until the market reached it is a maker fill (at its
        limit, the maker fee); a fill on ``arrival``, a market or a stop order a taker
        fill (the taker fee, and the slippage: see :class:`FillCosts`)."""
        pos = self._books.get(order.account_id, {}).get(order.symbol)
        signed = self._fill_volume(order, pos, part)
        if signed is None:
            self._cancel(order, "position already closed", ts_ms, out)
            return
        maker = order.order_type == "limit" and not arrival
        price = market if maker else self.costs.taker_price(order, market)
        applied = apply_fill(
            pos.quantity if pos else 0.0, pos.avg_price if pos else 0.0, signed, price
        )
        size = abs(signed)
        fee = self.costs.fee(size * price, maker=maker)
        total = order.filled_volume + size
        done = part is None
        average = (order.fill_price or price) * order.filled_volume + price * size
        filled = msgspec.structs.replace(
            order,
            status="FILLED" if done else "OPEN",
            # One fill so far: its price exactly, not (p * v) / v a last digit off.
            fill_price=average / total if total and order.filled_volume else price,
            filled_volume=order.volume if done and order.role not in _CHILD_ROLES else total,
            last_fill_volume=size,
            fees=round(order.fees + fee, 10),
            filled_ms=ts_ms,
            updated_ms=ts_ms,
        )
        self._save(filled)
        marks = self._cursor(order.account_id).marks
        self._store.put_marks({order.symbol: marks.get(order.symbol, market)})
        self._store.add_fill(
            order.account_id, order.client_order_id, order.symbol, signed, price, ts_ms,
            applied.realized, fee,
        )  # fmt: skip
        what = "filled" if done else f"part:{total:.12g}"
        out.append(self._order_event(ev.ACCOUNT_ORDER_FILLED, filled, what))
        self._update_position(filled, pos, applied, out)
        self._after_fill(filled, applied.quantity, out)

    @staticmethod
    def _fill_volume(order: Order, pos: Position | None, part: float | None) -> float | None:
        """Signed fill size: ``part`` or what the order has left; a bracket child is
        capped at the position and never flips it."""
        signed = (
            order.signed_remaining if part is None else math.copysign(part, order.signed_volume)
        )
        if order.role not in _CHILD_ROLES:
            return signed
        qty = pos.quantity if pos else 0.0
        if qty == 0 or (qty > 0) == (signed > 0):
            return None
        return max(-abs(qty), min(abs(qty), signed))

    def _after_fill(self, filled: Order, quantity: float, out: list[FeedEvent]) -> None:
        """Grow brackets on an entry; one-cancels-other; drop brackets of a flat position."""
        ts_ms = filled.updated_ms
        if filled.role == "entry":
            self._bracket(filled, out)
        elif filled.parent_id is not None:
            for sib in [o for o in self._working.values() if o.parent_id == filled.parent_id]:
                self._cancel(sib, f"one-cancels-other: {filled.role} filled", ts_ms, out)
        if quantity == 0:
            for child in list(self._working.values()):
                if (
                    child.account_id == filled.account_id
                    and child.symbol == filled.symbol
                    and child.role in _CHILD_ROLES
                ):
                    self._cancel(child, "position closed", ts_ms, out)

    def _update_position(
        self, filled: Order, old: Position | None, applied: Applied, out: list[FeedEvent]
    ) -> None:
        """Store the new position; publish closed/opened when it goes flat, opens or flips."""
        ts_ms, qty = filled.updated_ms, applied.quantity
        old_qty = old.quantity if old else 0.0
        flipped = old_qty != 0 and qty != 0 and (old_qty > 0) != (qty > 0)
        if old is not None and (qty == 0 or flipped):
            payload = {
                **msgspec.to_builtins(old),
                "closePrice": filled.fill_price,
                "realizedPnl": applied.realized,
            }
            key = f"closed:{filled.client_order_id}"
            out.append(self._event(ev.ACCOUNT_POSITION_CLOSED, filled, key, payload, ts_ms))
        new = None
        if qty != 0:
            opened_ms = old.opened_ms if old is not None and not flipped else ts_ms
            new = Position(
                symbol=filled.symbol, quantity=qty, avg_price=applied.avg_price, opened_ms=opened_ms
            )
            if old is None or flipped:
                key = f"opened:{filled.client_order_id}"
                payload = msgspec.to_builtins(new)
                out.append(self._event(ev.ACCOUNT_POSITION_OPENED, filled, key, payload, ts_ms))
        account = filled.account_id
        self._store.put_position(account, filled.symbol, new)
        book = self._books.setdefault(account, {})
        if new is None:
            book.pop(filled.symbol, None)
            if not book:
                del self._books[account]
        else:
            book[filled.symbol] = new

    def _bracket(self, entry: Order, out: list[FeedEvent]) -> None:
        """The stop-loss and take-profit of a filled entry, for what it has filled: placed
        at its first fill, grown with each later part."""
        specs: list[tuple[OrderRole, float | None]] = [
            ("stop_loss", entry.stop_loss),
            ("take_profit", entry.take_profit),
        ]
        for role, level in specs:
            if level is None:
                continue
            known = self._working.get(child_order_id(entry.client_order_id, role))
            if known is not None:
                if known.volume != entry.filled:
                    grown = msgspec.structs.replace(
                        known, volume=entry.filled, updated_ms=entry.updated_ms
                    )
                    self._save(grown)
                    out.append(
                        self._order_event(
                            ev.ACCOUNT_ORDER_MODIFIED, grown, f"grown:{entry.filled:.12g}"
                        )
                    )
                continue
            if self._store.get_order(child_order_id(entry.client_order_id, role)) is not None:
                continue  # it filled or was canceled already: never placed twice
            child = Order(
                client_order_id=child_order_id(entry.client_order_id, role),
                agent_id=entry.agent_id,
                account_id=entry.account_id,
                symbol=entry.symbol,
                side="sell" if entry.side == "buy" else "buy",
                order_type="stop" if role == "stop_loss" else "limit",
                role=role,
                volume=entry.filled,
                status="OPEN",
                # The bracket exists from the moment its entry was placed.
                created_ms=entry.created_ms,
                updated_ms=entry.updated_ms,
                stop_price=level if role == "stop_loss" else None,
                limit_price=level if role == "take_profit" else None,
                parent_id=entry.client_order_id,
                trace_id=entry.trace_id,
            )
            self._save(child)
            out.append(self._order_event(ev.ACCOUNT_ORDER_PLACED, child, "placed"))

    def _expire(self, orders: list[Order], until_ms: int, ts_ms: int, out: list[FeedEvent]) -> None:
        """Cancel, at ``ts_ms``, those of ``orders`` still working that are good till
        ``until_ms`` or earlier (brackets keep protecting what of their entry filled)."""
        expired = [
            (now, till)
            for o in orders
            if (till := o.expires_ms) is not None
            and till <= until_ms
            and (now := self._working.get(o.client_order_id)) is not None
            and now.status == "OPEN"
        ]
        if not expired:
            return
        with self._store.transaction():
            for order, till in expired:
                reason = f"expired: good till {ev.iso_ms(till)}"
                self._cancel(order, reason, max(ts_ms, order.updated_ms), out)

    def _cancel(self, order: Order, reason: str, ts_ms: int, out: list[FeedEvent]) -> None:
        canceled = msgspec.structs.replace(
            order, status="CANCELED", updated_ms=ts_ms, reason=reason
        )
        self._save(canceled)
        out.append(self._order_event(ev.ACCOUNT_ORDER_CANCELED, canceled, "canceled"))

    def _order_event(self, topic: str, order: Order, what: str) -> FeedEvent:
        payload: dict[str, Any] = msgspec.to_builtins(order)
        return self._event(
            topic, order, f"{order.client_order_id}:{what}", payload, order.updated_ms
        )

    def _event(
        self, topic: str, order: Order, key: str, payload: dict[str, Any], ts_ms: int
    ) -> FeedEvent:
        return FeedEvent(
            event_id=f"{SOURCE}:{key}",
            ts=ev.iso_ms(ts_ms),
            source=SOURCE,
            topic=topic,
            payload=payload,
            symbol=order.symbol,
            partition_key=f"{SOURCE}:{order.account_id}:{order.symbol}",
            account_id=order.account_id,
            trace_id=order.trace_id,
            received_ts=ev.iso_ms(ev.now_ms()),
        )

    async def _emit(self, out: list[FeedEvent]) -> None:
        """Publish what a transaction just committed (called right after it: no await
        in between, so the order of calls is the order of commits)."""
        if not out:
            return
        if not self._sync_before_emit:
            for event in out:
                await self._publish(event)
            return
        self._unsynced.append(out)
        # Shielded: batches taken are published whatever happens to this task, and a
        # batch left waiting is taken by the lock's next holder.
        with anyio.CancelScope(shield=True):
            async with self._emit_lock:
                if not self._unsynced:
                    return  # an earlier holder's sync covered this commit and sent it
                batches, self._unsynced = self._unsynced, []
                try:
                    await anyio.to_thread.run_sync(self._store.sync)
                except StoreError as exc:  # (a failing disk: its writes fail and say so)
                    self._sync_outage.failed(str(exc))
                else:
                    self._sync_outage.worked()
                self.syncs += 1
                for batch in batches:
                    for event in batch:
                        await self._publish(event)


def _conforms(broker: PaperBroker) -> Broker:
    """Lets mypy prove PaperBroker satisfies the Broker protocol."""
    return broker
