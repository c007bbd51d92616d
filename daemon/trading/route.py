"""Market data's own route to the broker, and the watermarks agents and broker share.

The broker consumes closed candles and ticks from its own bus subscription,
once and in publish order per partition, whatever the agents do: resting
orders fill with no agent running, and no agent's pace changes the prices
another agent trades at.

Two guarantees, per partition (a feed's symbol/timeframe stream):

* **An agent never runs ahead of the broker.** Before an agent's hooks see a
  market event, the agent awaits :meth:`MarketRoute.caught_up`: the broker has
  applied that event (or a later one), so its risk checks and the fills it
  can see include everything up to the event.
* **In lockstep mode the broker never runs ahead of the agents.** Before it
  applies its next event, every registered agent has finished the previous
  one (reported with :meth:`MarketRoute.done`). Agents and broker receive
  market events in the same publish order, so this is one global step. Orders placed for
  event E are then opened at E's prices and E's time, and are first matched
  against E+1: the same replay gives the same orders and fills whatever other
  agents do and however fast they are. Lockstep is for replays and backtests;
  live, a slow agent must not hold back the broker (market time does not wait),
  so the broker runs free and agents only wait for it.

An agent that joins mid-stream starts at the bus's current position (it will
never receive what was published before it subscribed), so it can never block
the broker on an event it will not see.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping

import anyio
import anyio.lowlevel
import structlog

from daemon.backlog import Backlog
from daemon.bus import Bus, Subscription
from daemon.events import (
    MARKET_CANDLE_CLOSED,
    MARKET_MOVERS_DETECTED,
    MARKET_PRICE_TICK,
    NO_MARK,
    FeedEvent,
    Mark,
    event_mark,
)

log = structlog.get_logger("route")

# What the broker takes prices from (candle updates are not trades; a mover's price is
# a mark for products no feed follows, see PaperBroker.on_market_event).
BROKER_TOPICS = (MARKET_CANDLE_CLOSED, MARKET_PRICE_TICK, MARKET_MOVERS_DETECTED)
_NEVER = NO_MARK  # an unreadable time: the broker ignores it too, nobody waits on it
_mark = event_mark


def _covers(mark: Mark, want: Mark, tick: bool) -> bool:
    """Whether a partition handled up to ``mark`` has handled the event at ``want``.

    A later time covers it; the same time covers it when it is the same event,
    or any tick (a tick may be coalesced away in one queue and not another)."""
    if mark[0] != want[0]:
        return mark[0] > want[0]
    return mark[1] == want[1] or tick


class MarketRoute:
    """Runs the broker's subscription and keeps the watermarks (see the module doc)."""

    def __init__(
        self,
        sub: Subscription,
        apply: Callable[[FeedEvent], Awaitable[None]],
        *,
        lockstep: bool,
    ) -> None:
        self.sub = sub
        self.lockstep = lockstep
        self._apply = apply
        self._broker: dict[str, Mark] = {}
        self._last: tuple[str, Mark, bool] | None = None  # the broker's last event
        self._agents: dict[str, dict[str, Mark]] = {}
        self._left: dict[str, Mark] = {}  # what agents that stopped had finished
        self._stopping = False
        self._idle: dict[str, bool] = {}
        # Made by the first waiter only; asyncio's own, as the bus's (daemon/bus.py).
        self._changed: asyncio.Event | None = None
        self._finished = False
        self.applied = 0
        self.failures = 0

    # -- registration (the agent manager) -------------------------------------

    def join(self, agent_id: str, published: Mapping[str, FeedEvent]) -> None:
        """Register an agent as of ``published`` (the bus's last event per partition,
        taken when the agent subscribed): it has, by definition, handled those."""
        self._agents[agent_id] = {
            p: _mark(e) for p, e in published.items() if e.topic in BROKER_TOPICS
        }
        self._notify()

    def leave(self, agent_id: str) -> None:
        """An agent stopped: nobody waits for it any more."""
        for partition, mark in self._agents.pop(agent_id, {}).items():
            if mark > self._left.get(partition, _NEVER):
                self._left[partition] = mark
        self._notify()

    def stop(self) -> None:
        """The daemon stops: apply what is held, but in lockstep nothing beyond what
        the agents finished (their account must not trade on candles they never
        saw; a replay publishes those again after the restart)."""
        self._stopping = True
        self.sub.close()
        self._notify()

    # -- the agent's side -------------------------------------------------------

    async def caught_up(self, event: FeedEvent) -> None:
        """Until the broker has applied ``event`` (at once for non-market events)."""
        if event.topic not in BROKER_TOPICS:
            return
        want, tick = _mark(event), event.topic == MARKET_PRICE_TICK
        first = self.sub.bus.first_published.get(event.partition)
        if first is None or want < _mark(first):
            return  # published in an earlier run (a backlog carried over): applied then
        partition, waits = event.partition, 0
        while not self._finished and not _covers(self._broker.get(partition, _NEVER), want, tick):
            if waits == 0:
                # In lockstep the broker's task is usually ready to run already (woken
                # by done() for the previous event): one turn of the loop lets it apply
                # this event, without an Event and a future for each market event.
                await anyio.lowlevel.checkpoint()
            else:
                await self._wait()
            waits += 1

    def done(self, agent_id: str, event: FeedEvent) -> None:
        """``agent_id`` has finished ``event`` (evaluated, audited, acted on)."""
        marks = self._agents.get(agent_id)
        if marks is None or event.topic not in BROKER_TOPICS:
            return
        mark = _mark(event)
        if mark > marks.get(event.partition, _NEVER):
            marks[event.partition] = mark
            self._notify()

    # -- the broker's side --------------------------------------------------------

    async def run(self) -> None:
        """Apply every market event in order until the subscription ends."""
        try:
            async for event in self.sub:
                if self.lockstep:
                    await self._agents_finished()
                    if self._stopping and not self._agents and not self._seen_by_agents(event):
                        break
                try:
                    await self._apply(event)
                    self.applied += 1
                except Exception:
                    self.failures += 1
                    log.exception("broker failed on a market event", event_id=event.event_id)
                mark = _mark(event)
                if mark > self._broker.get(event.partition, _NEVER):
                    self._broker[event.partition] = mark
                self._last = (event.partition, mark, event.topic == MARKET_PRICE_TICK)
                self._notify()
        finally:
            self._finished = True
            self._notify()

    def _seen_by_agents(self, event: FeedEvent) -> bool:
        """Whether an agent that stopped had finished ``event``."""
        mark = self._left.get(event.partition, _NEVER)
        return _covers(mark, _mark(event), event.topic == MARKET_PRICE_TICK)

    async def _agents_finished(self) -> None:
        """Until every agent has finished the broker's last event."""
        if self._last is None:
            return
        partition, want, tick = self._last
        while any(not _covers(m.get(partition, _NEVER), want, tick) for m in self._agents.values()):
            await self._wait()

    def statistics(self) -> dict[str, int | bool]:
        """For status: events applied, failures, mode, agents registered."""
        return {
            "applied": self.applied,
            "failures": self.failures,
            "lockstep": self.lockstep,
            "agents": len(self._agents),
        }

    # -- plumbing -------------------------------------------------------------------

    async def _wait(self) -> None:
        if self._changed is None:
            self._changed = asyncio.Event()
        await self._changed.wait()

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None


class MarketRoutes:
    """The broker's routes: live, one for every account, running free; on event time
    (lockstep), one per account with agents, each stepping with that account's agents
    only, so a slow agent holds back its own account and no other, and a shared one,
    free, for the accounts no agent trades in (their resting orders still fill).

    On event time the shared route runs only once :meth:`free` is called: the owner
    knows when no account can be without an agent (a backtest's), and then each
    market event is delivered to one route fewer.

    An account's route subscribes when its first agent joins (the same instant as
    the agent's own subscription) and gives the broker the account's own market
    cursor (``open_cursor``). Like its agents' subscriptions it keeps the exact
    publish order (``ordered``) and, past its queue, spills to disk (``overflow``, a
    backlog for the account) once there is another account to hold back
    (:meth:`crowded`): a slow account lags alone, its events waiting on disk, and
    the feed goes on at the others' pace.
    """

    def __init__(
        self,
        bus: Bus,
        apply: Callable[[FeedEvent, str], Awaitable[None]],
        open_cursor: Callable[[str], None],
        *,
        lockstep: bool,
        start: Callable[[Callable[[], Awaitable[None]]], None],
        overflow: Callable[[str], Backlog | None] = lambda account: None,
    ) -> None:
        self.bus = bus
        self._overflow = overflow
        self.lockstep = lockstep
        self._apply = apply
        self._open_cursor = open_cursor
        self._start = start
        self.shared: MarketRoute | None = None
        if not lockstep:
            self.free()
        self._accounts: dict[str, MarketRoute] = {}
        self._of_agent: dict[str, MarketRoute] = {}

    def free(self) -> MarketRoute:
        """The shared route, started now if it was not (it sees market events from
        now on)."""
        if self.shared is None:
            sub = self.bus.subscribe(BROKER_TOPICS, name="broker")
            self.shared = MarketRoute(sub, self._applier(""), lockstep=False)
            self._start(self.shared.run)
        return self.shared

    def without_route(self, accounts: Iterable[str]) -> list[str]:
        """Of ``accounts``, those no account route serves (on event time, the shared
        route's business)."""
        return [a for a in accounts if a not in self._accounts]

    def _applier(self, cursor: str) -> Callable[[FeedEvent], Awaitable[None]]:
        async def apply(event: FeedEvent) -> None:
            await self._apply(event, cursor)

        return apply

    def join(self, agent_id: str, account: str, published: Mapping[str, FeedEvent]) -> None:
        """Register an agent of ``account`` (see :meth:`MarketRoute.join`)."""
        route = self.free() if not self.lockstep else self._accounts.get(account)
        if route is None:
            sub = self.bus.subscribe(
                BROKER_TOPICS,
                name=f"broker:{account}",
                overflow=self._overflow(account),
                ordered=True,
                spill=self.crowded,
            )
            self._open_cursor(account)
            route = MarketRoute(sub, self._applier(account), lockstep=True)
            self._accounts[account] = route
            self._start(route.run)
        self._of_agent[agent_id] = route
        route.join(agent_id, published)

    def crowded(self) -> bool:
        """On event time, whether a slow account would hold back another one (so its
        events had better wait on disk); with a single account the feed simply
        waits for it, which costs nothing."""
        return len(self._accounts) > 1

    def leave(self, agent_id: str) -> None:
        """An agent stopped (its account's route goes on, free if it was the last)."""
        route = self._of_agent.pop(agent_id, None)
        if route is not None:
            route.leave(agent_id)

    async def caught_up(self, agent_id: str, event: FeedEvent) -> None:
        """Until the agent's route has applied ``event``."""
        route = self._of_agent.get(agent_id, self.shared)
        if route is not None:
            await route.caught_up(event)

    def done(self, agent_id: str, event: FeedEvent) -> None:
        """The agent has finished ``event``."""
        route = self._of_agent.get(agent_id, self.shared)
        if route is not None:
            route.done(agent_id, event)

    def routes(self) -> list[MarketRoute]:
        """The shared route (if it runs), then each account's."""
        shared = [] if self.shared is None else [self.shared]
        return [*shared, *self._accounts.values()]

    def close(self) -> None:
        """End every route after it applied what it holds (the drain; an account's
        route on event time stops where its agents stopped)."""
        for route in self.routes():
            route.stop()

    def release(self) -> None:
        """After the drain: close the accounts' backlog files."""
        for route in self.routes():
            route.sub.release()

    def statistics(self) -> dict[str, int | bool]:
        """For status: events applied and failures over every route, mode, agents, routes."""
        routes = self.routes()
        return {
            "applied": sum(r.applied for r in routes),
            "failures": sum(r.failures for r in routes),
            "lockstep": self.lockstep,
            "agents": len(self._of_agent),
            "routes": len(routes),
        }
