"""The one retry schedule: exponential growth to a cap, with a chosen share of jitter.

* The Coinbase pool reconnects with **full** jitter (``jitter=1``): U(0, cap),
  so many clients never storm the venue together.
* The candle poller retries with half jitter (``jitter=0.5``): U(cap/2, cap),
  never retrying at once after a 5xx.
* The hook breaker uses **none** (``jitter=0``): on event time a replay must
  back off the same way at any speed.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator


def backoff_delay(
    attempt: int,
    initial: float,
    maximum: float,
    *,
    jitter: float = 1.0,
    rand: Callable[[], float] = random.random,
) -> float:
    """The wait before retry ``attempt`` (0-based): cap = min(maximum, initial * 2^attempt),
    then a uniform draw from [cap * (1 - jitter), cap]."""
    if initial <= 0 or maximum < initial:
        raise ValueError("backoff needs 0 < initial <= maximum")
    if not 0 <= jitter <= 1:
        raise ValueError("jitter must be in [0, 1]")
    cap = maximum if attempt >= 64 else min(maximum, initial * 2.0**attempt)
    return cap * (1 - jitter * (1 - rand())) if jitter else cap


def backoff_delays(
    initial: float,
    maximum: float,
    rand: Callable[[], float] = random.random,
    *,
    jitter: float = 1.0,
) -> Iterator[float]:
    """:func:`backoff_delay` for attempts 0, 1, 2, ...; start a new one to reset
    the schedule (after a healthy connection)."""
    backoff_delay(0, initial, maximum, jitter=jitter, rand=lambda: 1.0)  # validate now
    attempt = 0
    while True:
        yield backoff_delay(attempt, initial, maximum, jitter=jitter, rand=rand)
        attempt += 1
