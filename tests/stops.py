"""A daemon component that stops the daemon as a signal would, once a condition holds."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio

from daemon.service import Component, Service


def stop_when(holds: Callable[[Service], bool]) -> Component:
    """A component that calls ``request_stop`` once ``holds(service)``: polled every
    2 ms (a subscriber or a callback would slow or change what it watches)."""

    @asynccontextmanager
    async def component(service: Service) -> AsyncIterator[None]:
        async def watch() -> None:
            while True:
                if holds(service):
                    service.request_stop()
                    return
                await anyio.sleep(0.002)

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            yield
            tg.cancel_scope.cancel()

    return component
