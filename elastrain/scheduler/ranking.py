"""Least-attained-service bookkeeping shared by the preemptive policies (``tiresias``, ``elastic``).

A job's *attained service* is the GPU-seconds it has held GPUs (:meth:`Job.attained_at`); a list of
ascending thresholds splits it into levels (queues): level 0 below the first threshold, and so on.
Lower level = better rank. Both policies rank running and queued jobs together, so a job keeps its
place when it is preempted and re-queued.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence

from elastrain.scheduler.api import Job

GPU_HOUR = 3600.0


def service_level(thresholds: Sequence[float], job: Job, now_s: float) -> int:
    """The job's level at ``now_s``: how many of ``thresholds`` (GPU-seconds) its service has reached."""
    return bisect.bisect_right(thresholds, job.attained_at(now_s))


def next_crossing_s(thresholds: Sequence[float], running: Iterable[Job], now_s: float) -> float | None:
    """When the next running job's attained service reaches its next threshold (None if never)."""
    best: float | None = None
    for job in running:
        gpus = job.gpus
        if gpus <= 0:
            continue
        attained = job.attained_at(now_s)
        lv = bisect.bisect_right(thresholds, attained)
        if lv < len(thresholds):
            t = now_s + (thresholds[lv] - attained) / gpus
            if best is None or t < best:
                best = t
    return best


def rank_jobs(
    running: Sequence[Job], queued: Sequence[Job], thresholds: Sequence[float], now_s: float
) -> list[Job]:
    """Running and queued jobs, best first, by (priority, level, arrival, id). Written as one flat
    loop: the queue can hold thousands of jobs and this runs at every event."""
    bisect_right = bisect.bisect_right
    keyed: list[tuple[int, int, float, str, int]] = []
    jobs = [*running, *queued]
    for i, job in enumerate(running):
        lv = bisect_right(thresholds, job.attained_at(now_s))
        keyed.append((-job.priority, lv, job.arrival_s, job.id, i))
    for i, job in enumerate(queued, len(running)):
        lv = bisect_right(thresholds, job.attained_gpu_s)  # fixed while queued
        keyed.append((-job.priority, lv, job.arrival_s, job.id, i))
    keyed.sort()
    return [jobs[k[-1]] for k in keyed]


def earliest_waiting_since(queued: Iterable[Job]) -> float | None:
    """The earliest time a queued job last entered the queue (for the starvation wakeup)."""
    best = math.inf
    for job in queued:
        since = job.service_since_s if job.service_since_s > job.arrival_s else job.arrival_s
        if since < best:
            best = since
    return best if best < math.inf else None


def protected_extras(kept: Iterable[Job], priority: int) -> int:
    """GPUs above their minimum that kept *running* jobs of a priority higher than ``priority`` hold:
    a lower-priority job may not reclaim them (priority bands are strict)."""
    return sum(
        (j.workers - j.min_workers) * j.gpus_per_worker
        for j in kept
        if j.priority > priority and j.workers > j.min_workers
    )
