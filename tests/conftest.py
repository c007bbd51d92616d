"""Shared fixtures: tests run on anyio's asyncio backend only."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    """websockets and aiohttp are asyncio libraries; pin the backend."""
    return "asyncio"
