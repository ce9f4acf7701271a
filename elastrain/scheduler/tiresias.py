"""``tiresias``: discretized two-dimensional least-attained-service (2D-LAS), as the Pollux artifact runs it.

Reference: Gu et al., "Tiresias: A GPU Cluster Manager for Distributed Deep Learning", NSDI'19, §4;
the baseline of Pollux (OSDI'21) is ``simulator/tiresias.py`` of petuum/adaptdl ``osdi21-artifact``,
which this policy follows:

* Attained service is GPU-seconds held (``Job.attained_at``). Thresholds split it into queues; the
  default is the artifact's single threshold of **16 GPU-hours** (queue 0 below, queue 1 above),
  configurable (``thresholds``). A user ``priority`` ranks above the queues; within a queue jobs are
  in arrival order (the artifact appends a demoted job to queue 1, i.e. demotion order; here queue 1
  is in arrival order too, which differs only when a later job is demoted first).
* Every decision walks *all* jobs, running and queued, in that order and keeps each whose requested
  gang fits in the GPUs not yet promised (counting GPUs, as the artifact does). A job that does not
  fit is **skipped**, never blocking the jobs behind it. Running jobs that are not kept are preempted
  (they keep their progress and service and queue again); kept queued jobs start at their
  requested size. So a job is preempted only for better-ranked ones.
* Placement: :meth:`Inventory.add` puts workers on the nodes with the most free GPUs first (the
  artifact's ``free_gpus.most_common``); a running job keeps its placement.
* No starvation promotion (the artifact runs with ``solve_starvation = 0``); jobs are gangs at their
  requested size (Tiresias never resizes).
"""

from __future__ import annotations

from collections.abc import Sequence

from elastrain.scheduler.api import ClusterState, Decision, Job, Policy, Preempt, Start, Wait
from elastrain.scheduler.queue_index import NeedKind
from elastrain.scheduler.ranking import (
    GPU_HOUR,
    keep_fitting,
    next_crossing_s,
    running_entries,
    service_level,
)

DEFAULT_THRESHOLDS = (16 * GPU_HOUR,)
MAX_WAITS = 16  # Wait decisions per pass (informational; the queue can hold thousands)


class TiresiasPolicy(Policy):
    """Discretized 2D-LAS: least attained GPU-service first, preemptive, fixed-size gangs, no blocking."""

    name = "tiresias"

    def __init__(self, thresholds: Sequence[float] = DEFAULT_THRESHOLDS) -> None:
        self.thresholds = tuple(sorted(thresholds))

    def level(self, job: Job, now_s: float = 0.0) -> int:
        """The job's queue at ``now_s``: how many thresholds its attained GPU-seconds have reached."""
        return service_level(self.thresholds, job, now_s)

    def rank_key(self, job: Job, now_s: float) -> tuple[int, int, float, str]:
        """Better first: higher priority, lower queue, earlier arrival, then id."""
        return (-job.priority, self.level(job, now_s), job.arrival_s, job.id)

    def decide(self, state: ClusterState) -> list[Decision]:
        """Keep jobs in rank order while their gangs fit; preempt the running rest, start the queued.

        The scan walks the queue's cached rank order (:meth:`ClusterState.queue_ranking`) and stops
        as soon as no GPU is left or no job left fits, so it costs what it keeps, not the queue."""
        now = state.now_s
        queue = state.queue_ranking(self.thresholds, NeedKind.REQUESTED)
        running = running_entries(state.running, self.thresholds, now)
        kept = keep_fitting(running, queue.cursor(), state.total_gpus, NeedKind.REQUESTED)  # rank order
        kept_ids = {j.id for j in kept}
        inv = state.inventory()
        out: list[Decision] = []
        for job in state.running:
            if job.id not in kept_ids:
                inv.remove_all(job.id, job.gpus_per_worker)
                reason = f"preempted (queue {self.level(job, now)} after {job.attained_at(now):.0f} GPU-s)"
                out.append(Preempt(job.id, reason=reason))
        started: set[str] = set()
        for job in kept:
            n, gpw = job.requested, job.gpus_per_worker
            if not job.placement and inv.capacity(gpw) >= n:
                inv.add(job.id, gpw, n)
                started.add(job.id)
                out.append(Start(job.id, n, reason=f"queue {self.level(job, now)}: started at {n} worker(s)"))
        waits: list[Decision] = []  # the best-ranked queued jobs not started
        for job in queue.ranked():
            if len(waits) >= MAX_WAITS:
                break
            if job.id not in started:
                need = job.requested * job.gpus_per_worker
                waits.append(Wait(job.id, reason=f"queue {self.level(job, now)}: waiting for {need} GPUs"))
        return out + waits

    def next_wakeup_s(self, state: ClusterState) -> float | None:
        """When the next running job crosses a threshold (only matters while jobs are queued)."""
        if not state.queued:
            return None
        return next_crossing_s(self.thresholds, state.running, state.now_s)
