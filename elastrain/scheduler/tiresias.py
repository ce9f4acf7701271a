"""``tiresias``: discretized two-dimensional least-attained-service (2D-LAS) with preemption.

Reference: Juncheng Gu, Mosharaf Chowdhury, Kang G. Shin, Yibo Zhu, Myeongjae Jeon, Junjie Qian,
Hongqiang Liu, Chuanxiong Guo, "Tiresias: A GPU Cluster Manager for Distributed Deep Learning",
USENIX NSDI 2019, section 4 (Discretized 2D-LAS). The Pollux (OSDI'21) and Sia (SOSP'23) papers use
it as their baseline.

As implemented here:

* A job's attained service is GPUs x time it has run (``Job.attained_gpu_s``; the "2D" in 2D-LAS).
* Service is discretized into queues by ``thresholds`` (default one threshold of 3,600 GPU-seconds:
  queue 0 below it, queue 1 above). Lower queue = higher priority; within a queue jobs are FIFO by
  arrival. A user ``priority`` ranks above the queues.
* Jobs are gangs at their requested size (Tiresias does not resize). In order, each queued job
  starts if it fits; else running jobs in strictly worse (priority, queue) are preempted, worst first
  (highest queue, then latest arrival), if that frees enough. Preempted jobs keep their progress and
  attained service and are queued again. The first job that cannot start blocks the rest.
* Simplifications: no starvation promotion (the paper's PROMOTE knob), no placement consolidation
  (the paper's profile-guided placement), and service is checked at events and wakeups
  (:meth:`TiresiasPolicy.next_wakeup_s` gives the next threshold crossing).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence

from elastrain.scheduler.api import ClusterState, Decision, Job, Policy, Preempt, Start, Wait


class TiresiasPolicy(Policy):
    """Discretized 2D-LAS: least attained GPU-service first, preemptive, fixed-size gangs."""

    name = "tiresias"

    def __init__(self, thresholds: Sequence[float] = (3600.0,)) -> None:
        self.thresholds = tuple(sorted(thresholds))

    def level(self, job: Job, now_s: float = 0.0) -> int:
        """The job's queue at ``now_s``: how many thresholds its attained GPU-seconds have reached."""
        return bisect.bisect_right(self.thresholds, job.attained_at(now_s))

    def _key(self, job: Job, now_s: float = 0.0) -> tuple[int, int, float, str]:
        return (-job.priority, self.level(job, now_s), job.arrival_s, job.id)

    def _candidates(self, queued: Sequence[Job]) -> Iterator[Job]:
        """Queued jobs in (priority, queue, arrival) order, lazily: the queue is already in
        (priority, arrival) order, so queue-0 jobs are yielded as the scan meets them and the others
        are held back to the end of their priority band (a caller that stops early scans little)."""
        first = self.thresholds[0] if self.thresholds else float("inf")
        held: list[Job] = []
        band: int | None = None
        for job in queued:
            if job.priority != band:
                yield from self._by_level(held)
                held, band = [], job.priority
            if job.attained_gpu_s < first:
                yield job
            else:
                held.append(job)
        yield from self._by_level(held)

    def _by_level(self, held: list[Job]) -> Iterator[Job]:
        """Queued jobs of one priority band, in arrival order, regrouped by queue (stable)."""
        if len(self.thresholds) <= 1:
            return iter(held)  # all in queue 1 already
        return iter(sorted(held, key=lambda j: bisect.bisect_right(self.thresholds, j.attained_gpu_s)))

    def decide(self, state: ClusterState) -> list[Decision]:
        """Start jobs in 2D-LAS order, preempting strictly lower-ranked running jobs when needed."""
        inv = state.inventory()
        now = state.now_s
        victims = sorted(state.running, key=lambda j: self._key(j, now))  # best first; preempt from the end
        out: list[Decision] = []
        for job in self._candidates(state.queued):
            n, gpw = job.requested, job.gpus_per_worker
            if inv.capacity(gpw) < n:
                rank = self._key(job)[:2]
                trial = inv.copy()
                chosen: list[Job] = []
                for victim in reversed(victims):
                    if trial.capacity(gpw) >= n or self._key(victim, now)[:2] <= rank:
                        break
                    trial.remove_all(victim.id, victim.gpus_per_worker)
                    chosen.append(victim)
                if trial.capacity(gpw) < n:
                    out.append(Wait(job.id, reason=f"queue {rank[1]}: waiting for {n * gpw} GPUs"))
                    break
                inv = trial
                for victim in chosen:
                    victims.remove(victim)
                    out.append(
                        Preempt(
                            victim.id,
                            reason=f"preempted for cluster {job.id} (queue {self.level(victim, now)} "
                            f"after {victim.attained_at(now):.0f} GPU-s)",
                        )
                    )
            inv.add(job.id, gpw, n)
            out.append(Start(job.id, n, reason=f"queue {self.level(job)}: started at {n} worker(s)"))
        return out

    def next_wakeup_s(self, state: ClusterState) -> float | None:
        """When the next running job crosses a threshold (only matters while jobs are queued)."""
        if not state.queued:
            return None
        times = []
        now = state.now_s
        for job in state.running:
            lv = self.level(job, now)
            if lv < len(self.thresholds) and job.gpus > 0:
                times.append(now + (self.thresholds[lv] - job.attained_at(now)) / job.gpus)
        return min(times, default=None)
