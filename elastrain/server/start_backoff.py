"""Exponential backoff of container starts the backend refused, per cluster.

A start the backend refuses (``podman run`` failing on a value it cannot honour, an image gone, a
mount source that now leads elsewhere) would otherwise be tried again on every reconcile pass,
several times a second, forever. After each refusal the cluster's next start waits twice as long
(`BASE_S`, doubling, at most `MAX_S`); a start the backend accepts resets it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

BASE_S = 2.0
MAX_S = 300.0


class StartBackoff:
    """Per key (a cluster's uid): how many starts in a row were refused and when the next may run."""

    def __init__(
        self, base_s: float = BASE_S, max_s: float = MAX_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.base_s, self.max_s = base_s, max_s
        self._clock = clock
        self._lock = threading.Lock()
        self._state: dict[str, tuple[int, float, str]] = {}  # key -> (refusals, next start at, why)

    def waiting(self, key: str) -> tuple[float, str] | None:
        """(seconds until the next start of `key` may run, the last refusal), or None: it may run now."""
        with self._lock:
            state = self._state.get(key)
        if state is None:
            return None
        left = state[1] - self._clock()
        return (left, state[2]) if left > 0 else None

    def refused(self, key: str, why: str) -> tuple[int, float]:
        """Record a refused start of `key`; (refusals in a row, seconds until the next may run)."""
        with self._lock:
            count = self._state.get(key, (0, 0.0, ""))[0] + 1
            delay = min(self.max_s, self.base_s * 2 ** (count - 1))
            self._state[key] = (count, self._clock() + delay, why)
        return count, delay

    def started(self, key: str) -> None:
        """The backend accepted a start of `key`: the next refusal waits `base_s` again."""
        with self._lock:
            self._state.pop(key, None)
