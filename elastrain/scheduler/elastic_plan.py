"""The elastic policy's scratch plan: admissions with shrinking, marginal-gain growth, tidy decisions.

:class:`Plan` works on a copy of the inventory (:class:`~elastrain.scheduler.inventory.Inventory`),
so every node count it feeds the throughput model is the one the placement will really have after
:func:`~elastrain.scheduler.api.apply` (same placement rule). It records each step in an order that
is valid by construction (``steps``) and can coalesce them to one decision per job.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from elastrain.scheduler.api import (
    ClusterState,
    Decision,
    DecisionKind,
    Grow,
    Job,
    PreemptToMin,
    Shrink,
    Start,
)
from elastrain.scheduler.inventory import InvalidDecision, Inventory

SpeedFn = Callable[[Job, int, int], float]
"""``speed(job, workers, nodes)``: throughput in any unit (only ratios are used)."""

_SMALL_STEPS = (1, 2, 3, 4, 5, 6, 7, 8)


def _steps(room: int) -> list[int]:
    """Growth sizes worth evaluating: 1..8, then powers of two up to ``room``."""
    out = [k for k in _SMALL_STEPS if k <= room]
    k = 16
    while k <= room:
        out.append(k)
        k *= 2
    if room > 8 and room not in out:
        out.append(room)
    return out


class Plan:
    """Scratch inventory plus the decisions taken so far (step by step, and coalesced)."""

    def __init__(self, inv: Inventory, running: dict[str, Job], speed: SpeedFn, rank: dict[str, int]) -> None:
        self.inv = inv
        self.jobs = dict(running)
        self.initial = {i: j.workers for i, j in running.items()}
        self.workers = dict(self.initial)
        self.rank = rank
        self.started: dict[str, int] = {}  # job id -> workers at admission
        self.shrunk_for: dict[str, list[str]] = {}  # victim -> the jobs it was shrunk for
        self.higher_prio: set[str] = set()  # victims shrunk for a higher-priority job
        self.steps: list[Decision] = []  # valid in this order by construction (after the preemptions)
        self.speed = speed
        self._speeds: dict[tuple[str, int, int], float] = {}

    def s(self, job: Job, w: int, nodes: int) -> float:
        """Cached ``speed(job, w, nodes)``."""
        key = (job.id, w, nodes)
        v = self._speeds.get(key)
        if v is None:
            v = self._speeds[key] = self.speed(job, w, nodes)
        return v

    def current(self, job: Job) -> float:
        """The job's speed at its planned size and placement."""
        return self.s(job, self.workers[job.id], len(self.inv.placements.get(job.id, ())))

    def drop(self, job_id: str) -> None:
        """A running job is preempted: release its GPUs and forget it."""
        job = self.jobs.pop(job_id)
        self.inv.remove_all(job_id, job.gpus_per_worker)
        del self.workers[job_id], self.initial[job_id]

    def admit(self, job: Job) -> bool:
        """Start ``job`` at its minimum, shrinking the extras of same-or-lower-priority jobs (worst
        ranked first) if needed; False (nothing changed) if it still does not fit."""
        need, gpw = job.min_workers, job.gpus_per_worker
        if self.inv.capacity(gpw) < need:
            victims = sorted(
                (
                    v
                    for v in self.jobs.values()
                    if v.priority <= job.priority and self.workers[v.id] > v.min_workers
                ),
                key=lambda v: (v.priority, -self.rank.get(v.id, 0)),
            )
            trial, workers = self.inv.copy(), dict(self.workers)
            taken: list[str] = []
            for victim in victims:
                while trial.capacity(gpw) < need and workers[victim.id] > victim.min_workers:
                    trial.remove(victim.id, victim.gpus_per_worker, 1)
                    workers[victim.id] -= 1
                    taken.append(victim.id)
                if trial.capacity(gpw) >= need:
                    break
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

    def best_step(self, job: Job) -> tuple[int, float]:
        """The growth of ``k`` workers that fits with the largest average relative gain per GPU, as
        ``(k, gain)``; node counts come from where :meth:`Inventory.add` would put them."""
        w, gpw = self.workers[job.id], job.gpus_per_worker
        room = min(self.inv.capacity(gpw), job.max_workers - w)
        now = self.current(job)
        best = (0, 0.0)
        if now <= 0 or room <= 0:
            return best
        for k in _steps(room):
            nodes = self.inv.nodes_after_add(job.id, gpw, k)
            g = (self.s(job, w + k, nodes) - now) / now / (k * gpw)
            if g > best[1] + 1e-12:
                best = (k, g)
        return best

    def grow(self, min_gain: float) -> None:
        """Hand free GPUs out by (priority, best average gain per GPU), one growth step at a time;
        a popped step is re-evaluated against the current inventory before it is taken."""
        if not any(self.inv.free.values()):
            return
        heap: list[tuple[int, float, int, str]] = []
        for job in self.jobs.values():
            self._push(heap, job, min_gain)
        while heap and any(self.inv.free.values()):
            _, neg_gain, _, jid = heapq.heappop(heap)
            job = self.jobs[jid]
            k, g = self.best_step(job)
            if k <= 0 or g < min_gain:
                continue
            if heap and g < -neg_gain - 1e-12 and (-job.priority, -g) > heap[0][:2]:
                heapq.heappush(heap, (-job.priority, -g, self.rank.get(jid, 0), jid))  # stale: retry later
                continue
            self.inv.add(jid, job.gpus_per_worker, k)
            w = self.workers[jid] = self.workers[jid] + k
            self.steps.append(Grow(jid, w, reason="grown into idle GPUs"))
            self._push(heap, job, min_gain)

    def _push(self, heap: list[tuple[int, float, int, str]], job: Job, min_gain: float) -> None:
        if self.workers[job.id] < job.max_workers:
            k, g = self.best_step(job)
            if k > 0 and g >= min_gain:
                heapq.heappush(heap, (-job.priority, -g, self.rank.get(job.id, 0), job.id))

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


def replays(state: ClusterState, jobs: dict[str, Job], decisions: list[Decision]) -> bool:
    """Whether ``decisions`` fit in this order (placement with multi-GPU workers is order-dependent)."""
    inv = state.inventory()
    gpw = {j.id: j.gpus_per_worker for j in state.running}
    gpw.update({i: j.gpus_per_worker for i, j in jobs.items()})
    try:
        for d in decisions:
            if d.kind is DecisionKind.PREEMPT:
                inv.remove_all(d.job_id, gpw[d.job_id])
                continue
            job = jobs[d.job_id]
            have, want = inv.workers(d.job_id), getattr(d, "workers", job.min_workers)
            if want > have:
                inv.add(d.job_id, job.gpus_per_worker, want - have)
            elif want < have:
                inv.remove(d.job_id, job.gpus_per_worker, have - want)
    except InvalidDecision:
        return False
    return True
