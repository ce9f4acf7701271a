"""The control plane's scheduling step: run the scheduler policy over the clusters in the database.

On every reconcile pass the scheduling step (:mod:`elastrain.server.scheduler_step`) builds the policy's
:class:`~elastrain.scheduler.api.ClusterState` from the DB, runs **the same policy object the
simulator runs** (:func:`elastrain.scheduler.registry.make_policy`: ``elastic`` is
:func:`~elastrain.scheduler.registry.elastic_policy`, preemptive, goodput-driven), and turns its
decisions into desired container counts, admissions and preemptions; the reconciler then carries
them out through the same graceful path as a manual ``cluster scale``.

Mapping (one node, the GPU inventory): a cluster is a scheduler job whose *workers are containers*
(the launcher holds ``gpus_per_container`` GPUs too), with the bounds of
:mod:`elastrain.server.cluster_demand`, its priority and its creation time as arrival. A cluster is
*running* for the policy once admitted (its size is its desired count), *queued* before. Its
attained service (GPU-seconds) is kept on its row (``attained_gpu_s`` up to ``service_since``), so
the least-attained-service ranking carries across passes and server restarts. A *preempted* cluster
gives back every container (its job stops) and queues again. A cluster whose workers were released
while idle keeps its launcher's GPUs outside the policy; once a job starts in it, it is queued for
its workers only (``parked``). Clusters without GPUs are not scheduled. ``static`` means no
scheduling step at all: the requested sizes.

:func:`build_state` and :func:`plan_targets` are pure; only :mod:`elastrain.server.scheduler_step`
touches the DB.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone

from elastrain.db.models import Cluster
from elastrain.scheduler import api
from elastrain.scheduler.goodput import GoodputSpeed
from elastrain.server.cluster_demand import ClusterDemand, cluster_demand, measured_throughput

__all__ = [
    "DECISION_KINDS",
    "ClusterDemand",
    "SchedulerMode",
    "Target",
    "build_state",
    "cluster_demand",
    "fold_service",
    "measured_throughput",
    "plan_targets",
]

log = logging.getLogger("elastrain.scheduling")
ACTOR = "scheduler"
NODE = "local"
DECISION_KINDS = ("admitted", "rescheduled", "preempted")
"""The scheduler's decisions as `ClusterScheduler.decisions` counts them: a queued cluster admitted
(``cluster.admitted``), an admitted one resized (``cluster.rescheduled``) or preempted
(``cluster.preempted``)."""


class SchedulerMode(str, enum.Enum):
    """``elastrain server --scheduler``: ``elastic`` (the default) or ``static`` (requested sizes)."""

    static = "static"
    elastic = "elastic"


@dataclass(frozen=True)
class Target:
    """A scheduling outcome for one cluster: its new size, whether it may run, and why.
    ``preempted``: it gives back every container and queues again."""

    cluster: str
    containers: int
    admitted: bool
    reason: str
    preempted: bool = False


def build_state(demands: Iterable[ClusterDemand], total_gpus: int, now_s: float) -> api.ClusterState:
    """The policy's view: admitted clusters run at their desired size (in queue order while they fit;
    one that no longer fits, e.g. after ``--gpus`` shrank, is left out), the others are queued. A
    parked cluster's launcher GPUs are taken off the node, and it queues for its workers only."""
    demands = list(demands)
    jobs = sorted((_job(d) for d in demands), key=api.queue_key)
    by_name = {d.name: d for d in demands}
    free = max(total_gpus - sum(d.gpus_per_container for d in demands if d.parked), 0)
    total = free
    running: list[api.Job] = []
    queued: list[api.Job] = []
    for job in jobs:
        d = by_name[job.id]
        since = now_s if d.service_since_s is None else d.service_since_s
        if not d.admitted:
            queued.append(replace(job, service_since_s=since))
            continue
        workers = min(max(job.requested, job.min_workers), job.max_workers, free // job.gpus_per_worker)
        if workers < job.min_workers:
            log.debug("cluster %s does not fit in the inventory; not scheduled this pass", job.id)
            continue
        free -= workers * job.gpus_per_worker
        running.append(replace(job, placement=((NODE, workers),), service_since_s=min(since, now_s)))
    node = api.Node(NODE, total, free)
    return api.ClusterState(nodes=(node,), running=tuple(running), queued=tuple(queued), now_s=now_s)


def plan_targets(
    state: api.ClusterState,
    decisions: Sequence[api.Decision],
    parked: Iterable[str] = (),
    priorities: dict[str, int] | None = None,
    desired: dict[str, int] | None = None,
) -> list[Target]:
    """Validate ``decisions`` with :func:`elastrain.scheduler.api.apply` and list, in decision order,
    every cluster that starts, grows, shrinks, is preempted or keeps waiting, with the reason in
    words; then every running cluster whose ``desired`` count (the DB's) is outside the bounds its
    job now gives (:func:`build_state` runs it within them). A parked cluster's size counts its
    launcher on top of the workers the policy gave it."""
    after = {j.id: j for j in api.apply(state, decisions).running}
    before = {j.id: j.workers for j in state.running}
    offset = {name: 1 for name in parked}
    started = [d.job_id for d in decisions if d.kind in (api.DecisionKind.START, api.DecisionKind.GROW)]
    out: list[Target] = []
    seen: set[str] = set()
    for d in decisions:
        if d.job_id in seen:
            continue
        reason = _words(d.reason, priorities or {})
        if d.kind is api.DecisionKind.PREEMPT:
            seen.add(d.job_id)
            winners = ", ".join(_named(n, priorities or {}) for n in started) or "better-ranked clusters"
            out.append(Target(d.job_id, 0, False, f"preempted for cluster {winners}", preempted=True))
        elif d.kind is api.DecisionKind.WAIT:
            if d.job_id not in after:
                seen.add(d.job_id)
                out.append(Target(d.job_id, 0, False, reason))
        elif d.job_id in after and (before.get(d.job_id) != after[d.job_id].workers or reason):
            seen.add(d.job_id)
            job = after[d.job_id]
            out.append(Target(job.id, job.workers + offset.get(job.id, 0), True, reason))
    for job in after.values():
        size = job.workers + offset.get(job.id, 0)
        if job.id not in seen and desired and desired.get(job.id, size) != size:
            low, high = job.min_workers + offset.get(job.id, 0), job.max_workers + offset.get(job.id, 0)
            out.append(Target(job.id, size, True, f"fitted to its job's range ({low}..{high} containers)"))
    return out


def _named(name: str, priorities: dict[str, int]) -> str:
    return f"{name} (priority {priorities[name]})" if name in priorities else name


def _words(reason: str, priorities: dict[str, int]) -> str:
    """The policies count workers; a cluster's unit is a container (launcher included); a cluster
    named in a reason gets its priority."""
    text = reason.replace("worker(s)", "container(s)")
    head, sep, names = text.partition("for cluster ")
    if not sep:
        return text
    return head + sep + ", ".join(_named(n.strip(), priorities) for n in names.split(","))


def _job(d: ClusterDemand) -> api.Job:
    off = 1 if d.parked else 0  # a parked cluster's launcher is up: it queues for its workers
    requested = min(max(d.desired, d.min_containers), d.max_containers)
    return api.Job(
        id=d.name,
        min_workers=max(d.min_containers - off, 1),
        max_workers=max(d.max_containers - off, 1),
        gpus_per_worker=d.gpus_per_container,
        priority=d.priority,
        arrival_s=d.arrival_s,
        requested_workers=max(requested - off, 1),
        throughput=tuple((c - off, r) for c, r in d.throughput if c - off >= 1),
        attained_gpu_s=d.attained_gpu_s,
    )


def fold_service(cluster: Cluster, now: datetime) -> None:
    """Bring the cluster's attained GPU-service up to ``now`` (before its size or admission changes):
    an admitted cluster has held ``desired x gpus_per_container`` GPUs since ``service_since``."""
    since = cluster.service_since
    if since is not None and cluster.admitted:
        if since.tzinfo is None:
            since = since.replace(tzinfo=timezone.utc)
        held = cluster.desired_containers * cluster.gpus_per_container
        cluster.attained_gpu_s = (cluster.attained_gpu_s or 0.0) + held * max(
            0.0, (now - since).total_seconds()
        )
    cluster.service_since = now


def set_speed(policy: api.Policy, demands: Iterable[ClusterDemand]) -> None:
    """Hand the clusters' reported gradient statistics to the policy's goodput model (if it has one)."""
    speed = getattr(policy, "speed", None)
    if not isinstance(speed, GoodputSpeed):
        return
    for d in demands:
        speed.set_reported(d.name, d.efficiency)
