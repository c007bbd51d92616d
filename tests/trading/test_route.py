"""The broker's market routes: lockstep with the agents, and where a stop ends."""

from __future__ import annotations

import anyio
import pytest

from daemon.bus import Bus
from daemon.events import FeedEvent
from daemon.trading.route import BROKER_TOPICS, MarketRoute
from tests.agents.test_pipeline import candle

pytestmark = pytest.mark.anyio


async def test_in_lockstep_a_stop_applies_nothing_the_agents_did_not_finish() -> None:
    """Event time: the agent finished candles 0-2 and stopped; candles 3-5 were
    already in the route's queue. At the stop the route applies 0-2 (it may be one
    behind) and not 3-5: the account must not trade on candles its agent never
    saw (the replay publishes them again after the restart)."""
    bus = Bus(queue_size=16)
    applied: list[FeedEvent] = []

    async def apply(event: FeedEvent) -> None:
        applied.append(event)

    route = MarketRoute(bus.subscribe(BROKER_TOPICS), apply, lockstep=True)
    route.join("agent", {})
    events = [candle(i) for i in range(6)]
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(route.run)
            for event in events:
                await bus.publish(event)
            for event in events[:3]:
                await route.caught_up(event)
                route.done("agent", event)
            route.leave("agent")
            route.stop()
    assert applied == events[:3]


async def test_free_a_stop_applies_everything_held() -> None:
    """Live (free): the broker applies every market event it received."""
    bus = Bus(queue_size=16)
    applied: list[FeedEvent] = []

    async def apply(event: FeedEvent) -> None:
        applied.append(event)

    route = MarketRoute(bus.subscribe(BROKER_TOPICS), apply, lockstep=False)
    events = [candle(i) for i in range(6)]
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            for event in events:
                await bus.publish(event)
            route.stop()
            tg.start_soon(route.run)
    assert applied == events
