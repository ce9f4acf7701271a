"""``elastic``: gang the minimum, share idle GPUs by marginal throughput, shrink to admit.

One pass over the state:

1. **Admit** queued jobs in queue order (priority, then arrival) at their *minimum* size. If the
   minimum does not fit in the free GPUs, running jobs of the same or lower priority that are above
   their minimum give back one worker at a time (lowest priority first, then the one that loses the
   smallest fraction of its speed per GPU) until it fits. A job that cannot be admitted even then
   blocks the queue (no backfilling past it, so large jobs are not starved) and gets a ``Wait``.
2. **Grow**: idle GPUs are handed out step by step to the running or just-admitted job with the
   highest priority, then the largest marginal gain per GPU,
   ``(speed(w + k) - speed(w)) / speed(w) / (k * gpus_per_worker)``, where ``k`` (usually 1) is the
   number of workers that maximises it (so a dip in the curve, such as the first worker on a second
   node, does not stop growth), while that gain is at least ``min_gain`` and the job is below its
   maximum. Speeds come from the job's measured samples/s per
   world size, else from the fitted throughput model (:func:`elastrain.scheduler.throughput.job_speed`).

A job never goes below its minimum; a higher-priority job is never shrunk for a lower-priority one.
Decisions come out as shrinks, then starts (at their final size), then grows.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import replace

from elastrain.scheduler.api import (
    ClusterState,
    Decision,
    Grow,
    Job,
    Policy,
    PreemptToMin,
    Shrink,
    Start,
    Wait,
)
from elastrain.scheduler.inventory import InvalidDecision, Inventory
from elastrain.scheduler.throughput import job_speed

SpeedFn = Callable[[Job, int], float]


class ElasticPolicy(Policy):
    """Min-gang admission with shrinking, then marginal-throughput growth into idle GPUs.

    ``speed(job, workers)`` gives a job's throughput in any unit (only ratios are used; default: the
    measured samples/s or the fitted model); ``min_gain`` is the smallest relative speed-up per added
    GPU worth a resize (default 2 %).
    """

    name = "elastic"

    def __init__(self, speed: SpeedFn = job_speed, min_gain: float = 0.02) -> None:
        self.speed = speed
        self.min_gain = min_gain

    def decide(self, state: ClusterState) -> list[Decision]:
        """See the module docstring."""
        plan = _Plan(state.inventory(), {j.id: j for j in state.running}, self.speed)
        waiting: list[Decision] = []
        for job in state.queued:
            if not plan.admit(job):
                need = job.min_workers * job.gpus_per_worker
                waiting.append(Wait(job.id, reason=f"waiting for {need} GPUs (its minimum)"))
                break
        plan.grow(self.min_gain)
        tidy = plan.tidy_decisions()
        if _replays(state, plan.jobs, tidy):
            return tidy + waiting
        # Multi-GPU workers can make placement order-dependent: fall back to the planning order,
        # where each job's last step carries the reason for its net change.
        final = {d.job_id: d.reason for d in tidy}
        last = {d.job_id: i for i, d in enumerate(plan.steps)}
        steps = [
            replace(d, reason=final[d.job_id]) if last[d.job_id] == i and d.job_id in final else d
            for i, d in enumerate(plan.steps)
        ]
        return steps + waiting


class _Plan:
    """Scratch inventory plus the decisions taken so far (both step by step and coalesced)."""

    def __init__(self, inv: Inventory, running: dict[str, Job], speed: SpeedFn) -> None:
        self.inv = inv
        self.jobs = dict(running)
        self.initial = {i: j.workers for i, j in running.items()}
        self.workers = dict(self.initial)
        self.started: dict[str, int] = {}  # job id -> workers at admission
        self.shrunk_for: dict[str, list[str]] = {}  # victim -> the jobs it was shrunk for
        self.higher_prio: set[str] = set()  # victims shrunk for a higher-priority job
        self.steps: list[Decision] = []  # valid in this order by construction
        self.speed = speed
        self._speeds: dict[tuple[str, int], float] = {}

    def s(self, job: Job, w: int) -> float:
        key = (job.id, w)
        if key not in self._speeds:
            self._speeds[key] = self.speed(job, w)
        return self._speeds[key]

    def loss(self, job: Job, w: int) -> float:
        """Fraction of its speed ``job`` loses per GPU when shrunk from ``w`` to ``w - 1``."""
        now = self.s(job, w)
        return (now - self.s(job, w - 1)) / now / job.gpus_per_worker if now > 0 else 0.0

    def best_step(self, job: Job, w: int, room: int) -> tuple[int, float]:
        """The growth of ``k`` <= ``room`` workers from ``w`` with the largest average gain per GPU,
        ``(speed(w + k) - speed(w)) / speed(w) / (k * gpus_per_worker)``, as ``(k, gain)``. Looking
        past one worker gets over dips in the curve (e.g. the first worker on a second node)."""
        now = self.s(job, w)
        best = (0, 0.0)
        if now <= 0:
            return best
        for k in range(1, min(room, job.max_workers - w) + 1):
            g = (self.s(job, w + k) - now) / now / (k * job.gpus_per_worker)
            if g > best[1] + 1e-12:
                best = (k, g)
        return best

    def admit(self, job: Job) -> bool:
        """Start ``job`` at its minimum, shrinking others if needed; False if it cannot be admitted."""
        need, gpw = job.min_workers, job.gpus_per_worker
        if self.inv.capacity(gpw) < need:
            victims = [
                v
                for v in self.jobs.values()
                if v.priority <= job.priority and self.workers[v.id] > v.min_workers
            ]
            spare = sum((self.workers[v.id] - v.min_workers) * v.gpus_per_worker for v in victims)
            if spare + sum(self.inv.free.values()) < need * gpw:
                return False
            trial, workers = self.inv.copy(), dict(self.workers)
            heap = [(v.priority, self.loss(v, workers[v.id]), v.id) for v in victims]
            heapq.heapify(heap)
            taken: list[str] = []
            while heap and trial.capacity(gpw) < need:
                _, _, vid = heapq.heappop(heap)
                victim = self.jobs[vid]
                trial.remove(vid, victim.gpus_per_worker, 1)
                workers[vid] -= 1
                taken.append(vid)
                if workers[vid] > victim.min_workers:
                    heapq.heappush(heap, (victim.priority, self.loss(victim, workers[vid]), vid))
            if trial.capacity(gpw) < need:
                return False
            self.inv.free, self.inv.placements, self.workers = trial.free, trial.placements, workers
            for vid in dict.fromkeys(taken):
                victim = self.jobs[vid]
                self.shrunk_for.setdefault(vid, []).append(job.id)
                if victim.priority < job.priority:
                    self.higher_prio.add(vid)
                self.steps.append(Shrink(vid, workers[vid], reason=f"shrunk for cluster {job.id}"))
        self.inv.add(job.id, gpw, need)
        self.jobs[job.id] = job
        self.workers[job.id] = self.started[job.id] = need
        self.steps.append(Start(job.id, need, reason=f"started at its minimum {need} worker(s)"))
        return True

    def grow(self, min_gain: float) -> None:
        """Hand idle GPUs out by (priority, best average gain per GPU), one growth step at a time."""
        if not any(self.inv.free.values()):
            return
        heap: list[tuple[int, float, str, int]] = []
        for job in self.jobs.values():
            self._push(heap, job, min_gain)
        while heap and any(self.inv.free.values()):
            _, _, jid, k = heapq.heappop(heap)
            job = self.jobs[jid]
            if self.inv.capacity(job.gpus_per_worker) < k:  # room shrank since: re-evaluate
                self._push(heap, job, min_gain)
                continue
            self.inv.add(jid, job.gpus_per_worker, k)
            w = self.workers[jid] = self.workers[jid] + k
            self.steps.append(Grow(jid, w, reason="grown into idle GPUs"))
            self._push(heap, job, min_gain)

    def _push(self, heap: list[tuple[int, float, str, int]], job: Job, min_gain: float) -> None:
        w = self.workers[job.id]
        if w < job.max_workers:
            k, g = self.best_step(job, w, self.inv.capacity(job.gpus_per_worker))
            if k > 0 and g >= min_gain:
                heapq.heappush(heap, (-job.priority, -g, job.id, k))

    def tidy_decisions(self) -> list[Decision]:
        """One decision per job: shrinks, then starts at their final size, then grows."""
        out: list[Decision] = []
        for vid, whom in self.shrunk_for.items():
            w, job = self.workers[vid], self.jobs[vid]
            if w >= self.initial[vid]:
                continue  # shrunk, then grown back
            names = ", ".join(dict.fromkeys(whom))
            if w == job.min_workers and vid in self.higher_prio:
                out.append(PreemptToMin(vid, reason=f"shrunk to its minimum for cluster {names}"))
            else:
                out.append(Shrink(vid, w, reason=f"shrunk for cluster {names}"))
        for jid, first in self.started.items():
            w, gpw = self.workers[jid], self.jobs[jid].gpus_per_worker
            extra = f", grown into {(w - first) * gpw} idle GPUs" if w > first else ""
            out.append(Start(jid, w, reason=f"started at its minimum {first} worker(s){extra}"))
        for jid, before in self.initial.items():
            w, gpw = self.workers[jid], self.jobs[jid].gpus_per_worker
            if w > before and jid not in self.shrunk_for:
                out.append(Grow(jid, w, reason=f"grown into {(w - before) * gpw} idle GPUs"))
            elif w > before:
                out.append(Grow(jid, w, reason=f"grown back into {(w - before) * gpw} idle GPUs"))
        return out


def _replays(state: ClusterState, jobs: dict[str, Job], decisions: list[Decision]) -> bool:
    """Whether ``decisions`` fit in this order (placement with multi-GPU workers is order-dependent)."""
    inv = state.inventory()
    try:
        for d in decisions:
            job = jobs[d.job_id]
            have, want = inv.workers(d.job_id), getattr(d, "workers", job.min_workers)
            if want > have:
                inv.add(d.job_id, job.gpus_per_worker, want - have)
            elif want < have:
                inv.remove(d.job_id, job.gpus_per_worker, have - want)
    except InvalidDecision:
        return False
    return True
