"""Indexes of the queue that :class:`~elastrain.scheduler.api.ClusterState` keeps between decisions.

The least-attained-service policies rank every job by (user priority, service level, arrival, id).
A queued job's level is fixed while it waits (attained service only grows while a job runs), so the
queue's rank order changes only where jobs arrive, start, finish or are preempted.
:class:`QueueRanking` keeps that order under those changes (a bisect each) instead of re-sorting
the whole queue at every event: with a long backlog (a trace replayed ten times) a full re-sort
made every decision cost as much as the queue is long. It is bucketed by the GPUs a job needs to be
kept, so a scan with ``b`` GPUs left never visits a job needing more (:class:`QueueCursor`).
:class:`QueueIds` finds a queued job by id (for :func:`~elastrain.scheduler.api.apply`).

Ownership: a state derived from another (:meth:`ClusterState.with_arrivals`, ``with_time``,
:func:`~elastrain.scheduler.api.apply`) takes its parent's indexes over and updates them; a view
whose ``queued`` is not the asking state's queue is stale and is rebuilt from that queue, so a
state that is derived twice (or built directly) is still answered correctly, only not incrementally.
"""

from __future__ import annotations

import bisect
import enum
import heapq
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from elastrain.scheduler.api import Job

# (-priority, level, arrival_s, id, job): ids are unique, so comparisons never reach the job.
Entry = tuple[int, int, float, str, "Job"]


class NeedKind(enum.Enum):
    """The GPUs a policy's scan needs to keep a job."""

    REQUESTED = "requested"  # its requested gang (tiresias)
    MINIMUM = "minimum"  # its minimum (elastic)


def need_of(job: Job, kind: NeedKind) -> int:
    """GPUs ``job`` needs under ``kind``."""
    workers = job.requested if kind is NeedKind.REQUESTED else job.min_workers
    return workers * job.gpus_per_worker


def rank_entry(job: Job, level: int) -> Entry:
    """The sort key of a job at ``level``, with the job last."""
    return (-job.priority, level, job.arrival_s, job.id, job)


class QueueView(Protocol):
    """An index over one queue tuple, updated in place when the queue changes."""

    queued: tuple[Job, ...]

    def update(self, queued: tuple[Job, ...], removed: Iterable[str], added: Iterable[Job]) -> None:
        """Now describe ``queued``: the old queue less ``removed`` (ids) plus ``added``."""


V = TypeVar("V", bound=QueueView)


def cached_view(
    views: dict[object, QueueView], queued: tuple[Job, ...], key: object, build: Callable[[], V]
) -> V:
    """The view under ``key`` if it describes ``queued``, else a fresh one (stored under ``key``)."""
    view = views.get(key)
    if view is None or view.queued is not queued:
        view = views[key] = build()
    return view  # type: ignore[return-value]  # each key is only ever built by one ``build``


def hand_over(
    views: dict[object, QueueView],
    old: tuple[Job, ...],
    new_views: dict[object, QueueView],
    new: tuple[Job, ...],
    removed: Iterable[str] = (),
    added: Iterable[Job] = (),
) -> None:
    """Move the views of queue ``old`` into ``new_views``, updated to queue ``new`` (stale ones stay)."""
    removed, added = tuple(removed), tuple(added)
    for key, view in list(views.items()):
        if view.queued is old:
            del views[key]
            view.update(new, removed, added)
            new_views[key] = view


class QueueIds:
    """Queued jobs by id."""

    __slots__ = ("by_id", "queued")

    def __init__(self, queued: tuple[Job, ...]) -> None:
        self.queued = queued
        self.by_id = {j.id: j for j in queued}

    def update(self, queued: tuple[Job, ...], removed: Iterable[str], added: Iterable[Job]) -> None:
        """See :class:`QueueView`."""
        for jid in removed:
            del self.by_id[jid]
        for job in added:
            self.by_id[job.id] = job
        self.queued = queued


class QueueRanking:
    """Queued jobs in (priority, level, arrival, id) order, one sorted bucket per GPU need.

    A queued job's level is the number of ``thresholds`` its ``attained_gpu_s`` has reached. Also
    kept: when each job needing more than one GPU last entered the queue (the elastic policy's
    starvation guard).
    """

    __slots__ = ("_buckets", "_entries", "_waiting", "kind", "queued", "thresholds")

    def __init__(self, thresholds: tuple[float, ...], kind: NeedKind, queued: tuple[Job, ...]) -> None:
        self.thresholds, self.kind, self.queued = thresholds, kind, queued
        self._buckets: dict[int, list[Entry]] = {}
        self._entries: dict[str, tuple[int, Entry]] = {}  # id -> (need, entry)
        self._waiting: list[tuple[float, str]] = []  # (waiting since, id), needing > 1 GPU
        for job in queued:
            need, entry = self._entry(job)
            self._buckets.setdefault(need, []).append(entry)
            self._entries[job.id] = (need, entry)
            if need > 1:
                self._waiting.append((job.waiting_since(), job.id))
        for bucket in self._buckets.values():
            bucket.sort()
        self._waiting.sort()

    def _entry(self, job: Job) -> tuple[int, Entry]:
        level = bisect.bisect_right(self.thresholds, job.attained_gpu_s)  # fixed while queued
        return need_of(job, self.kind), rank_entry(job, level)

    def update(self, queued: tuple[Job, ...], removed: Iterable[str], added: Iterable[Job]) -> None:
        """See :class:`QueueView`."""
        for jid in removed:
            need, entry = self._entries.pop(jid)
            bucket = self._buckets[need]
            del bucket[bisect.bisect_left(bucket, entry)]
            if not bucket:
                del self._buckets[need]
            if need > 1:
                del self._waiting[bisect.bisect_left(self._waiting, (entry[-1].waiting_since(), jid))]
        for job in added:
            need, entry = self._entry(job)
            bisect.insort(self._buckets.setdefault(need, []), entry)
            self._entries[job.id] = (need, entry)
            if need > 1:
                bisect.insort(self._waiting, (job.waiting_since(), job.id))
        self.queued = queued

    def ranked(self) -> Iterator[Job]:
        """Every queued job, best first."""
        for entry in heapq.merge(*self._buckets.values()):
            yield entry[-1]

    def cursor(self) -> QueueCursor:
        """A fresh walk over the queue in rank order (see :class:`QueueCursor`)."""
        return QueueCursor(self._buckets)

    def earliest_multi_gpu_wait(self) -> float | None:
        """The earliest time a queued job needing more than one GPU last entered the queue."""
        return self._waiting[0][0] if self._waiting else None


class QueueCursor:
    """Walks a :class:`QueueRanking` in rank order, leaving out (for good) every job that needs more
    GPUs than ``max_need``, a bound that must never grow during the walk (a scan's GPUs left)."""

    __slots__ = ("_buckets", "_heap")

    def __init__(self, buckets: dict[int, list[Entry]]) -> None:
        self._buckets = buckets
        self._heap = [(bucket[0], need, 0) for need, bucket in buckets.items()]
        heapq.heapify(self._heap)

    def peek(self, max_need: int) -> Entry | None:
        """The next job needing at most ``max_need`` GPUs, not consumed; None when none is left."""
        heap = self._heap
        while heap and heap[0][1] > max_need:
            heapq.heappop(heap)  # its whole bucket needs too much, now and for the rest of the walk
        return heap[0][0] if heap else None

    def advance(self) -> None:
        """Consume the job :meth:`peek` returned."""
        _, need, i = self._heap[0]
        bucket = self._buckets[need]
        if i + 1 < len(bucket):
            heapq.heapreplace(self._heap, (bucket[i + 1], need, i + 1))
        else:
            heapq.heappop(self._heap)
