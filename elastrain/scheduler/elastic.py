"""``elastic``: least-attained-service ranking, minimums first, leftovers by marginal throughput.

One pass over the whole cluster (running and queued jobs alike), returning decisions the caller
(simulator or control plane) carries out:

1. **Rank** every job by (user priority, service level, arrival): the level is the job's attained
   GPU-service against ``thresholds`` (multi-level least-attained-service; default levels split at
   2 and 16 GPU-hours, tuned on the shared Philly window), FIFO within a level.
2. **Minimums in rank order**: each job gets its minimum if it fits in the GPUs not yet promised,
   otherwise it is **skipped** (never blocking the jobs behind it). GPUs a higher-priority job holds
   above its minimum are not promised to lower-priority jobs. Running jobs left without their
   minimum are **preempted** — only ever because better-ranked jobs took the GPUs. *Starvation
   guard*: a queued job that was skipped (a lower-ranked job got GPUs it could not) after waiting
   ``starvation_s`` since it last queued moves to the front of its priority band and the pass is
   redone, so a large minimum cannot be passed over forever.
3. **Admission**: each kept queued job starts at its minimum in the free GPUs; when they do not
   suffice, kept running jobs of the same or lower priority give back GPUs *above their minimum*,
   worst-ranked first (minimums come before anyone's extras).
4. **Leftovers** go one growth step at a time to the job with the highest marginal gain per GPU,
   ``(speed(w + k) - speed(w)) / speed(w) / (k * gpus_per_worker)`` (higher priority first), with
   ``speed`` the placement-aware throughput model (:func:`elastrain.scheduler.throughput.job_speed`:
   the node count is the one the placement would really have), while the gain is at least
   ``min_gain`` and the job is below its maximum. ``k`` may exceed 1 to get over dips (the first
   worker on a second node).

Decisions come out as preemptions, shrinks, starts (at their final size), then grows, one per job.
Resizes are not free for the job (the simulator stalls it ``restart_cost_s``), so the policy only
takes GPUs away from a running job when another job's minimum needs them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace

from elastrain.scheduler.api import ClusterState, Decision, Job, Policy, Preempt, Wait
from elastrain.scheduler.elastic_plan import Plan, SpeedFn, replays
from elastrain.scheduler.queue_index import NeedKind, QueueRanking
from elastrain.scheduler.ranking import (
    GPU_HOUR,
    RankedStream,
    next_crossing_s,
    protected_extras,
    rank_jobs,
    running_entries,
)
from elastrain.scheduler.throughput import job_speed

DEFAULT_THRESHOLDS = (2 * GPU_HOUR, 16 * GPU_HOUR)
DEFAULT_STARVATION_S = 6 * 3600.0
MAX_WAITS = 16


class ElasticPolicy(Policy):
    """Multi-level LAS ranking, skip-if-no-fit minimums, shrink-to-admit, marginal-gain growth.

    ``speed(job, workers, nodes)`` gives a job's throughput in any unit (only ratios are used;
    default: measured samples/s or the fitted model); ``min_gain`` is the smallest relative speed-up
    per added GPU worth a resize (default 2 %); ``thresholds`` are the service levels in GPU-seconds;
    ``starvation_s`` is how long a skipped queued job waits before it goes first in its band.
    ``preemptive=False`` (the control plane, which cannot suspend a cluster yet) never takes a
    running job below its minimum: running jobs keep their minimums ahead of every queued job.
    """

    name = "elastic"

    def __init__(
        self,
        speed: SpeedFn = job_speed,
        min_gain: float = 0.02,
        thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
        starvation_s: float = DEFAULT_STARVATION_S,
        preemptive: bool = True,
    ) -> None:
        self.preemptive = preemptive
        self.speed = speed
        self.min_gain = min_gain
        self.thresholds = tuple(sorted(thresholds))
        self.starvation_s = starvation_s

    def starving(self, job: Job, now_s: float) -> bool:
        """A queued job that has waited ``starvation_s`` since it last queued."""
        return not job.placement and now_s - job.waiting_since() >= self.starvation_s

    def rank(self, state: ClusterState) -> list[Job]:
        """Running and queued jobs, best first, after the starvation guard (module docstring)."""
        ranked = self._running_first(rank_jobs(state.running, state.queued, self.thresholds, state.now_s))
        _, skipped = self._minimums(ranked, state.total_gpus)
        starving = {j.id for j in skipped if self.starving(j, state.now_s)}
        if not starving:
            return ranked
        first = sorted(
            (j for j in ranked if j.id in starving), key=lambda j: (-j.priority, j.waiting_since())
        )
        rest = [j for j in ranked if j.id not in starving]
        promoted = sorted([*first, *rest], key=lambda j: -j.priority)  # stable: promoted first in each band
        return self._running_first(promoted)

    def _running_first(self, ranked: list[Job]) -> list[Job]:
        """Non-preemptive: running jobs (in rank order) before every queued one."""
        if not self.preemptive:
            ranked.sort(key=lambda j: not j.placement)  # stable
        return ranked

    def decide(self, state: ClusterState) -> list[Decision]:
        """See the module docstring.

        Unless a queued job could be starving (then the whole ranking of :meth:`rank` is needed),
        the minimums are handed out walking the queue's cached rank order
        (:meth:`ClusterState.queue_ranking`), which stops once no GPU is left or no job left fits."""
        queue = state.queue_ranking(self.thresholds, NeedKind.MINIMUM)
        queued_ranked: Iterable[Job]
        if self._may_starve(queue, state.now_s):
            ranked = self.rank(state)
            kept, _ = self._minimums(ranked, state.total_gpus)
            queued_ranked = (j for j in ranked if not j.placement)
        else:
            running = running_entries(state.running, self.thresholds, state.now_s)
            stream = RankedStream(running, queue.cursor(), running_first=not self.preemptive)
            kept, _ = self._keep_minimums(stream.next, state.total_gpus)
            queued_ranked = queue.ranked()
        kept_ids = {j.id for j in kept}
        rank = {j.id: i for i, j in enumerate(kept)}
        plan = Plan(state.inventory(), {j.id: j for j in state.running}, self.speed, rank)
        preempts: list[Decision] = []
        for job in state.running:
            if job.id not in kept_ids:
                plan.drop(job.id)
                preempts.append(Preempt(job.id, reason="preempted for better-ranked jobs' minimums"))
        waiting: list[Decision] = []
        for job in kept:
            if not job.placement and not plan.admit(job) and len(waiting) < MAX_WAITS:
                waiting.append(
                    Wait(job.id, reason=f"waiting for {job.min_workers * job.gpus_per_worker} GPUs")
                )
        for job in queued_ranked:
            if len(waiting) >= MAX_WAITS:
                break
            if job.id not in kept_ids:
                need = job.min_workers * job.gpus_per_worker
                waiting.append(Wait(job.id, reason=f"waiting for {need} GPUs (its minimum)"))
        plan.grow(self.min_gain)
        tidy = plan.tidy_decisions()
        if replays(state, plan.jobs, preempts + tidy):
            return preempts + tidy + waiting
        # Multi-GPU workers can make placement order-dependent: fall back to the planning order,
        # where each job's last step carries the reason for its net change.
        final = {d.job_id: d.reason for d in tidy}
        last = {d.job_id: i for i, d in enumerate(plan.steps)}
        steps = [
            replace(d, reason=final[d.job_id]) if last[d.job_id] == i and d.job_id in final else d
            for i, d in enumerate(plan.steps)
        ]
        return preempts + steps + waiting

    def _may_starve(self, queue: QueueRanking, now_s: float) -> bool:
        """Whether a queued job could be starving: only a job needing more than one GPU can be
        skipped (one GPU fits whenever any is left), so the earliest such job decides."""
        since = queue.earliest_multi_gpu_wait()
        return since is not None and now_s - since >= self.starvation_s

    @classmethod
    def _minimums(cls, ranked: Sequence[Job], total_gpus: int) -> tuple[list[Job], list[Job]]:
        """``(kept, skipped)``: the jobs that get their minimum, in rank order (each if it fits in
        what is not yet promised), and the queued jobs passed over for a lower-ranked one."""
        jobs = iter(ranked)
        return cls._keep_minimums(lambda _max_need: next(jobs, None), total_gpus)

    @staticmethod
    def _keep_minimums(next_job: Callable[[int], Job | None], total_gpus: int) -> tuple[list[Job], list[Job]]:
        """:meth:`_minimums` over ``next_job(gpus_left)``, the next job in rank order; it may leave
        out queued jobs needing more than ``gpus_left`` (they could not be kept, only skipped)."""
        budget = total_gpus
        kept: list[Job] = []
        passed: list[Job] = []  # queued jobs that did not fit while GPUs were left
        skipped: list[Job] = []
        band: int | None = None
        protected: set[str] = set()  # jobs whose extras are already withheld
        while (job := next_job(budget)) is not None:
            if job.priority != band:
                if band is not None:
                    fresh = [j for j in kept if j.id not in protected and j.priority > job.priority]
                    budget -= protected_extras(fresh, job.priority)
                    protected.update(j.id for j in fresh)
                band = job.priority
            need = job.min_workers * job.gpus_per_worker
            if need <= budget:
                kept.append(job)
                budget -= need
                skipped.extend(passed)
                passed.clear()
                if budget <= 0:
                    break
            elif not job.placement and budget > 0:
                passed.append(job)
        return kept, skipped

    def next_wakeup_s(self, state: ClusterState) -> float | None:
        """The next threshold crossing or starvation promotion (only matters while jobs queue)."""
        if not state.queued:
            return None
        now = state.now_s
        times = [next_crossing_s(self.thresholds, state.running, now)]
        since = state.queue_ranking(self.thresholds, NeedKind.MINIMUM).earliest_multi_gpu_wait()
        times.append(since + self.starvation_s if since is not None else None)
        future = [t for t in times if t is not None and t > now]
        return min(future, default=None)
