"""Which thread a function ran on: for the tests that keep blocking I/O off the
event loop's thread (the main one)."""

from __future__ import annotations

import threading
from typing import Any

import pytest


def on_loop_calls(monkeypatch: pytest.MonkeyPatch, module: object, name: str) -> list[bool]:
    """Wrap ``module.name``; each call appends whether it ran on the main thread."""
    on_loop: list[bool] = []
    real = getattr(module, name)

    def spy(*args: Any, **kwargs: Any) -> Any:
        on_loop.append(threading.current_thread() is threading.main_thread())
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, spy)
    return on_loop
