"""Trace-driven simulation of a policy with a virtual clock (event-driven, nothing sleeps).

The simulator replays a trace through the *same* ``Policy.decide`` and :func:`apply` the control
plane uses (control loop: the policy returns decisions, the simulator carries them out). Events:
arrivals, completions, and wakeups a policy asks for (rounded up to the ``interval_s`` grid, e.g. a
job crossing a service threshold); the policy runs once per event time, after the completions and
arrivals at that time.

**Work and speed.** A trace job ran for ``duration_s`` seconds on ``num_gpus`` GPUs packed on the
fewest nodes of ``gpus_per_node``; that is its work. Each job gets one of the 6 fitted throughput
models (bert, cifar10, deepspeech2, imagenet, ncf, yolov3), by a stable hash (CRC-32) of its
``job_id``. With ``w`` workers over ``k`` nodes *of its actual placement* it advances at
``speed(job, w, k) / speed(job, num_gpus, ceil(num_gpus / gpus_per_node))`` seconds of work per
second; ``speed`` (default :func:`~elastrain.scheduler.throughput.job_speed`) is the same function
the elastic policy plans with. A static gang packed on the fewest nodes runs exactly
``duration_s``; one spread over more nodes runs slower, as it would.

**Bounds** (:func:`to_job`): the trace's ``min_gpus``/``max_gpus`` when given; otherwise
``min = 1`` (a data-parallel job can run on one GPU, with gradient accumulation if its batch needs
it) and ``max = max(num_gpus, max_gpus_default)`` where ``max_gpus_default`` defaults to one node
(``gpus_per_node``): a job may grow to fill a node, or keep the size it asked for if larger.
Non-elastic policies use ``num_gpus``. **Restarts**: every resize, and every resume after a
preemption, costs ``restart_cost_s`` (default 30 s, the Pollux artifact's rescale delay) without
progress while the GPUs stay allocated; the first start is free (the trace's run time includes it).
A job needing more GPUs than the cluster has is refused.
"""

from __future__ import annotations

import math
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from elastrain.errors import ConfigError, ElastrainError
from elastrain.scheduler.api import ClusterState, DecisionKind, Finish, Job, Policy, apply
from elastrain.scheduler.throughput import job_speed, model_names
from elastrain.scheduler.trace import TraceJob

ProgressFn = Callable[[int, int], None]
SpeedFn = Callable[[Job, int, int], float]


class SimulationError(ElastrainError):
    """The simulation cannot go on (e.g. a policy leaves jobs queued on an idle cluster forever)."""


@dataclass(frozen=True)
class SimConfig:
    """Cluster and simulation knobs (see the module docstring)."""

    gpus: int
    gpus_per_node: int = 8
    interval_s: float = 60.0
    restart_cost_s: float = 30.0
    max_gpus_default: int = 0  # 0: one node (gpus_per_node)


@dataclass
class SimResult:
    """What one policy did on one trace (per-job lists are in completion order)."""

    policy: str
    gpus: int
    jct_s: list[float] = field(default_factory=list)
    queue_s: list[float] = field(default_factory=list)  # submit -> first start
    wait_s: list[float] = field(default_factory=list)  # all time not holding GPUs after submission
    duration_s: list[float] = field(default_factory=list)  # trace run time (for slowdown)
    first_submit_s: float = 0.0
    last_finish_s: float = 0.0
    gpu_seconds: float = 0.0  # allocated
    work_gpu_seconds: float = 0.0  # the trace's GPU time (duration x num_gpus) of finished jobs
    stall_gpu_seconds: float = 0.0  # allocated but restarting
    resizes: int = 0
    preemptions: int = 0
    decide_calls: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0  # process CPU time of the run (unlike wall_s, not inflated by a busy machine)
    series_t: list[float] = field(default_factory=list)
    series_gpus: list[int] = field(default_factory=list)
    series_queue: list[int] = field(default_factory=list)


def model_for(job_id: str) -> str:
    """The throughput model of a trace job: round-robin over the fitted models by CRC-32 of its id."""
    names = model_names()
    return names[zlib.crc32(job_id.encode()) % len(names)]


def to_job(tj: TraceJob, cluster_gpus: int, gpus_per_node: int = 8, max_gpus_default: int = 0) -> Job:
    """The scheduler's view of a trace job (see the module docstring for the bounds)."""
    n = tj.num_gpus
    low = tj.min_gpus or 1
    high = tj.max_gpus or max(n, max_gpus_default or gpus_per_node)
    return Job(
        id=tj.job_id,
        min_workers=min(low, n),
        max_workers=max(n, min(high, cluster_gpus)),
        requested_workers=n,
        arrival_s=tj.submit_s,
        model=model_for(tj.job_id),
    )


class _Run:
    """Mutable per-job bookkeeping (the policy never sees it)."""

    __slots__ = (
        "base",
        "held_s",
        "job",
        "rate",
        "remaining",
        "stall_until",
        "start",
        "submit",
        "tj",
        "workers",
    )

    def __init__(self, tj: TraceJob, job: Job, base: float) -> None:
        self.tj, self.job, self.submit, self.base = tj, job, tj.submit_s, base
        self.remaining = tj.duration_s
        self.workers = 0
        self.rate = 0.0
        self.held_s = 0.0
        self.stall_until = -math.inf
        self.start: float | None = None

    def eta(self, now: float) -> float:
        return max(now, self.stall_until) + self.remaining / self.rate if self.rate > 0 else math.inf

    def advance(self, t0: float, t1: float) -> float:
        """Progress from ``t0`` to ``t1``; returns the seconds spent stalled (restarting)."""
        self.held_s += t1 - t0
        busy = t1 - max(t0, self.stall_until)
        if busy > 0:
            self.remaining = max(0.0, self.remaining - busy * self.rate)
        return (t1 - t0) - max(busy, 0.0)


def simulate(
    trace: Sequence[TraceJob],
    policy: Policy,
    config: SimConfig,
    progress: ProgressFn | None = None,
    speed: SpeedFn = job_speed,
) -> SimResult:
    """Replay ``trace`` (sorted by submit time) through ``policy`` on a cluster of ``config.gpus``."""
    wall0, cpu0 = time.perf_counter(), time.process_time()
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
    gpn = config.gpus_per_node
    state = ClusterState.empty(config.gpus, gpn)
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
        for r in active.values():
            res.gpu_seconds += r.workers * (t_next - now)
            res.stall_gpu_seconds += r.workers * r.advance(now, t_next)
        now = t_next
        state = state.with_time(now)
        ended = [jid for jid, r in active.items() if r.remaining <= 1e-9 or r.eta(now) <= now + 1e-9]
        if ended:
            state = apply(state, [Finish(jid, reason="completed") for jid in ended])
            for jid in ended:
                run = active.pop(jid)
                jct = now - run.submit
                res.jct_s.append(jct)
                res.queue_s.append((run.start if run.start is not None else now) - run.submit)
                res.wait_s.append(max(0.0, jct - run.held_s))
                res.duration_s.append(run.tj.duration_s)
                res.work_gpu_seconds += run.tj.duration_s * run.tj.num_gpus
            done += len(ended)
            res.last_finish_s = now
        arrivals = []
        while i < total and jobs[i].submit_s <= now:
            tj = jobs[i]
            job = to_job(tj, config.gpus, gpn, config.max_gpus_default)
            base = speed(job, tj.num_gpus, -(-tj.num_gpus // gpn))
            runs[tj.job_id] = _Run(tj, job, base)
            arrivals.append(job)
            i += 1
        if arrivals:
            state = state.with_arrivals(arrivals)
        decisions = policy.decide(state)
        res.decide_calls += 1
        if decisions:
            state = apply(state, decisions)
            placed = {j.id: j for j in state.running}
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
                elif d.kind is not DecisionKind.WAIT:
                    res.resizes += 1
                    run.stall_until = now + config.restart_cost_s
                now_job = placed.get(d.job_id)
                run.workers = now_job.workers if now_job is not None else 0
                run.rate = speed(now_job, now_job.workers, now_job.nodes) / run.base if now_job else 0.0
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
    res.cpu_s = time.process_time() - cpu0
    return res
