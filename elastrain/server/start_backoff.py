"""Exponential backoff of container starts the backend refused, per cluster, and giving up.

A start the backend refuses (``podman run`` failing on a value it cannot honour, an image gone, a
mount source that now leads elsewhere) would otherwise be tried again on every reconcile pass,
several times a second, forever. After each refusal the cluster's next start waits twice as long
(`BASE_S`, doubling, at most `MAX_S`); a start the backend accepts resets it. After `GIVE_UP_AFTER`
refusals in a row (about 4 minutes of tries) the server gives up: no more starts until the owner
scales the cluster (`reset`) or the server restarts, and `given_up` names the cluster and why, which
the reconciler shows as the cluster's ``Degraded`` state (as Kubernetes marks a Job
``BackoffLimitExceeded``).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

BASE_S = 2.0
MAX_S = 300.0
GIVE_UP_AFTER = 8  # refusals in a row: waits of 2, 4, ... 128 s between them (254 s in all)


@dataclass(frozen=True)
class _Refusals:
    count: int  # in a row
    next_at: float  # when the next start may run (inf: given up)
    why: str  # the last refusal
    cluster: str  # the cluster's name, for `given_up`


class StartBackoff:
    """Per key (a cluster's uid): how many starts in a row were refused and when the next may run."""

    def __init__(
        self,
        base_s: float = BASE_S,
        max_s: float = MAX_S,
        clock: Callable[[], float] = time.monotonic,
        give_up_after: int = GIVE_UP_AFTER,
    ) -> None:
        self.base_s, self.max_s, self.give_up_after = base_s, max_s, give_up_after
        self._clock = clock
        self._lock = threading.Lock()
        self._state: dict[str, _Refusals] = {}

    def waiting(self, key: str) -> tuple[float, str] | None:
        """(seconds until the next start of `key` may run, the last refusal), or None: it may run now.
        The seconds are ``inf`` once given up."""
        with self._lock:
            state = self._state.get(key)
        if state is None:
            return None
        left = state.next_at - self._clock()
        return (left, state.why) if left > 0 else None

    def refused(self, key: str, why: str, cluster: str = "") -> tuple[int, float]:
        """Record a refused start of `key` (cluster `cluster`); (refusals in a row, seconds until the next
        may run: ``inf`` when this one was the last the server tries)."""
        with self._lock:
            before = self._state.get(key)
            count = (before.count if before is not None else 0) + 1
            delay = (
                math.inf if count >= self.give_up_after else min(self.max_s, self.base_s * 2 ** (count - 1))
            )
            self._state[key] = _Refusals(count, self._clock() + delay, why, cluster)
        return count, delay

    def started(self, key: str) -> None:
        """The backend accepted a start of `key`: the next refusal waits `base_s` again."""
        with self._lock:
            self._state.pop(key, None)

    reset = started  # the owner acted (a scale): try again at once, counting afresh

    def given_up(self) -> dict[str, str]:
        """Each cluster (by name) whose starts were given up, and why (for its Degraded reason)."""
        with self._lock:
            states = [s for s in self._state.values() if math.isinf(s.next_at) and s.cluster]
        return {
            s.cluster: (
                f"gave up starting containers after {s.count} refused starts in a row (the last: {s.why}); "
                "fix the cause, then scale the cluster to try again, or delete it"
            )
            for s in states
        }
