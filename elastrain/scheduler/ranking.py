"""Least-attained-service bookkeeping shared by the preemptive policies (``tiresias``, ``elastic``).

A job's *attained service* is the GPU-seconds it has held GPUs (:meth:`Job.attained_at`); a list of
ascending thresholds splits it into levels (queues): level 0 below the first threshold, and so on.
Lower level = better rank. Both policies rank running and queued jobs together, so a job keeps its
place when it is preempted and re-queued.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

from elastrain.scheduler.api import Job
from elastrain.scheduler.queue_index import Entry, NeedKind, QueueCursor, need_of

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


def running_entries(running: Iterable[Job], thresholds: Sequence[float], now_s: float) -> list[Entry]:
    """The running jobs' rank keys at ``now_s`` (their level follows their growing service), sorted.
    (The :func:`~elastrain.scheduler.queue_index.rank_entry` tuple, inlined: this runs per event.)"""
    bisect_right = bisect.bisect_right
    out = [
        (-j.priority, bisect_right(thresholds, j.attained_at(now_s)), j.arrival_s, j.id, j) for j in running
    ]
    out.sort()
    return out


def keep_fitting(running: list[Entry], queue: QueueCursor, budget: int, kind: NeedKind) -> list[Job]:
    """Running and queued jobs in rank order, each kept if its need fits in the GPUs not yet
    promised, until none is left or nothing left fits (queued jobs that do not fit are never
    visited); the kept jobs in rank order. One flat merge loop: it runs at every event."""
    kept: list[Job] = []
    q = queue.peek(budget)
    requested = kind is NeedKind.REQUESTED
    for entry in running:
        while q is not None and q < entry:  # peek: it fits
            kept.append(q[-1])
            budget -= need_of(q[-1], kind)
            queue.advance()
            if budget <= 0:
                return kept
            q = queue.peek(budget)
        job = entry[-1]
        need = (job.requested if requested else job.min_workers) * job.gpus_per_worker  # need_of, inlined
        if need <= budget:
            kept.append(job)
            budget -= need
            if budget <= 0:
                return kept
            q = queue.peek(budget)
    while q is not None:
        kept.append(q[-1])
        budget -= need_of(q[-1], kind)
        queue.advance()
        if budget <= 0:
            break
        q = queue.peek(budget)
    return kept


class RankedStream:
    """Running and queued jobs in :func:`rank_jobs` order, the queue walked lazily through a
    :class:`~elastrain.scheduler.queue_index.QueueCursor`, so a scan that stops early costs what it
    visits, not the queue's length. ``running_first``: every running job before any queued one."""

    __slots__ = ("_next_running", "_queue", "_running", "_running_first")

    def __init__(self, running: list[Entry], queue: QueueCursor, running_first: bool = False) -> None:
        self._running, self._queue, self._running_first = running, queue, running_first
        self._next_running = 0

    def next(self, max_need: int) -> Job | None:
        """The next job, leaving out queued jobs that need more than ``max_need`` GPUs (a bound that
        must never grow between calls); every running job comes, whatever its need. None at the end."""
        queued = self._queue.peek(max_need)
        i = self._next_running
        if i < len(self._running) and (queued is None or self._running_first or self._running[i] < queued):
            self._next_running = i + 1
            return self._running[i][-1]
        if queued is None:
            return None
        self._queue.advance()
        return queued[-1]


def protected_extras(kept: Iterable[Job], priority: int) -> int:
    """GPUs above their minimum that kept *running* jobs of a priority higher than ``priority`` hold:
    a lower-priority job may not reclaim them (priority bands are strict)."""
    return sum(
        (j.workers - j.min_workers) * j.gpus_per_worker
        for j in kept
        if j.priority > priority and j.workers > j.min_workers
    )
