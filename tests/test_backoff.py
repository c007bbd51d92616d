"""The one retry schedule: doubling to a cap, with full, half or no jitter."""

from __future__ import annotations

import random

import pytest

from daemon.backoff import backoff_delay


def test_no_jitter_doubles_to_the_cap_deterministically() -> None:
    """The hook breaker's schedule: the same at any replay speed."""
    got = [backoff_delay(n, 1.0, 10.0, jitter=0) for n in range(6)] + [
        backoff_delay(500, 1.0, 10.0, jitter=0)
    ]
    assert got == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0, 10.0]


@pytest.mark.parametrize(("jitter", "low"), [(1.0, 0.0), (0.5, 0.5)])
def test_jitter_draws_inside_its_share_of_the_cap(jitter: float, low: float) -> None:
    """Full jitter spans [0, cap]; the poller's half jitter [cap/2, cap]."""
    rng = random.Random(7)
    draws = [backoff_delay(3, 1.0, 60.0, jitter=jitter, rand=rng.random) for _ in range(2000)]
    assert min(draws) >= low * 8.0 and max(draws) <= 8.0
    assert min(draws) < (low + 0.05) * 8.0 and max(draws) > 0.95 * 8.0  # the whole range is used


def test_bad_schedules_are_refused() -> None:
    """Zero or inverted bounds and jitter outside [0, 1] are programming errors."""
    for args in ((0.0, 1.0, 1.0), (2.0, 1.0, 1.0), (1.0, 2.0, 1.5)):
        with pytest.raises(ValueError):
            backoff_delay(0, args[0], args[1], jitter=args[2])
