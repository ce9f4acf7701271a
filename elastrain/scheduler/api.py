"""Scheduler data model: the cluster state a policy sees, the decisions it returns, and :func:`apply`.

A policy is a pure function ``decide(state) -> list[Decision]``. :func:`apply` is the one place the
inventory changes: it validates every decision in order (no GPU double-booked, a job never below its
minimum, a gang started only with at least its minimum) and returns a new state; an invalid decision
raises :class:`InvalidDecision` and leaves the input state untouched (states are immutable).

Units: a job has workers (containers) of ``gpus_per_worker`` GPUs each, all on one node.
"""

from __future__ import annotations

import bisect
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar

from elastrain.scheduler.decisions import (
    Decision,
    DecisionKind,
    Finish,
    Grow,
    Preempt,
    PreemptToMin,
    Shrink,
    Start,
    Wait,
)
from elastrain.scheduler.inventory import InvalidDecision, Inventory, Placement, placement_workers
from elastrain.scheduler.queue_index import (
    NeedKind,
    QueueIds,
    QueueRanking,
    QueueView,
    cached_view,
    hand_over,
)

__all__ = [
    "ClusterState",
    "Decision",
    "DecisionKind",
    "Finish",
    "Grow",
    "InvalidDecision",
    "Job",
    "Node",
    "Placement",
    "Policy",
    "Preempt",
    "PreemptToMin",
    "Shrink",
    "Start",
    "Wait",
    "apply",
    "check_consistency",
    "queue_key",
]


@dataclass(frozen=True, slots=True)
class Node:
    """A machine: ``gpus`` in total, ``free`` not allocated to any job."""

    id: str
    gpus: int
    free: int

    def __post_init__(self) -> None:
        if not 0 <= self.free <= self.gpus:
            raise InvalidDecision(f"node {self.id}: free GPUs {self.free} outside 0..{self.gpus}")


@dataclass(frozen=True, slots=True)
class Job:
    """A job (an elastrain cluster) as the scheduler sees it.

    ``requested_workers`` is the fixed size a non-elastic policy starts it at (0: ``max_workers``).
    ``throughput`` holds measured samples/s per world size ``((workers, samples_per_s), ...)``; until
    measured, ``model`` names the fitted throughput curve (see :mod:`elastrain.scheduler.throughput`).
    ``workers`` (derived from ``placement``) is the number running now, 0 while queued.
    ``attained_gpu_s`` is the GPU-seconds of service received up to ``service_since_s``; a running
    job accrues ``gpus`` more per second after that (see :meth:`attained_at`), so nobody has to
    rewrite every running job on every tick. ``reason`` explains the current size ("grown into 2
    idle GPUs").
    """

    id: str
    min_workers: int = 1
    max_workers: int = 1
    gpus_per_worker: int = 1
    priority: int = 0
    arrival_s: float = 0.0
    requested_workers: int = 0
    placement: Placement = ()
    throughput: tuple[tuple[int, float], ...] = ()
    model: str = ""
    attained_gpu_s: float = 0.0
    service_since_s: float = 0.0
    reason: str = ""
    workers: int = field(init=False, repr=False, compare=False)  # derived from ``placement``

    def __post_init__(self) -> None:
        object.__setattr__(self, "workers", placement_workers(self.placement))
        if not 1 <= self.min_workers <= self.max_workers or self.gpus_per_worker < 1:
            raise InvalidDecision(
                f"job {self.id}: need 1 <= min_workers ({self.min_workers}) <= max_workers "
                f"({self.max_workers}) and gpus_per_worker ({self.gpus_per_worker}) >= 1"
            )
        if not self.min_workers <= self.requested <= self.max_workers:
            raise InvalidDecision(f"job {self.id}: requested_workers {self.requested} outside min..max")

    @property
    def requested(self) -> int:
        """The fixed size for non-elastic policies."""
        return self.requested_workers or self.max_workers

    @property
    def gpus(self) -> int:
        """GPUs held now."""
        return self.workers * self.gpus_per_worker

    @property
    def nodes(self) -> int:
        """Nodes the job spans now (0 while queued)."""
        return len(self.placement)

    def waiting_since(self) -> float:
        """When a queued job last entered the queue: its arrival, or its last preemption."""
        return max(self.arrival_s, self.service_since_s)

    def attained_at(self, now_s: float) -> float:
        """GPU-seconds of service received by ``now_s``."""
        if not self.placement:
            return self.attained_gpu_s
        return self.attained_gpu_s + self.gpus * max(0.0, now_s - self.service_since_s)


def queue_key(job: Job) -> tuple[int, float, str]:
    """The canonical queue order: higher priority first, then earlier arrival, then id."""
    return (-job.priority, job.arrival_s, job.id)


@dataclass(frozen=True)
class ClusterState:
    """Everything a policy sees: nodes, running jobs, queued jobs (in :func:`queue_key` order), time.

    It also caches indexes of its queue (:meth:`queue_ranking`), which a state derived from it by
    :meth:`with_arrivals`, :meth:`with_time` or :func:`apply` takes over and updates, so a long queue
    is not re-sorted at every decision (see :mod:`elastrain.scheduler.queue_index`).
    """

    nodes: tuple[Node, ...]
    running: tuple[Job, ...] = ()
    queued: tuple[Job, ...] = ()
    now_s: float = 0.0
    _views: dict[object, QueueView] = field(default_factory=dict, init=False, repr=False, compare=False)

    @classmethod
    def empty(cls, gpus: int, gpus_per_node: int = 8) -> ClusterState:
        """A cluster of ``gpus`` GPUs on nodes ``n000, n001, ...`` of ``gpus_per_node`` (last: the rest)."""
        if gpus < 1 or gpus_per_node < 1:
            raise InvalidDecision("a cluster needs at least one GPU and one GPU per node")
        sizes = [gpus_per_node] * (gpus // gpus_per_node) + (
            [gpus % gpus_per_node] if gpus % gpus_per_node else []
        )
        return cls(nodes=tuple(Node(f"n{i:03d}", s, s) for i, s in enumerate(sizes)))

    @property
    def total_gpus(self) -> int:
        """GPUs in the cluster."""
        return sum(n.gpus for n in self.nodes)

    @property
    def free_gpus(self) -> int:
        """GPUs not allocated."""
        return sum(n.free for n in self.nodes)

    def inventory(self) -> Inventory:
        """A mutable scratch copy of the free GPUs and placements."""
        return Inventory({n.id: n.free for n in self.nodes}, {j.id: j.placement for j in self.running})

    def with_arrivals(self, jobs: Iterable[Job]) -> ClusterState:
        """New queued jobs (no placement) inserted in queue order."""
        queued = list(self.queued)
        arrivals = tuple(jobs)
        for job in arrivals:
            if job.placement:
                raise InvalidDecision(f"job {job.id}: an arriving job cannot hold GPUs")
            if queued and queue_key(job) >= queue_key(queued[-1]):
                queued.append(job)
            else:
                queued.insert(bisect.bisect_left(queued, queue_key(job), key=queue_key), job)
        new = replace(self, queued=tuple(queued))
        hand_over(self._views, self.queued, new._views, new.queued, added=arrivals)
        return new

    def with_time(self, now_s: float, running: Sequence[Job] | None = None) -> ClusterState:
        """The same inventory at ``now_s``, optionally with updated running jobs (same placements)."""
        if running is None:
            new = replace(self, now_s=now_s)
        else:
            new = replace(self, now_s=now_s, running=tuple(running))
        hand_over(self._views, self.queued, new._views, new.queued)
        return new

    def queue_ranking(self, thresholds: tuple[float, ...], need: NeedKind) -> QueueRanking:
        """The queue in least-attained-service rank order for ``thresholds`` (GPU-seconds), bucketed
        by ``need`` (see :class:`~elastrain.scheduler.queue_index.QueueRanking`)."""
        key = ("rank", thresholds, need)
        return cached_view(self._views, self.queued, key, lambda: QueueRanking(thresholds, need, self.queued))

    def queued_job(self, job_id: str) -> Job | None:
        """The queued job ``job_id``, or None."""
        return cached_view(self._views, self.queued, "ids", lambda: QueueIds(self.queued)).by_id.get(job_id)


class Policy(ABC):
    """A scheduling policy: a pure function from the cluster state to decisions."""

    name: ClassVar[str] = ""

    @abstractmethod
    def decide(self, state: ClusterState) -> list[Decision]:
        """Decisions for ``state``, in the order :func:`apply` must carry them out."""

    def next_wakeup_s(self, state: ClusterState) -> float | None:
        """Earliest virtual time at which :meth:`decide` could change its mind with no arrival or
        completion (e.g. a job crossing a service threshold); None if only events matter."""
        return None


def apply(state: ClusterState, decisions: Sequence[Decision]) -> ClusterState:
    """Validate ``decisions`` in order and return the new state (``state`` is never modified)."""
    if not decisions:
        return state
    inv = state.inventory()
    running: dict[str, Job] = {j.id: j for j in state.running}
    wanted = {d.job_id for d in decisions if d.kind in (DecisionKind.START, DecisionKind.FINISH)}
    queued_at = _find_queued(state, wanted - running.keys())
    removed_from_queue: set[int] = set()
    requeued: list[Job] = []
    for d in decisions:
        job = running.get(d.job_id)
        if d.kind is DecisionKind.START:
            if job is not None or d.job_id not in queued_at or queued_at[d.job_id] in removed_from_queue:
                raise InvalidDecision(f"start {d.job_id}: not a queued job")
            idx = queued_at[d.job_id]
            job = state.queued[idx]
            workers = getattr(d, "workers", 0)
            if not job.min_workers <= workers <= job.max_workers:
                raise InvalidDecision(
                    f"start {d.job_id}: gang of {workers} outside {job.min_workers}..{job.max_workers}"
                )
            placement = inv.add(job.id, job.gpus_per_worker, workers)
            removed_from_queue.add(idx)
            running[job.id] = replace(job, placement=placement, reason=d.reason, service_since_s=state.now_s)
        elif d.kind is DecisionKind.WAIT:
            if job is None and state.queued_job(d.job_id) is None:
                raise InvalidDecision(f"wait {d.job_id}: unknown job")
        elif d.kind is DecisionKind.FINISH:
            if job is not None:
                inv.remove_all(job.id, job.gpus_per_worker)
                del running[job.id]
            elif d.job_id in queued_at and queued_at[d.job_id] not in removed_from_queue:
                removed_from_queue.add(queued_at[d.job_id])
            else:
                raise InvalidDecision(f"finish {d.job_id}: unknown job")
        else:
            if job is None:
                raise InvalidDecision(f"{d.kind.value} {d.job_id}: not a running job")
            job = replace(job, attained_gpu_s=job.attained_at(state.now_s), service_since_s=state.now_s)
            running[job.id] = _resize(inv, job, d)
            if d.kind is DecisionKind.PREEMPT:
                del running[job.id]
                requeued.append(replace(job, placement=(), reason=d.reason))
    nodes = tuple(replace(n, free=inv.free[n.id]) if inv.free[n.id] != n.free else n for n in state.nodes)
    old_ids = {j.id for j in state.running}
    order = [j.id for j in state.running if j.id in running] + [i for i in running if i not in old_ids]
    queued = _drop(state.queued, removed_from_queue)
    new = ClusterState(
        nodes=nodes, running=tuple(running[i] for i in order), queued=queued, now_s=state.now_s
    )
    left = (state.queued[i].id for i in removed_from_queue)
    hand_over(state._views, state.queued, new._views, new.queued, removed=left)
    return new.with_arrivals(requeued) if requeued else new


def _resize(inv: Inventory, job: Job, d: Decision) -> Job:
    """Carry out a grow / shrink / preempt-to-min / preempt on ``inv``; return the updated job."""
    now = inv.workers(job.id)
    if d.kind is DecisionKind.PREEMPT:
        inv.remove_all(job.id, job.gpus_per_worker)
        return job
    target = job.min_workers if d.kind is DecisionKind.PREEMPT_TO_MIN else getattr(d, "workers", 0)
    if d.kind is DecisionKind.GROW:
        if not now < target <= job.max_workers:
            raise InvalidDecision(f"grow {job.id}: {now} -> {target} (max {job.max_workers})")
        placement = inv.add(job.id, job.gpus_per_worker, target - now)
    else:
        if not job.min_workers <= target < now:
            raise InvalidDecision(f"{d.kind.value} {job.id}: {now} -> {target} (min {job.min_workers})")
        placement = inv.remove(job.id, job.gpus_per_worker, now - target)
    return replace(job, placement=placement, reason=d.reason)


def _find_queued(state: ClusterState, ids: set[str]) -> dict[str, int]:
    """Positions of ``ids`` in ``state.queued``: by id (the state's cached index), then by bisection
    on :func:`queue_key` (the queue can hold tens of thousands of jobs); a scan if the queue is not
    in that order (a state built by hand)."""
    found: dict[str, int] = {}
    queued = state.queued
    for jid in ids:
        job = state.queued_job(jid)
        if job is None:
            continue
        i = bisect.bisect_left(queued, queue_key(job), key=queue_key)
        found[jid] = i if i < len(queued) and queued[i] is job else queued.index(job)
    return found


def _drop(queued: tuple[Job, ...], indices: set[int]) -> tuple[Job, ...]:
    """``queued`` without the given positions (slices, not a per-element loop)."""
    if not indices:
        return queued
    out: list[Job] = []
    prev = 0
    for i in sorted(indices):
        out.extend(queued[prev:i])
        prev = i + 1
    out.extend(queued[prev:])
    return tuple(out)


def check_consistency(state: ClusterState) -> None:
    """Raise :class:`InvalidDecision` unless the inventory adds up: every node's free GPUs plus the
    GPUs placed on it equal its size, every running job holds min..max workers on known nodes,
    queued jobs hold none, no job is listed twice, and the queue is in :func:`queue_key` order."""
    used = {n.id: 0 for n in state.nodes}
    seen: set[str] = set()
    for job in state.running:
        if job.id in seen:
            raise InvalidDecision(f"job {job.id} listed twice")
        seen.add(job.id)
        if not job.min_workers <= job.workers <= job.max_workers:
            raise InvalidDecision(f"job {job.id}: {job.workers} workers outside min..max")
        for node, count in job.placement:
            if node not in used or count <= 0:
                raise InvalidDecision(f"job {job.id}: bad placement {job.placement}")
            used[node] += count * job.gpus_per_worker
    for job in state.queued:
        if job.id in seen or job.placement:
            raise InvalidDecision(f"queued job {job.id} listed twice or holding GPUs")
        seen.add(job.id)
    for nd in state.nodes:
        if used[nd.id] + nd.free != nd.gpus:
            raise InvalidDecision(f"node {nd.id}: {used[nd.id]} used + {nd.free} free != {nd.gpus}")
    keys = [queue_key(j) for j in state.queued]
    if keys != sorted(keys):
        raise InvalidDecision("queue out of order")
