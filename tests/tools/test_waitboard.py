"""The wait board answers exactly what each wait, fed every tick, would answer."""

from __future__ import annotations

import random
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any, cast

import anyio
import pytest

from daemon.tools.market_watch import Field, MarketWatch, Operator, Triggered
from daemon.tools.waitboard import WaitBoard, Waiter
from feeds.coinbase_ws.pool import CoinbaseWsPool, Tick
from tests.tools.test_market_event import sub, tick

pytestmark = pytest.mark.anyio
PRODUCTS = ("BTC-USD", "ETH-USD")
KWARGS = {
    Field.VOLUME_24H: "volume24h",
    Field.PERCENT_CHANGE_24H: "percent_change24h",
    Field.HIGH_24H: "high24h",
    Field.LOW_24H: "low24h",
}


class FakePool:
    """The two calls the board makes of a pool, with ticks handed in by the test."""

    def __init__(self) -> None:
        self.observers: dict[str, list[Callable[[Tick], None]]] = {}
        self.last: dict[str, Tick] = {}
        self.history: dict[str, list[Tick]] = {}  # the ticks since the product is held

    def subscribe(self, products: frozenset[str], *, observer: Callable[[Tick], None]) -> Any:
        (product,) = products
        self.observers.setdefault(product, []).append(observer)
        pool = self

        class Handle:
            def close(self) -> None:
                pool.observers[product].remove(observer)
                if not pool.observers[product]:
                    del pool.observers[product]
                    pool.last.pop(product, None)  # as the pool: nobody holds it
                    pool.history.pop(product, None)

        return Handle()

    def last_tick(self, product: str) -> Tick | None:
        return self.last.get(product)

    def deliver(self, t: Tick) -> None:
        product = t.ticker.product_id
        if product in self.observers:
            self.last[product] = t
            self.history.setdefault(product, []).append(t)
            for observer in list(self.observers[product]):
                observer(t)


def random_tick(rng: random.Random) -> Tick:
    def value() -> float | None:
        return None if rng.random() < 0.15 else float(rng.randint(95, 105))

    extra = {name: v for name in KWARGS.values() if (v := value()) is not None}
    return tick(rng.choice(PRODUCTS), value(), stale=rng.random() < 0.05, **extra)


def random_watch(rng: random.Random) -> MarketWatch:
    subs = []
    for product in rng.sample(PRODUCTS, rng.randint(1, 2)):
        conds = [
            (rng.choice(list(Field)).value, rng.choice(list(Operator)).value, float(rng.randint(96, 104)))
            for _ in range(rng.randint(1, 3))
        ]  # fmt: skip
        subs.append(sub(product, *conds, logic=rng.choice(["any", "all"])))
    return MarketWatch(subs)


def same(a: Triggered | None, b: Triggered | None) -> bool:
    if a is None or b is None:
        return a is b
    return (a.product_id, a.triggered_conditions, a.ticker) == (
        b.product_id,
        b.triggered_conditions,
        b.ticker,
    )


@pytest.mark.parametrize("seed", range(8))
async def test_the_board_answers_as_every_wait_checked_on_every_tick(seed: int) -> None:
    """Waits park at random moments among random ticks (missing fields, ties with
    thresholds, ticks after a reconnect): each wait's answer, and the tick that gave
    it, equal a plain MarketWatch's fed every tick from its start, its previous
    values being the product's latest known ones (ticks before the wait are seeds:
    never a cross, and only the last one is a level check)."""
    rng = random.Random(seed)
    pool = FakePool()
    board = WaitBoard(cast(CoinbaseWsPool, pool))
    with ExitStack() as stack:
        parked: list[tuple[Waiter, MarketWatch, list[Triggered | None]]] = []
        leaving: dict[int, ExitStack] = {}
        left = 0
        for step in range(400):
            if parked and rng.random() < 0.08:  # a wait ends (cancelled, timed out)
                w, _, _ = parked.pop(rng.randrange(len(parked)))
                leaving.pop(id(w)).close()
                left += 1
            if rng.random() < 0.3 and board.parked < 60:
                w = Waiter(random_watch(rng))
                ref = MarketWatch(w.watch.subscriptions)
                first: list[Triggered | None] = [None]
                for product in sorted(ref.products):  # the reference's seeds
                    seeds = pool.history.get(product) or []
                    for old in seeds[:-1]:
                        ref.observe(old, seed=True)
                    if seeds and (hit := ref.observe(seeds[-1], seed=True)):
                        first[0] = first[0] or hit
                own = leaving[id(w)] = ExitStack()
                own.enter_context(board.park(w))
                stack.callback(own.close)
                parked.append((w, ref, first))
            t = random_tick(rng)
            pool.deliver(t)
            for _w, ref, first in parked:
                if t.ticker.product_id in ref.products:
                    hit = ref.observe(t)
                    if first[0] is None:
                        first[0] = hit
            for w, _ref, first in parked:
                assert same(w.hit, first[0]), (step, w.watch.subscriptions)
        assert board.parked == len(parked) and sum(w.hit is not None for w, _, _ in parked) > 5
        assert left > 10
    assert board.parked == 0 and pool.observers == {}  # every product released


async def test_a_full_board_answers_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past MAX_PARKED parked waits, a call is `unavailable` at once, nothing subscribed."""
    from daemon.tools import registry, waitboard
    from daemon.tools.base import ToolError
    from daemon.tools.context import ToolContext
    from feeds.config import CoinbaseWsSection
    from tests.tools.test_market_event import SIMPLE

    pool = CoinbaseWsPool(CoinbaseWsSection(url="ws://127.0.0.1:9"), lazy=True)
    monkeypatch.setattr(waitboard, "MAX_PARKED", 0)
    with anyio.fail_after(2):
        out = await registry().call(ToolContext(pool=pool), "wait_for_market_event", SIMPLE)
    assert isinstance(out, ToolError) and out.error == "unavailable" and "too many" in out.message
    assert pool.statistics().subscribers == 0
