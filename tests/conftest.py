"""Shared fixtures: tests run on anyio's asyncio backend only; each test starts
from the logging configuration the previous one found."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import structlog


@pytest.fixture
def anyio_backend() -> str:
    """websockets and aiohttp are asyncio libraries; pin the backend."""
    return "asyncio"


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """A test that runs the CLI in-process configures structlog (a quiet backtest
    filters warnings out); without this, a later test capturing warnings saw none."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)
