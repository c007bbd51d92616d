"""Every parked ``wait_for_market_event`` call, indexed by threshold.

Handing each tick to every parked wait costs a condition check per wait per
tick (about 1 ms at a thousand waits, in the connection's reader). The board
instead keeps, per product and per (field, operator), the parked waits'
thresholds in sorted order: a tick finds the waits whose conditions it can
meet by bisection (``gt`` 1000 needs a value above 1000; ``crossAbove`` 1000
needs the previous value at or below it and this one above), and only those
are checked in full. A tick's cost follows the waits it concerns, not the
waits parked. The board holds one pool subscription per product, opened for
the first wait on it and closed with the last, so products stay ref-counted.

The previous value of a field (for crosses) is per product, shared by every
wait: it is the value of the tick before, which is what each wait saw last
(a wait starts from the pool's last tick). The first tick after a reconnect
is never a cross.
"""

from __future__ import annotations

import weakref
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import ClassVar

import anyio

from daemon.tools.market_watch import Field, MarketWatch, Operator, Triggered, field_value
from feeds.coinbase_ws.pool import CoinbaseWsPool, Subscription, Tick

MAX_PARKED = 10_000


@dataclass(eq=False)
class Waiter:
    """One parked wait: its conditions, and its answer once a tick completes one."""

    watch: MarketWatch
    hit: Triggered | None = None
    done: anyio.Event = field(default_factory=anyio.Event)

    def consider(self, tick: Tick, previous: dict[Field, float]) -> None:
        """Check the wait's conditions on ``tick``; the first hit ends the wait."""
        if self.hit is None and (hit := self.watch.check(tick, previous)) is not None:
            self.hit = hit
            self.done.set()


class _Sorted:
    """Waiters sorted by threshold (parallel lists, so bisection works on floats)."""

    def __init__(self) -> None:
        self.keys: list[float] = []
        self.items: list[Waiter] = []

    def add(self, key: float, item: Waiter) -> None:
        i = bisect_right(self.keys, key)
        self.keys.insert(i, key)
        self.items.insert(i, item)

    def remove(self, key: float, item: Waiter) -> None:
        i = bisect_left(self.keys, key)
        while self.items[i] is not item:
            i += 1
        del self.keys[i], self.items[i]

    def span(self, op: Operator, value: float, previous: float | None) -> list[Waiter]:
        """The waiters whose ``op threshold`` this value (after ``previous``) may meet."""
        keys = self.keys
        if op is Operator.GT:
            return self.items[: bisect_left(keys, value)]
        if op is Operator.GTE:
            return self.items[: bisect_right(keys, value)]
        if op is Operator.LT:
            return self.items[bisect_right(keys, value) :]
        if op is Operator.LTE:
            return self.items[bisect_left(keys, value) :]
        if previous is None:
            return []
        if op is Operator.CROSS_ABOVE:  # previous <= T < value
            return self.items[bisect_left(keys, previous) : bisect_left(keys, value)]
        return self.items[bisect_right(keys, value) : bisect_right(keys, previous)]


@dataclass(eq=False)
class _Product:
    """The parked waits on one product, and its previous values."""

    sub: Subscription
    previous: dict[Field, float] = field(default_factory=dict)
    index: dict[tuple[Field, Operator], _Sorted] = field(default_factory=dict)
    waiters: int = 0


class WaitBoard:
    """The parked waits of one pool (see the module docstring)."""

    _boards: ClassVar[weakref.WeakKeyDictionary[CoinbaseWsPool, WaitBoard]] = (
        weakref.WeakKeyDictionary()
    )

    def __init__(self, pool: CoinbaseWsPool) -> None:
        self._pool = pool
        self._products: dict[str, _Product] = {}
        self.parked = 0

    @classmethod
    def of(cls, pool: CoinbaseWsPool) -> WaitBoard:
        """The board of ``pool`` (one per pool, made on first use)."""
        board = cls._boards.get(pool)
        if board is None:
            board = cls._boards[pool] = WaitBoard(pool)
        return board

    @property
    def full(self) -> bool:
        """True when no more waits may park."""
        return self.parked >= MAX_PARKED

    def last_ticks(self, products: frozenset[str]) -> dict[str, Tick]:
        """The latest tick of each of ``products`` that sent one."""
        ticks = {p: self._pool.last_tick(p) for p in products}
        return {p: t for p, t in ticks.items() if t is not None}

    @contextmanager
    def park(self, waiter: Waiter) -> Iterator[None]:
        """Watch ``waiter``'s products while the block runs; its level conditions are
        first checked on each product's last tick (never a cross)."""
        entries = [
            (sub.product_id, (cond.field, cond.operator), cond.value)
            for sub in waiter.watch.subscriptions
            for cond in sub.conditions
        ]
        products = sorted(waiter.watch.products)
        for product in products:
            self._join(product)
        for product, key, threshold in entries:
            self._products[product].index.setdefault(key, _Sorted()).add(threshold, waiter)
        self.parked += 1
        try:
            for product in products:
                last = self._pool.last_tick(product)
                if last is not None:
                    waiter.consider(last, {})
            yield
        finally:
            self.parked -= 1
            for product, key, threshold in entries:
                self._products[product].index[key].remove(threshold, waiter)
            for product in products:
                self._leave(product)

    def _join(self, product: str) -> None:
        entry = self._products.get(product)
        if entry is None:
            sub = self._pool.subscribe({product}, observer=self._observer(product))
            entry = self._products[product] = _Product(sub)
            last = self._pool.last_tick(product)  # another subscriber's: the previous values
            if last is not None:
                _remember(entry.previous, last)
        entry.waiters += 1

    def _leave(self, product: str) -> None:
        entry = self._products[product]
        entry.waiters -= 1
        if entry.waiters == 0:
            del self._products[product]
            entry.sub.close()

    def _observer(self, product: str) -> Callable[[Tick], None]:
        def on_tick(tick: Tick) -> None:
            entry = self._products.get(product)
            if entry is not None:
                self._on_tick(entry, tick)

        return on_tick

    @staticmethod
    def _on_tick(entry: _Product, tick: Tick) -> None:
        previous = {} if tick.stale_after_reconnect else entry.previous
        concerned: dict[int, Waiter] = {}
        for (fld, op), waiters in entry.index.items():
            value = field_value(tick, fld)
            if value is not None:
                for w in waiters.span(op, value, previous.get(fld)):
                    concerned[id(w)] = w
        for w in concerned.values():
            w.consider(tick, previous)
        _remember(entry.previous, tick)


def _remember(previous: dict[Field, float], tick: Tick) -> None:
    for fld in Field:
        value = field_value(tick, fld)
        if value is not None:
            previous[fld] = value
