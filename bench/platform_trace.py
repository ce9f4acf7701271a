"""The pure parts of `make bench-platform`: which trace jobs it replays, how time is compressed, what
each job's work is, the simulator's figures for the same slice, and the ratios.

**Slice**: the first ``count`` jobs submitted at or after ``start_s`` (trace seconds) that fit the
platform (``num_gpus <= gpus``) and ran between ``min_duration_s`` and ``max_duration_s`` (the
Pollux/Sia samplers' floor of 60 s, and a cap so one multi-day job does not make the bench last
hours). **Time**: one factor for arrivals and run times alike (the slice's load and order are the
trace's), chosen so that the static policy's simulated makespan is ``target_makespan_s``.

**Work** (what a job's training script does, :mod:`bench.platform_job`): the job is the simulator's
(`elastrain.scheduler.simulator`): it gets the fitted throughput model the simulator gives its
``job_id`` and a fixed per-GPU batch ``m_ref``; a step on ``W`` ranks processes ``W x m_ref`` samples
and lasts ``T_step(W, m_ref)`` of that model times ``step_scale``; the job trains ``samples`` samples,
which at its trace size ``num_gpus`` take its scaled run time. So its length depends on how many
workers it gets exactly as the simulator's progress rate does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from elastrain.errors import ConfigError
from elastrain.scheduler.fitted_params import PARAMS
from elastrain.scheduler.registry import make_policy
from elastrain.scheduler.simulator import SimConfig, SimResult, model_for, simulate, to_job
from elastrain.scheduler.throughput import step_time
from elastrain.scheduler.trace import TraceJob

MIN_CLUSTER = 2  # containers (a launcher and a worker): the platform's smallest cluster
STEP_S = 0.5  # a step's length at the job's trace size (bench seconds)


@dataclass(frozen=True)
class Work:
    """One job's training work: its throughput model, per-rank batch, samples and step-time scale."""

    model: str
    local_batch: int
    samples: int
    step_scale: float

    def step_s(self, world: int) -> float:
        """Seconds one step lasts on ``world`` ranks."""
        p = PARAMS[self.model]
        return step_time(p, world, p["m_ref"], 1) * self.step_scale

    def seconds_at(self, world: int) -> float:
        """How long the whole job takes on ``world`` ranks (whole steps)."""
        return math.ceil(self.samples / (world * self.local_batch)) * self.step_s(world)

    def args(self) -> list[str]:
        """The training script's command-line arguments."""
        return [
            "--model", self.model, "--local-batch", str(self.local_batch),
            "--samples", str(self.samples), "--step-scale", f"{self.step_scale:.6g}",
        ]  # fmt: skip


def select_slice(
    jobs: Sequence[TraceJob],
    count: int,
    gpus: int,
    start_s: float = 0.0,
    min_duration_s: float = 60.0,
    max_duration_s: float = 6 * 3600.0,
) -> list[TraceJob]:
    """The slice (module docstring), in submit order; `ConfigError` if fewer than ``count`` qualify."""
    fits = [
        j
        for j in sorted(jobs, key=lambda j: (j.submit_s, j.line))
        if j.submit_s >= start_s and j.num_gpus <= gpus and min_duration_s <= j.duration_s <= max_duration_s
    ]
    if len(fits) < count:
        raise ConfigError(
            f"only {len(fits)} trace jobs at or after {start_s:g} s fit (<= {gpus} GPUs, "
            f"{min_duration_s:g}-{max_duration_s:g} s); ask for fewer (--jobs) or an earlier --start"
        )
    return fits[:count]


def with_floor(jobs: Sequence[TraceJob], floor: int = MIN_CLUSTER) -> list[TraceJob]:
    """The jobs as the platform can run them: at least ``floor`` GPUs asked and as minimum (a cluster
    is a launcher and at least one worker, one GPU each); run times stay."""
    return [replace(j, num_gpus=max(j.num_gpus, floor), min_gpus=max(j.min_gpus, floor)) for j in jobs]


def compress(jobs: Sequence[TraceJob], factor: float) -> list[TraceJob]:
    """The jobs with submit times (from the first) and run times multiplied by ``factor``."""
    if not math.isfinite(factor) or factor <= 0:
        raise ConfigError(f"the time factor must be a number > 0, not {factor}")
    if not jobs:
        return []
    first = min(j.submit_s for j in jobs)
    return [
        replace(j, submit_s=(j.submit_s - first) * factor, duration_s=j.duration_s * factor) for j in jobs
    ]


def sim_config(gpus: int, restart_cost_s: float, interval_s: float = 1.0) -> SimConfig:
    """The simulator's view of the platform: one node of ``gpus`` (virtual) GPUs."""
    return SimConfig(gpus=gpus, gpus_per_node=gpus, interval_s=interval_s, restart_cost_s=restart_cost_s)


def run_sim(jobs: Sequence[TraceJob], policy: str, config: SimConfig) -> SimResult:
    """One simulation of ``jobs`` under ``policy`` (a fresh policy object)."""
    return simulate(list(jobs), make_policy(policy), config)


def time_factor(jobs: Sequence[TraceJob], target_makespan_s: float, config: SimConfig) -> float:
    """The factor that makes the static policy's simulated makespan of the slice ``target_makespan_s``
    (static never resizes, so its makespan is proportional to the factor)."""
    res = run_sim(jobs, "static-backfill", replace(config, restart_cost_s=0.0))
    span = res.last_finish_s - res.first_submit_s
    if span <= 0:
        raise ConfigError("the slice has no run time to scale")
    return target_makespan_s / span


def work_for(job: TraceJob, gpus: int, step_s: float = STEP_S) -> Work:
    """The work of one (compressed) trace job (module docstring): a step at its trace size lasts
    ``step_s``, and it trains for its run time at that size."""
    model = model_for(job.job_id)
    p = PARAMS[model]
    n = job.num_gpus
    batch = max(1, round(p["m_ref"]))
    scale = step_s / step_time(p, n, p["m_ref"], 1)
    steps = max(1, round(job.duration_s / step_s))
    return Work(model, batch, steps * n * batch, scale)


def bounds(job: TraceJob, gpus: int) -> tuple[int, int]:
    """A job's worker range as the simulator gives it (``to_job``): the platform's --min-np/--max-np."""
    sim = to_job(job, gpus, gpus_per_node=gpus)
    return sim.min_workers, sim.max_workers


def idle_while_waiting(series: Sequence[tuple[float, int, int]], gpus: int, end_s: float) -> float:
    """GPU-seconds no job held while at least one job waited, from ``(t, GPUs held, jobs waiting)``
    samples in time order (each holds until the next sample, the last until ``end_s``)."""
    total = 0.0
    for (t, held, waiting), nxt in zip(series, [*(s[0] for s in series[1:]), end_s]):
        if waiting > 0 and nxt > t:
            total += max(gpus - held, 0) * (nxt - t)
    return total


def sim_series(res: SimResult) -> list[tuple[float, int, int]]:
    """A simulation's ``(t, GPUs held, jobs queued)`` samples (its GPUs are workers of one GPU)."""
    return list(zip(res.series_t, res.series_gpus, res.series_queue))


def ratio(new: float, base: float) -> float:
    """``new / base``; 0 when both are 0 (nothing to compare: no worse), inf when only ``base`` is."""
    if base > 0:
        return new / base
    return 0.0 if new <= 0 else math.inf


def mean(values: Sequence[float]) -> float:
    """The mean (0.0 for none)."""
    return sum(values) / len(values) if values else 0.0
