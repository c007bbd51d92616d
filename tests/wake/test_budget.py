"""The sliding-window budget, with time passed in (no sleeping)."""

from __future__ import annotations

import pytest

from daemon.wake.budget import SlidingWindowBudget
from daemon.wake.context import summarize_earlier

T0 = 1_800_000_000.0


def test_n_runs_allowed_then_refused_until_window_slides() -> None:
    """N starts fit in the window, the N+1th does not, and it fits once the oldest slides out."""
    budget = SlidingWindowBudget(3, 3600)
    for i in range(3):
        assert budget.allows(T0 + i)
        budget.record(T0 + i)
    assert not budget.allows(T0 + 100)
    assert budget.next_free_at(T0 + 100) == T0 + 3600
    assert not budget.allows(T0 + 3599.9)
    assert budget.allows(T0 + 3600)
    assert budget.used(T0 + 3601.5) == 1


def test_reserved_runs_count_against_the_budget() -> None:
    """Promised (pending) runs use budget before they start."""
    budget = SlidingWindowBudget(2, 3600)
    budget.record(T0)
    assert budget.allows(T0, reserved=0)
    assert not budget.allows(T0, reserved=1)


def test_zero_budget_never_allows() -> None:
    """max_runs 0 means the agent never wakes and there is no next free time."""
    budget = SlidingWindowBudget(0)
    budget.record(T0)
    assert not budget.allows(T0)
    assert budget.next_free_at(T0) is None


def test_rebuilt_from_history_keeps_only_what_matters() -> None:
    """A budget rebuilt from stored starts remembers at most max_runs of them, newest."""
    budget = SlidingWindowBudget(2, 3600, [T0 + 5, T0, T0 + 9])
    assert budget.starts() == [T0 + 5, T0 + 9]
    assert budget.resized(1).starts() == [T0 + 9]


def test_bad_arguments_rejected() -> None:
    """A negative limit or an empty window is a programming error."""
    with pytest.raises(ValueError):
        SlidingWindowBudget(-1)
    with pytest.raises(ValueError):
        SlidingWindowBudget(1, 0)


def test_earlier_summary_line() -> None:
    """Dropped wakes become one line, most frequent hook first."""
    from collections import Counter

    assert summarize_earlier(Counter()) is None
    assert summarize_earlier(Counter({"crash": 3, "two_green": 4})) == (
        "...and 7 earlier wakes: 4x two_green, 3x crash"
    )
    assert summarize_earlier(Counter({"x": 1})) == "...and 1 earlier wake: 1x x"
