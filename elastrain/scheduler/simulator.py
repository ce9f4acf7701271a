"""Trace-driven simulation of a policy with a virtual clock (event-driven, nothing sleeps).

The simulator replays a trace through the *same* ``Policy.decide`` and :func:`apply` the control
plane uses. Events: arrivals, completions, and wakeups a policy asks for (rounded up to the
``interval_s`` grid, e.g. Tiresias's next service-threshold crossing); the policy runs once per
event time, after the completions and arrivals at that time.

**Work conversion.** A trace job ran for ``duration_s`` seconds on ``num_gpus`` GPUs; that is its
work, measured in seconds at ``num_gpus`` GPUs. Each job gets one of the 6 fitted throughput models
(bert, cifar10, deepspeech2, imagenet, ncf, yolov3), chosen by a stable hash (CRC-32) of its
``job_id``; with ``w`` GPUs it advances at ``speedup(model, w) / speedup(model, num_gpus)`` seconds
of work per second (1.0 at its trace size), so under ``static`` every job runs exactly
``duration_s``. Elastic bounds: ``min = max(1, num_gpus // 2)``, ``max = min(2 * num_gpus, cluster
GPUs)``, one GPU per worker; non-elastic policies use ``num_gpus``. Every resize or resume after a
preemption costs ``restart_cost_s`` seconds without progress (the job commits and re-forms its
group; the GPUs stay allocated). A job needing more GPUs than the cluster has is refused.
"""

from __future__ import annotations

import math
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache

from elastrain.errors import ConfigError, ElastrainError
from elastrain.scheduler.api import ClusterState, DecisionKind, Finish, Job, Policy, apply
from elastrain.scheduler.throughput import model_names, speedup
from elastrain.scheduler.trace import TraceJob

ProgressFn = Callable[[int, int], None]


class SimulationError(ElastrainError):
    """The simulation cannot go on (e.g. a policy leaves jobs queued on an idle cluster forever)."""


@dataclass(frozen=True)
class SimConfig:
    """Cluster and simulation knobs."""

    gpus: int
    gpus_per_node: int = 8
    interval_s: float = 60.0
    restart_cost_s: float = 10.0


@dataclass
class SimResult:
    """What one policy did on one trace."""

    policy: str
    gpus: int
    jct_s: list[float] = field(default_factory=list)
    queue_s: list[float] = field(default_factory=list)
    first_submit_s: float = 0.0
    last_finish_s: float = 0.0
    gpu_seconds: float = 0.0
    resizes: int = 0
    preemptions: int = 0
    decide_calls: int = 0
    wall_s: float = 0.0
    series_t: list[float] = field(default_factory=list)
    series_gpus: list[int] = field(default_factory=list)
    series_queue: list[int] = field(default_factory=list)


def model_for(job_id: str) -> str:
    """The throughput model of a trace job: round-robin over the fitted models by CRC-32 of its id."""
    names = model_names()
    return names[zlib.crc32(job_id.encode()) % len(names)]


def to_job(tj: TraceJob, cluster_gpus: int) -> Job:
    """The scheduler's view of a trace job (see the module docstring for the bounds)."""
    n = tj.num_gpus
    return Job(
        id=tj.job_id,
        min_workers=max(1, n // 2),
        max_workers=max(n, min(2 * n, cluster_gpus)),
        requested_workers=n,
        arrival_s=tj.submit_s,
        model=model_for(tj.job_id),
    )


@cache
def _rate(model: str, trace_gpus: int, gpus: int) -> float:
    """Seconds of work per second on ``gpus`` GPUs for a job whose trace size is ``trace_gpus``."""
    return speedup(model, gpus) / speedup(model, trace_gpus) if gpus > 0 else 0.0


class _Run:
    """Mutable per-job bookkeeping (the policy never sees it)."""

    __slots__ = ("model", "n", "remaining", "stall_until", "start", "submit", "workers")

    def __init__(self, tj: TraceJob, model: str) -> None:
        self.n, self.model, self.submit = tj.num_gpus, model, tj.submit_s
        self.remaining = tj.duration_s
        self.workers = 0
        self.stall_until = -math.inf
        self.start: float | None = None

    def eta(self, now: float) -> float:
        rate = _rate(self.model, self.n, self.workers)
        return max(now, self.stall_until) + self.remaining / rate if rate > 0 else math.inf

    def advance(self, t0: float, t1: float) -> None:
        busy = t1 - max(t0, self.stall_until)
        if busy > 0:
            self.remaining = max(0.0, self.remaining - busy * _rate(self.model, self.n, self.workers))


def simulate(
    trace: Sequence[TraceJob], policy: Policy, config: SimConfig, progress: ProgressFn | None = None
) -> SimResult:
    """Replay ``trace`` (sorted by submit time) through ``policy`` on a cluster of ``config.gpus``."""
    wall0 = time.perf_counter()
    for tj in trace:
        if tj.num_gpus > config.gpus:
            raise ConfigError(
                f"job {tj.job_id} (trace line {tj.line}) needs {tj.num_gpus} GPUs; "
                f"the cluster has {config.gpus}"
            )
    jobs = sorted(trace, key=lambda j: j.submit_s)
    res = SimResult(policy=policy.name, gpus=config.gpus)
    if not jobs:
        return res
    state = ClusterState.empty(config.gpus, config.gpus_per_node)
    runs: dict[str, _Run] = {}
    active: dict[str, _Run] = {}
    total, i, done = len(jobs), 0, 0
    now = res.first_submit_s = jobs[0].submit_s
    wake: float | None = None
    while i < total or active or state.queued:
        t_next = min(
            jobs[i].submit_s if i < total else math.inf,
            min((r.eta(now) for r in active.values()), default=math.inf),
            wake if wake is not None else math.inf,
        )
        if t_next == math.inf:
            raise SimulationError(
                f"policy {policy.name} left {len(state.queued)} job(s) queued with nothing running "
                f"(first: {state.queued[0].id})"
            )
        in_use = sum(r.workers for r in active.values())
        res.gpu_seconds += in_use * (t_next - now)
        for r in active.values():
            r.advance(now, t_next)
        now = t_next
        state = state.with_time(now)
        ended = [jid for jid, r in active.items() if r.remaining <= 1e-9 or r.eta(now) <= now + 1e-9]
        if ended:
            state = apply(state, [Finish(jid, reason="completed") for jid in ended])
            for jid in ended:
                run = active.pop(jid)
                res.jct_s.append(now - run.submit)
                res.queue_s.append((run.start if run.start is not None else now) - run.submit)
            done += len(ended)
            res.last_finish_s = now
        arrivals = []
        while i < total and jobs[i].submit_s <= now:
            tj = jobs[i]
            job = to_job(tj, config.gpus)
            runs[tj.job_id] = _Run(tj, job.model)
            arrivals.append(job)
            i += 1
        if arrivals:
            state = state.with_arrivals(arrivals)
        decisions = policy.decide(state)
        res.decide_calls += 1
        if decisions:
            state = apply(state, decisions)
            sizes = {j.id: j.workers for j in state.running}
            for d in decisions:
                run = runs[d.job_id]
                if d.kind is DecisionKind.START:
                    if run.start is None:
                        run.start = now
                    else:
                        run.stall_until = now + config.restart_cost_s
                    active[d.job_id] = run
                elif d.kind is DecisionKind.PREEMPT:
                    res.preemptions += 1
                    active.pop(d.job_id, None)
                    run.workers = 0
                elif d.kind is not DecisionKind.WAIT:
                    res.resizes += 1
                    run.stall_until = now + config.restart_cost_s
                if d.job_id in sizes:
                    run.workers = sizes[d.job_id]
        wake = policy.next_wakeup_s(state)
        if wake is not None:  # on the rescheduling grid, strictly in the future
            grid = config.interval_s
            wake = max(math.ceil(wake / grid), math.floor(now / grid) + 1) * grid
        used = sum(r.workers for r in active.values())
        if not res.series_t or res.series_gpus[-1] != used or res.series_queue[-1] != len(state.queued):
            res.series_t.append(now)
            res.series_gpus.append(used)
            res.series_queue.append(len(state.queued))
        if progress is not None:
            progress(done, total)
    res.wall_s = time.perf_counter() - wall0
    return res
