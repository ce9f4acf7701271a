"""Which hosts each running job trains on, as its own progress reports say (kept in memory).

A scaled-down container is removed once its workers have left: the reconcile policy waits until
every running job of the cluster has reported, after the container began terminating, a membership
without the container's address. Reports arrive about once a second, so after a server restart this
map refills within a second; a job that never reports hosts makes the policy wait for the grace bound.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import datetime, timezone


@dataclass(frozen=True)
class JobHosts:
    """A running job's last reported membership (``at`` is None before its first report)."""

    job_id: int
    at: datetime | None
    hosts: frozenset[str]


class JobMembership:
    """Thread-safe map job id -> latest reported hosts."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._latest: dict[int, tuple[datetime, frozenset[str]]] = {}

    def record(self, job_id: int, hosts: list[str], at: datetime | None = None) -> None:
        """Remember that `job_id` trains on `hosts` now."""
        with self._lock:
            self._latest[job_id] = (at or datetime.now(timezone.utc), frozenset(hosts))

    def forget(self, job_id: int) -> None:
        """The job ended."""
        with self._lock:
            self._latest.pop(job_id, None)

    def of(self, job_ids: list[int]) -> tuple[JobHosts, ...]:
        """The memberships of `job_ids` (unknown ones with ``at=None``)."""
        with self._lock:
            found = {j: self._latest.get(j) for j in job_ids}
        return tuple(
            JobHosts(j, None, frozenset()) if v is None else JobHosts(j, v[0], v[1]) for j, v in found.items()
        )
