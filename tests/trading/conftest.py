"""A paper broker whose events and audit rows the desk tests can read."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from daemon.audit.records import AuditRecord
from daemon.events import FeedEvent
from daemon.trading.desk import audited_publish
from daemon.trading.paper import PaperBroker


class Audit(list[AuditRecord]):
    """An audit sink that keeps the records."""

    def write(self, record: AuditRecord) -> None:
        self.append(record)


@pytest.fixture
def events() -> list[FeedEvent]:
    return []


@pytest.fixture
def audit() -> Audit:
    return Audit()


@pytest.fixture
def broker(tmp_path: Path, events: list[FeedEvent], audit: Audit) -> Iterator[PaperBroker]:
    async def publish(event: FeedEvent) -> None:
        events.append(event)

    b = PaperBroker(tmp_path, audited_publish(publish, audit), synchronous="NORMAL")
    yield b
    b.close()
