"""A token bucket per key: how often something (a job's progress report) may happen."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable

MAX_KEYS = 4096  # buckets kept; beyond it the full ones (idle keys) are forgotten


class RateLimiter:
    """`rate` events per second per key, in bursts of up to `burst` (default: 5 seconds' worth)."""

    def __init__(
        self, rate: float, burst: float | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate = rate
        self.burst = burst if burst is not None else max(1.0, 5 * rate)
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[Hashable, tuple[float, float]] = {}  # key -> (tokens, at)

    def allow(self, key: Hashable) -> bool:
        """Take one token of `key`'s bucket; False when it is empty (the caller refuses the event)."""
        now = self._clock()
        with self._lock:
            tokens, at = self._buckets.get(key, (self.burst, now))
            tokens = min(self.burst, tokens + (now - at) * self.rate)
            allowed = tokens >= 1.0
            self._buckets[key] = (tokens - 1.0 if allowed else tokens, now)
            if len(self._buckets) > MAX_KEYS:
                self._forget_full(now)
            return allowed

    def _forget_full(self, now: float) -> None:
        for key, (tokens, at) in list(self._buckets.items()):
            if tokens + (now - at) * self.rate >= self.burst:
                del self._buckets[key]
