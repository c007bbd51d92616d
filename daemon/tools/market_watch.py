"""The sans-I/O core of ``wait_for_market_event`` (seed 000): the request and both
responses, field for field, and :class:`MarketWatch`, which takes ticks and
returns a trigger or None, so every operator is tested without a socket.

* ``crossAbove``/``crossBelow`` need a previous value on the other side of the
  threshold (``previous <= threshold < actual`` and mirrored); the first tick
  of a product after a reconnect is never a cross (the pool marks it);
* ``any`` answers with the first condition met, ``all`` with every condition
  when all hold on the same tick.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Literal

import msgspec

from daemon.events import iso_ms
from daemon.tools.base import Problem, ToolError
from feeds.coinbase_ws.pool import PoolStatistics, Tick
from feeds.config import product_problem

MAX_TIMEOUT = 55.0


class Field(StrEnum):
    """The ticker fields a condition can watch."""

    PRICE = "price"
    VOLUME_24H = "volume24h"
    PERCENT_CHANGE_24H = "percentChange24h"
    HIGH_24H = "high24h"
    LOW_24H = "low24h"


class Operator(StrEnum):
    """Comparisons; the cross operators compare the previous and current tick."""

    GT = "gt"
    GTE = "gte"
    LT = "lt"
    LTE = "lte"
    CROSS_ABOVE = "crossAbove"
    CROSS_BELOW = "crossBelow"


class _Request(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class Condition(_Request, frozen=True):
    """One comparison of a ticker field with a threshold."""

    field: Annotated[Field, msgspec.Meta(description="The ticker field to monitor")]
    operator: Annotated[Operator, msgspec.Meta(description="Comparison operator")]
    value: Annotated[float, msgspec.Meta(description="Threshold value to compare against")]


class Subscription(_Request, frozen=True, rename="camel"):
    """A product and the conditions that end the wait."""

    product_id: Annotated[
        str,
        msgspec.Meta(
            min_length=3, max_length=41, description='Trading pair to monitor (e.g., "BTC-EUR")'
        ),
    ]
    conditions: Annotated[
        list[Condition],
        msgspec.Meta(min_length=1, max_length=5, description="Conditions that trigger the event"),
    ]
    logic: Annotated[
        Literal["any", "all"],
        msgspec.Meta(description='How to combine conditions: "any" (OR) or "all" (AND)'),
    ] = "any"


class WaitRequest(_Request, frozen=True):
    """The seed's request: 1-10 subscriptions, a timeout of 1-55 s."""

    subscriptions: Annotated[
        list[Subscription],
        msgspec.Meta(min_length=1, max_length=10, description="Products and conditions to monitor"),
    ]
    timeout: Annotated[
        float,
        msgspec.Meta(
            ge=1, le=MAX_TIMEOUT, description="Maximum wait time in seconds (default: 55)"
        ),
    ] = MAX_TIMEOUT


class TickerOut(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """The seed's ticker: a missing field (Coinbase sent ``""``) is null, never 0."""

    price: float | None
    volume24h: float | None
    percent_change24h: float | None = msgspec.field(name="percentChange24h")
    high24h: float | None
    low24h: float | None
    timestamp: str


class TriggeredCondition(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    field: str
    operator: str
    threshold: float
    actual_value: float


class Triggered(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    status: Literal["triggered"] = "triggered"
    product_id: str
    triggered_conditions: list[TriggeredCondition]
    ticker: TickerOut
    timestamp: str


class TimedOut(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    status: Literal["timeout"] = "timeout"
    last_tickers: dict[str, TickerOut]
    duration: float
    timestamp: str
    # Set when the market was not watched for the whole wait (the connection was
    # down, or dropped and came back): "nothing happened" is then not known.
    warning: str | None = None


# --- sans-I/O condition logic ---------------------------------------------------


_ATTR: dict[Field, str] = {
    Field.PRICE: "price",
    Field.VOLUME_24H: "volume24h",
    Field.PERCENT_CHANGE_24H: "percent_change24h",
    Field.HIGH_24H: "high24h",
    Field.LOW_24H: "low24h",
}


def field_value(tick: Tick, field: Field) -> float | None:
    """The value of ``field`` in a tick (None when Coinbase left it empty)."""
    value: float | None = getattr(tick.ticker, _ATTR[field])
    return value


def holds(op: Operator, actual: float, threshold: float, previous: float | None) -> bool:
    """Whether ``actual`` (after ``previous``) meets ``op threshold``."""
    if op is Operator.GT:
        return actual > threshold
    if op is Operator.GTE:
        return actual >= threshold
    if op is Operator.LT:
        return actual < threshold
    if op is Operator.LTE:
        return actual <= threshold
    if previous is None:
        return False
    if op is Operator.CROSS_ABOVE:
        return previous <= threshold < actual
    return previous >= threshold > actual


def ticker_out(tick: Tick) -> TickerOut:
    """The seed's ticker shape; the timestamp is Coinbase's, else the receive time."""
    t = tick.ticker
    return TickerOut(
        price=t.price,
        volume24h=t.volume24h,
        percent_change24h=t.percent_change24h,
        high24h=t.high24h,
        low24h=t.low24h,
        timestamp=iso_ms(tick.ts_ms if tick.ts_ms is not None else tick.received_ms),
    )


@dataclass
class MarketWatch:
    """The state of one wait: previous values for crosses, last ticker per product."""

    subscriptions: list[Subscription]

    def __post_init__(self) -> None:
        self.previous: dict[str, dict[Field, float]] = {}
        self.last: dict[str, Tick] = {}
        # Per product: its subscriptions, and the fields they read (the only ones
        # kept as previous values): observe() runs for every tick of every wait.
        self._subs: dict[str, list[Subscription]] = {}
        self._fields: dict[str, set[Field]] = {}
        for sub in self.subscriptions:
            self._subs.setdefault(sub.product_id, []).append(sub)
            self._fields.setdefault(sub.product_id, set()).update(c.field for c in sub.conditions)

    @property
    def products(self) -> frozenset[str]:
        """Every product the wait watches."""
        return frozenset(s.product_id for s in self.subscriptions)

    def observe(self, tick: Tick, *, seed: bool = False) -> Triggered | None:
        """Feed one tick (keeping previous values and last tickers); the trigger it
        completes, if any.

        ``seed`` marks a tick from before the wait (the pool's last one): it is a
        level check and the previous value for crosses, but never a cross itself."""
        product = tick.ticker.product_id
        self.last[product] = tick
        cross_ok = not (seed or tick.stale_after_reconnect)
        hit = self.check(tick, self.previous.get(product, {}) if cross_ok else {})
        fresh = self.previous.setdefault(product, {})
        for field in self._fields.get(product, ()):
            value = field_value(tick, field)
            if value is not None:
                fresh[field] = value
        return hit

    def check(
        self, tick: Tick, previous: Mapping[Field, float], now_ms: int | None = None
    ) -> Triggered | None:
        """The trigger ``tick`` completes after ``previous`` (the product's values on
        the tick before; empty: no cross is possible), if any, stamped ``now_ms``
        (default: the wall clock)."""
        product = tick.ticker.product_id
        for sub in self._subs.get(product, ()):
            met = _met(sub, tick, previous)
            if met:
                return Triggered(
                    product_id=product,
                    triggered_conditions=met,
                    ticker=ticker_out(tick),
                    timestamp=iso_ms(_now_ms() if now_ms is None else now_ms),
                )
        return None

    def timed_out(
        self,
        duration: float,
        last: Mapping[str, Tick] | None = None,
        warning: str | None = None,
        now_ms: int | None = None,
    ) -> TimedOut:
        """The timeout answer: the last ticker of every product that sent one
        (``last``, or the ticks :meth:`observe` saw), stamped ``now_ms`` (default:
        the wall clock)."""
        ticks = self.last if last is None else last
        return TimedOut(
            last_tickers={p: ticker_out(t) for p, t in sorted(ticks.items())},
            duration=round(duration, 3),
            timestamp=iso_ms(_now_ms() if now_ms is None else now_ms),
            warning=warning,
        )


def _now_ms() -> int:
    return int(time.time() * 1000)


def unwatched(before: PoolStatistics, after: PoolStatistics) -> str | None:
    """Why a wait that timed out did not watch the market the whole time (the pool's
    counters at its start and end), or None when it did."""
    if not after.connected:
        return (
            "the Coinbase market-data connection is down (reconnecting): the market was "
            "not watched during this wait and lastTickers may be stale; do not read the "
            "timeout as 'nothing happened'"
        )
    # An idle pool connects for the wait (lazily): that first connection is the wait's.
    if after.connections > before.connections + (0 if before.connected else 1):
        return (
            "the Coinbase connection dropped and came back during this wait: ticks in "
            "between were not seen, and a cross needs a fresh tick on each side"
        )
    return None


def _met(sub: Subscription, tick: Tick, prev: Mapping[Field, float]) -> list[TriggeredCondition]:
    """The conditions of ``sub`` this tick meets: the first for ``any``, all or none
    for ``all``."""
    met: list[TriggeredCondition] = []
    for cond in sub.conditions:
        actual = field_value(tick, cond.field)
        if actual is not None and holds(cond.operator, actual, cond.value, prev.get(cond.field)):
            met.append(
                TriggeredCondition(
                    field=cond.field.value,
                    operator=cond.operator.value,
                    threshold=cond.value,
                    actual_value=actual,
                )
            )
            if sub.logic == "any":
                return met
    return met if sub.logic == "any" or len(met) == len(sub.conditions) else []


def check_products(subs: Iterable[Subscription]) -> ToolError | None:
    """Product ids must look like ``BTC-USD`` (upper case, dash-separated)."""
    problems = [
        Problem(path=f"subscriptions[{i}].productId", message=why)
        for i, s in enumerate(subs)
        if (why := product_problem(s.product_id)) is not None
    ]
    if not problems:
        return None
    return ToolError(
        error="invalid_arguments",
        message="wait_for_market_event: bad product id",
        problems=problems,
        suggestion="use upper-case Coinbase product ids such as 'BTC-USD' or 'ETH-EUR'",
    )
