"""Per-client rate limiting (token buckets), sans-I/O with an injected clock."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable


class RateLimiter:
    """One token bucket per client key; ``allow`` spends a token or says no.

    ``rate`` tokens per second refill up to ``burst``; rate 0 disables the
    limit. At most ``max_clients`` buckets are kept (least recently seen
    evicted) so a flood of source addresses cannot grow memory.
    """

    def __init__(
        self,
        rate: float,
        burst: int,
        clock: Callable[[], float] = time.monotonic,
        max_clients: int = 10_000,
    ) -> None:
        self._rate, self._burst, self._clock = rate, float(burst), clock
        self._max = max_clients
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def allow(self, key: str) -> bool:
        """Spend one token for ``key`` if it has one."""
        if self._rate <= 0:
            return True
        now = self._clock()
        tokens, last = self._buckets.pop(key, (self._burst, now))
        tokens = min(self._burst, tokens + (now - last) * self._rate)
        ok = tokens >= 1.0
        self._buckets[key] = (tokens - 1.0 if ok else tokens, now)
        while len(self._buckets) > self._max:
            self._buckets.popitem(last=False)
        return ok

    def retry_after_ms(self, key: str) -> int:
        """How long until ``key`` has a whole token again."""
        tokens, _ = self._buckets.get(key, (self._burst, 0.0))
        return 0 if self._rate <= 0 else max(0, int((1.0 - tokens) / self._rate * 1000) + 1)
