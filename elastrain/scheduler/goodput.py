"""Pollux's goodput model: system throughput times statistical efficiency, and the batch size that
maximises it for a given allocation.

Reference: Qiao et al., "Pollux: Co-adaptive Cluster Scheduling for Goodput-Optimized Deep
Learning", OSDI'21 (§3; petuum/adaptdl ``adaptdl/adaptdl/goodput.py``). With ``K`` GPUs over ``N``
nodes, per-GPU (atomic) batch ``m`` and ``s`` gradient-accumulation steps, the global batch is
``M = K * m * (s + 1)`` and::

    T_compute = alpha_c + beta_c * m
    T_sync    = alpha_n + beta_n * max(K - 2, 0)   if N > 1
              = alpha_r + beta_r * max(K - 2, 0)   if N == 1 and K > 1 (0 for K == 1)
    T_step    = (T_compute^gamma + T_sync^gamma)^(1/gamma)
    T_iter    = s * T_compute + T_step
    THROUGHPUT = M / T_iter                           (samples/s)
    EFFICIENCY = (var + sqr) / (var / (M/M0) + sqr) / (M/M0)   (= (phi + M0)/(phi + M), phi = M0 var/sqr)
    GOODPUT    = THROUGHPUT * EFFICIENCY             (samples/s at the reference batch M0)

``GOODPUT / M0`` is progress in reference steps per second. Everything here is plain Python
(no numpy), so the control plane can call it for jobs that report gradient statistics
(``grad_sqr``, ``grad_var``) and step-time parameters; :func:`perf_params_for` gives the parameters
fitted offline to the Pollux measurements (:mod:`elastrain.scheduler.fitted_params`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from elastrain.scheduler.api import Job

SpeedFn = Callable[["Job", int, int], float]

EPS = 1e-8
CANDIDATES = 50  # batch sizes tried (geometric), as Pollux's optimizer


@dataclass(frozen=True, slots=True)
class PerfParams:
    """Step-time parameters of the Pollux form (seconds; see the module docstring)."""

    alpha_c: float
    beta_c: float
    alpha_n: float
    beta_n: float
    alpha_r: float
    beta_r: float
    gamma: float


@dataclass(frozen=True, slots=True)
class GradParams:
    """Gradient statistics: squared norm of the mean gradient and its variance (any common unit)."""

    sqr: float
    var: float


@dataclass(frozen=True, slots=True)
class BatchConfig:
    """A per-GPU batch, accumulation steps and the goodput they give."""

    atomic_bsz: int
    accum_steps: int
    goodput: float

    def batch_size(self, replicas: int) -> int:
        """The global batch on ``replicas`` GPUs."""
        return replicas * self.atomic_bsz * (self.accum_steps + 1)


def perf_params_for(model: str) -> PerfParams:
    """The step-time parameters fitted offline for one of the 6 Pollux benchmark models."""
    from elastrain.errors import ConfigError
    from elastrain.scheduler.fitted_params import PARAMS

    try:
        p = PARAMS[model]
    except KeyError:
        raise ConfigError(
            f"no fitted step-time parameters for model {model!r}; known: {', '.join(PARAMS)}"
        ) from None
    return PerfParams(p["a_c"], p["b_c"], p["a_n"], p["b_n"], p["a_r"], p["b_r"], p["g"])


def gain(grad: GradParams, batch_size: float, init_batch_size: float) -> float:
    """Statistical gain of batch ``batch_size`` over ``init_batch_size``: reference steps one step
    is worth, ``(var + sqr) / (var / scale + sqr)`` (1 at the reference batch)."""
    scale = batch_size / init_batch_size
    denom = grad.var / scale + grad.sqr
    return (grad.var + grad.sqr) / denom if denom > 0 else 1.0


def iteration_time(perf: PerfParams, nodes: int, replicas: int, atomic_bsz: float, accum_steps: int) -> float:
    """Seconds per optimizer step (``T_iter``) under the fitted form."""
    t_compute = perf.alpha_c + perf.beta_c * atomic_bsz
    if replicas <= 1:
        t_step = t_compute
    else:
        a, b = (perf.alpha_n, perf.beta_n) if nodes > 1 else (perf.alpha_r, perf.beta_r)
        t_sync = a + b * max(replicas - 2, 0)
        g = perf.gamma
        t_step = (t_compute**g + t_sync**g) ** (1.0 / g)
    return accum_steps * t_compute + t_step


@dataclass(frozen=True, slots=True)
class GoodputModel:
    """Goodput of one job: its step-time parameters, its latest gradient statistics and its
    reference (initial) batch size ``M0``."""

    perf: PerfParams
    grad: GradParams
    init_batch_size: int

    def throughput(self, nodes: int, replicas: int, atomic_bsz: float, accum_steps: int) -> float:
        """Samples per second."""
        batch = replicas * atomic_bsz * (accum_steps + 1)
        return batch / iteration_time(self.perf, nodes, replicas, atomic_bsz, accum_steps)

    def efficiency(self, batch_size: float) -> float:
        """Statistical efficiency of ``batch_size`` relative to ``M0`` (1 at ``M0``, below above it)."""
        return gain(self.grad, batch_size, self.init_batch_size) * self.init_batch_size / batch_size

    def goodput(self, nodes: int, replicas: int, atomic_bsz: float, accum_steps: int) -> float:
        """``THROUGHPUT x EFFICIENCY``: samples/s at the reference batch."""
        batch = replicas * atomic_bsz * (accum_steps + 1)
        return self.throughput(nodes, replicas, atomic_bsz, accum_steps) * self.efficiency(batch)

    def optimize(
        self,
        nodes: int,
        replicas: int,
        max_batch_size: int,
        local_bsz_range: tuple[int, int],
        accumulation: bool = True,
    ) -> BatchConfig:
        """The per-GPU batch and accumulation steps with the highest goodput on ``replicas`` GPUs over
        ``nodes`` nodes: 50 global batches in geometric steps from ``max(M0, min_local x K)`` to
        ``max_batch_size``, each split into ``atomic <= max_local`` micro-batches (at least two on a
        single GPU above ``M0``, as Pollux: one micro-batch cannot estimate the gradient noise).
        Returns goodput 0.0 when no batch fits the limits."""
        lo_local, hi_local = local_bsz_range
        low = max(self.init_batch_size, lo_local * replicas)
        best = BatchConfig(0, 0, 0.0)
        if low > max_batch_size + EPS or replicas < 1:
            return best
        n = CANDIDATES if max_batch_size > low else 1
        ratio = (max_batch_size / low) ** (1.0 / (n - 1)) if n > 1 else 1.0
        for i in range(n):
            batch = low * ratio**i
            local = batch / replicas
            accum = 0
            if accumulation:
                accum = math.ceil(local / hi_local - EPS) - 1
                if replicas == 1 and local > self.init_batch_size + EPS:
                    accum = max(accum, 1)
            atomic = math.ceil(local / (accum + 1) - EPS)
            if not lo_local <= atomic <= hi_local:
                continue
            value = self.goodput(nodes, replicas, atomic, accum)
            if value > best.goodput:
                best = BatchConfig(atomic, accum, value)
        return best


def fixed_batch_config(
    batch_size: int, replicas: int, init_batch_size: int, max_local_bsz: int, max_batch_size: int
) -> tuple[int, int]:
    """``(atomic_bsz, accum_steps)`` for a fixed global batch on ``replicas`` GPUs, as the Pollux
    artifact splits a tuned job's batch: the per-GPU share in as few micro-batches of at most
    ``max_local_bsz`` as possible (two on one GPU above ``M0``), capped so the batch stays within
    ``max_batch_size``."""
    local = math.ceil(batch_size / replicas - EPS)
    accum = math.ceil(local / max_local_bsz - EPS) - 1
    if replicas == 1 and batch_size > init_batch_size:
        accum = max(1, accum)
    atomic = math.ceil(local / (accum + 1) - EPS)
    count = replicas * (accum + 1)
    return max(1, min(atomic, int(max_batch_size / count))), accum


@dataclass(frozen=True, slots=True)
class JobGoodput:
    """What the scheduler knows of one job's goodput: its model, its batch limits and, for a job
    that cannot change its batch, the fixed global batch (0: adaptive, the batch is chosen per
    allocation by :meth:`GoodputModel.optimize`)."""

    model: GoodputModel
    max_batch_size: int
    local_bsz_range: tuple[int, int]
    fixed_batch: int = 0

    def config(self, nodes: int, replicas: int) -> BatchConfig:
        """The batch configuration the job runs with on ``replicas`` GPUs over ``nodes`` nodes."""
        if self.fixed_batch:
            m0, hi = self.model.init_batch_size, self.local_bsz_range[1]
            atomic, accum = fixed_batch_config(self.fixed_batch, replicas, m0, hi, self.max_batch_size)
            return BatchConfig(atomic, accum, self.model.goodput(nodes, replicas, atomic, accum))
        return self.model.optimize(nodes, replicas, self.max_batch_size, self.local_bsz_range)


@dataclass(frozen=True, slots=True)
class ReportedEfficiency:
    """Statistical efficiency from what a running job reports (gradient statistics and its batch),
    for a job whose system throughput is measured rather than modelled: the job keeps its per-GPU
    batch ``local_batch``, so on ``gpus`` GPUs its global batch is ``gpus x local_batch``, worth
    :func:`gain` reference steps of batch ``init_batch_size`` (``M0``)."""

    grad: GradParams
    local_batch: float
    init_batch_size: float

    def efficiency(self, gpus: int) -> float:
        """Reference samples per processed sample on ``gpus`` GPUs (1 at ``M0``, less above it)."""
        batch = max(gpus, 1) * self.local_batch
        return gain(self.grad, batch, self.init_batch_size) * self.init_batch_size / batch


class GoodputSpeed:
    """A policy speed function ``speed(job, workers, nodes)`` by goodput (samples/s at the reference
    batch, with the best batch for that allocation) for the jobs registered with :meth:`set`;
    other jobs use ``fallback`` (default: the step-time model,
    :func:`elastrain.scheduler.throughput.job_speed`). Plug it into ``ElasticPolicy(speed=...)``;
    call :meth:`set` again whenever a job reports new gradient statistics.

    ``restart_penalty_s`` > 0 applies Pollux's restart penalty: a running job's goodput at any other
    allocation than its current one is scaled by ``max(age - restarts x delay, 0) / (age + delay)``
    (``age``: seconds since its arrival at :attr:`now_s`, which the caller keeps current, like
    :meth:`restarted`), so young jobs are not resized for small gains."""

    def __init__(self, fallback: SpeedFn | None = None, restart_penalty_s: float = 0.0) -> None:
        self.jobs: dict[str, JobGoodput] = {}
        self.fallback = fallback
        self.restart_penalty_s = restart_penalty_s
        self.now_s = 0.0
        self.restarts: dict[str, int] = {}
        self.reported: dict[str, ReportedEfficiency] = {}
        self._cache: dict[str, dict[tuple[int, int], BatchConfig]] = {}

    def set_reported(self, job_id: str, info: ReportedEfficiency | None) -> None:
        """Scale an unregistered job's (measured or modelled) throughput by the statistical efficiency
        its reports give, which makes it a goodput; None forgets it."""
        if info is None:
            self.reported.pop(job_id, None)
        else:
            self.reported[job_id] = info

    def restarted(self, job_id: str) -> None:
        """Count one more restart (resize or resume) of a job, for the restart penalty."""
        self.restarts[job_id] = self.restarts.get(job_id, 0) + 1

    def set(self, job_id: str, info: JobGoodput) -> None:
        """Register or update a job's goodput knowledge."""
        if self.jobs.get(job_id) != info:
            self.jobs[job_id] = info
            self._cache[job_id] = {}

    def forget(self, job_id: str) -> None:
        """Drop a finished job."""
        self.jobs.pop(job_id, None)
        self.reported.pop(job_id, None)
        self._cache.pop(job_id, None)
        self.restarts.pop(job_id, None)

    def config(self, job_id: str, replicas: int, nodes: int) -> BatchConfig:
        """The (cached) batch configuration of a registered job on ``replicas`` GPUs over ``nodes``."""
        cache = self._cache[job_id]
        key = (replicas, max(1, min(nodes, replicas)))
        hit = cache.get(key)
        if hit is None:
            hit = cache[key] = self.jobs[job_id].config(key[1], replicas)
        return hit

    def __call__(self, job: Job, workers: int, nodes: int) -> float:
        if workers <= 0:
            return 0.0
        if job.id not in self.jobs:
            if self.fallback is None:
                from elastrain.scheduler.throughput import job_speed

                self.fallback = job_speed
            value = self.fallback(job, workers, nodes)
            reported = self.reported.get(job.id)
            return value * reported.efficiency(workers * job.gpus_per_worker) if reported else value
        value = self.config(job.id, workers * job.gpus_per_worker, nodes).goodput
        delay = self.restart_penalty_s
        if delay > 0 and job.placement and (workers, nodes) != (job.workers, job.nodes):
            age = max(0.0, self.now_s - job.arrival_s)
            value *= max(age - self.restarts.get(job.id, 0) * delay, 0.0) / (age + delay)
        return value


def fit_perf_params(samples: Sequence[tuple[float, float, float, float, float]]) -> PerfParams:
    """Fit :class:`PerfParams` to a job's profile, as Pollux does (``fit_perf_params`` in adaptdl's
    ``goodput.py``; needs numpy and scipy). ``samples`` are ``(nodes, replicas, atomic_bsz,
    compute_time_s, step_time_s)`` (compute = step - sync); the objective is the RMS log error of
    the predicted compute time plus that of the predicted step time, with Pollux's small penalties
    towards a small ``gamma`` and small retrogression terms. Parameters the profile cannot
    determine (no multi-node, no multi-GPU single-node, nothing above 2 GPUs) are pinned as Pollux
    pins them."""
    import numpy as np
    from scipy.optimize import minimize

    data = np.asarray(samples, dtype=float)
    nodes, reps, bsz, t_comp, t_step = (data[:, i] for i in range(5))
    log_comp, log_step = np.log(t_comp), np.log(t_step)
    x0 = [1e-1, 1e-2] * 3 + [1.0 + 1e-3]
    lower = [1e-8, 1e-8] * 3 + [1.0]
    upper = [math.inf, math.inf] * 3 + [10.0]

    def pin(value: float, *indices: int) -> None:
        for i in indices:
            x0[i] = lower[i] = upper[i] = value

    if len(np.unique(bsz)) == 1:
        pin(float(np.mean(t_comp)) / 2, 0)
    if not np.any(nodes > 1):
        pin(1e-8, 2, 3)
    if not np.any((nodes == 1) & (reps > 1)):
        pin(1e-8, 4, 5)
    if not np.any(reps > 2):
        pin(1e-8, 3, 5)

    def objective(x: np.ndarray) -> float:
        a_c, b_c, a_n, b_n, a_r, b_r, g = x
        comp = a_c + b_c * bsz
        net = np.where(
            nodes > 1, a_n + b_n * np.maximum(reps - 2, 1e-8), a_r + b_r * np.maximum(reps - 2, 1e-8)
        )
        net = np.where(reps > 1, net, 1e-8)
        log_pred = np.log(comp**g + net**g) / g
        err = np.sqrt(np.mean((np.log(comp) - log_comp) ** 2)) + np.sqrt(np.mean((log_pred - log_step) ** 2))
        return float(err + 1e-3 * (g - 1) ** 2 + 1e-2 * ((b_n / a_n) ** 2 + (b_r / a_r) ** 2))

    x = minimize(objective, x0, method="L-BFGS-B", bounds=list(zip(lower, upper))).x
    params = [float(v) for v in x]
    if not np.any(nodes > 1):  # Pollux's prior: inter-node at least as slow as intra-node
        params[2], params[3] = max(params[2], params[4] * 1.1), max(params[3], params[5] * 1.1)
    return PerfParams(*params)
