"""What the elastic scheduler asks of one cluster row: its bounds while its jobs run, its service so
far, and its goodput from what its jobs report.

**Bounds** (containers, the launcher included; it runs ranks too). A cluster's *own* bounds are
``min_containers..max_containers`` from its create request; unset, they are ``2`` (a launcher and a
worker) up to the size it was created or last scaled at (``requested_containers``). Within them:

* a running job started with a range (``elastrain run --min-np A --max-np B``, ``horovodrun
  --min-np/--max-np``) sets the cluster's effective bounds to ``ceil(A / slots)..ceil(B / slots)``
  containers (``slots``: ranks per container, its GPUs), clamped into the own bounds: the cluster
  grows into idle GPUs up to what the job can use and shrinks to its minimum for better-ranked ones;
* a fixed-size job (``-np N``) fixes the cluster at ``ceil(N / slots)`` (clamped), and a job whose
  command names no rank count keeps the cluster at its current size;
* with no running job the cluster never grows (idle GPUs go to clusters that train), may be shrunk
  down to its own minimum for others, and is released after ``idle_release_after``
  (:mod:`elastrain.server.idle_release`).

**Goodput**: measured samples/s per container count (``samples_per_s`` reports, or ``batch_size /
step_time_s`` scalars), scaled by the statistical efficiency of the job's gradient statistics when
it reports ``grad_sqr``, ``grad_var`` and ``batch_size`` (and ``init_batch_size``, else the batch of
one replica) — :class:`elastrain.scheduler.goodput.ReportedEfficiency`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from elastrain.db.models import Cluster
from elastrain.scheduler.goodput import GradParams, ReportedEfficiency
from elastrain.server.job_range import RankRange, rank_range

MIN_CONTAINERS = 2  # a launcher and one worker


@dataclass(frozen=True)
class Report:
    """One progress report of a job in the cluster (newest first in a list)."""

    world_size: int | None
    samples_per_s: float | None
    scalars: dict[str, float]

    @classmethod
    def of(cls, world: int | None, rate: float | None, scalars: str | None) -> Report:
        """A report from its stored columns (``scalars``: JSON text, read only when it can hold what
        the scheduler uses: a pass reads hundreds of reports)."""
        wanted = scalars and ("grad_" in scalars or ("step_time_s" in scalars and not rate))
        try:
            values = json.loads(scalars) if wanted and scalars else {}
        except ValueError:
            values = {}
        numbers = {k: float(v) for k, v in values.items() if isinstance(v, int | float)}
        return cls(world, rate, numbers)

    def rate(self) -> float | None:
        """Samples/s as reported, else ``batch_size / step_time_s``."""
        if self.samples_per_s and self.samples_per_s > 0:
            return self.samples_per_s
        batch, step = self.scalars.get("batch_size", 0.0), self.scalars.get("step_time_s", 0.0)
        return batch / step if batch > 0 and step > 0 else None


@dataclass(frozen=True)
class ClusterDemand:
    """What the scheduler needs to know about one cluster (sizes count containers, launcher included).

    ``parked``: the cluster is queued but its launcher is up (its workers were released), so it
    holds ``gpus_per_container`` GPUs already and waits for its workers only."""

    name: str
    desired: int
    min_containers: int
    max_containers: int
    gpus_per_container: int
    priority: int = 0
    arrival_s: float = 0.0
    admitted: bool = True
    throughput: tuple[tuple[int, float], ...] = ()  # (containers, samples/s)
    attained_gpu_s: float = 0.0
    service_since_s: float | None = None  # None: from now
    parked: bool = False
    efficiency: ReportedEfficiency | None = None


def own_bounds(cluster: Cluster) -> tuple[int, int]:
    """The cluster's own bounds (module docstring)."""
    requested = cluster.requested_containers or cluster.desired_containers
    low = cluster.min_containers or min(MIN_CONTAINERS, requested)
    high = max(cluster.max_containers or requested, low)
    return low, high


def effective_bounds(cluster: Cluster, commands: Iterable[Sequence[str]]) -> tuple[int, int]:
    """The bounds while the given job commands run (module docstring); no command: idle."""
    low, high = own_bounds(cluster)
    now = cluster.desired_containers if cluster.admitted else (cluster.requested_containers or low)
    current = min(max(now, low), high)
    ranges: list[tuple[int, int]] = []
    for argv in commands:
        ranks: RankRange | None = rank_range(argv)
        if ranks is None:
            ranges.append((current, current))
        else:
            lo, hi = ranks.containers(cluster.gpus_per_container)
            ranges.append((min(max(lo, low), high), min(max(hi, low), high)))
    if not ranges:
        return low, current
    lo = max(r[0] for r in ranges)
    return lo, max(lo, *(r[1] for r in ranges))


def measured_throughput(
    reports: Iterable[tuple[int | None, float | None]], gpus_per_container: int
) -> tuple[tuple[int, float], ...]:
    """``(world_size, samples/s)`` reports -> mean samples/s per container count (launcher included:
    a world of W ranks on containers of G slots needs ceil(W / G) workers plus the launcher)."""
    sums: dict[int, list[float]] = {}
    slots = max(gpus_per_container, 1)
    for world, rate in reports:
        if world and rate and world > 0 and rate > 0:
            sums.setdefault(math.ceil(world / slots) + 1, []).append(rate)
    return tuple(sorted((c, sum(v) / len(v)) for c, v in sums.items()))


def reported_efficiency(reports: Sequence[Report]) -> ReportedEfficiency | None:
    """The newest report's gradient statistics as an efficiency model, if it has them."""
    for r in reports:
        sqr, var, batch = (r.scalars.get(k, 0.0) for k in ("grad_sqr", "grad_var", "batch_size"))
        if sqr > 0 and var >= 0 and batch > 0 and r.world_size:
            local = batch / r.world_size
            return ReportedEfficiency(GradParams(sqr, var), local, r.scalars.get("init_batch_size") or local)
    return None


def cluster_demand(
    cluster: Cluster,
    reports: Sequence[Report] = (),
    commands: Sequence[Sequence[str]] = (),
    parked: bool = False,
    model_gpus: Mapping[str, int] | None = None,
) -> ClusterDemand:
    """A cluster row as a :class:`ClusterDemand`, with its running jobs' commands and newest reports. A
    cluster asking for a GPU model never grows beyond what the node has of it (`model_gpus`): the rest of
    the node's GPUs are of no use to it. (The policy still sees one pool: a typed cluster admitted while
    its model's GPUs are held by others waits at the reconciler, saying for which model.)"""
    low, high = effective_bounds(cluster, commands)
    if cluster.gpu_type is not None and model_gpus is not None and cluster.gpus_per_container > 0:
        high = max(min(high, model_gpus.get(cluster.gpu_type, 0) // cluster.gpus_per_container), low)
    return ClusterDemand(
        name=cluster.name,
        desired=cluster.desired_containers,
        min_containers=low,
        max_containers=high,
        gpus_per_container=cluster.gpus_per_container,
        priority=cluster.priority or 0,
        arrival_s=_ts(cluster.created_at) or 0.0,
        admitted=cluster.admitted,
        throughput=measured_throughput(
            ((r.world_size, r.rate()) for r in reports), cluster.gpus_per_container
        ),
        attained_gpu_s=cluster.attained_gpu_s or 0.0,
        service_since_s=_ts(cluster.service_since),
        parked=parked,
        efficiency=reported_efficiency(reports),
    )


def _ts(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None
