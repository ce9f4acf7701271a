"""The control plane's scheduling step: run a scheduler policy over the clusters in the database.

On every reconcile pass (every API change wakes one) :class:`ClusterScheduler` builds the policy's
:class:`~elastrain.scheduler.api.ClusterState` from the DB, runs the policy, and turns its decisions
into desired container counts and admissions; the reconciler then carries them out through the same
graceful path as a manual ``cluster scale`` (hostfile generation, drain, resize of running jobs).

Mapping (one node, the GPU inventory): a cluster is a scheduler job whose *workers are containers*
(the launcher holds ``gpus_per_container`` GPUs too), with bounds ``min_containers..max_containers``,
its priority and its creation time as arrival. A cluster is *running* for the policy once admitted
(its size is its desired count), *queued* before. Clusters without GPUs need nothing from the
inventory and are not scheduled. ``static`` means no scheduling step at all: today's fixed sizes.

:func:`build_state` and :func:`plan_targets` are pure; only :meth:`ClusterScheduler.run` touches the DB.
"""

from __future__ import annotations

import enum
import logging
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from sqlalchemy import select
from sqlalchemy.orm import Session

from elastrain.db.models import Cluster, ClusterState, EventAction, Job, JobMetric
from elastrain.db.repository import add_event, all_clusters
from elastrain.db.session import Database
from elastrain.scheduler import api
from elastrain.scheduler.registry import make_policy

log = logging.getLogger("elastrain.scheduling")
ACTOR = "scheduler"
NODE = "local"
METRIC_WINDOW = 200  # newest progress reports per cluster used for its measured throughput
DECISION_KINDS = ("admitted", "rescheduled")
"""The scheduler's decisions as `ClusterScheduler.decisions` counts them: a queued cluster admitted
(``cluster.admitted``), an admitted one resized (``cluster.rescheduled``)."""


class SchedulerMode(str, enum.Enum):
    """``elastrain server --scheduler``: ``static`` keeps the requested sizes (no scheduling step)."""

    static = "static"
    elastic = "elastic"


def scheduler_for(mode: SchedulerMode | str) -> ClusterScheduler | None:
    """The scheduling step of ``elastrain server --scheduler MODE`` (None for ``static``)."""
    if SchedulerMode(mode) == SchedulerMode.static:
        return None
    return ClusterScheduler(SchedulerMode(mode))


@dataclass(frozen=True)
class ClusterDemand:
    """What the scheduler needs to know about one cluster (sizes count containers, launcher included)."""

    name: str
    desired: int
    min_containers: int
    max_containers: int
    gpus_per_container: int
    priority: int = 0
    arrival_s: float = 0.0
    admitted: bool = True
    throughput: tuple[tuple[int, float], ...] = ()  # (containers, samples/s)


@dataclass(frozen=True)
class Target:
    """A scheduling outcome for one cluster: its new size, whether it may start, and why."""

    cluster: str
    containers: int
    admitted: bool
    reason: str


def build_state(demands: Iterable[ClusterDemand], total_gpus: int, now_s: float) -> api.ClusterState:
    """The policy's view: admitted clusters run at their desired size (in queue order while they fit;
    one that no longer fits, e.g. after ``--gpus`` shrank, is left out), the others are queued."""
    jobs = sorted((_job(d) for d in demands), key=api.queue_key)
    admitted = {d.name for d in demands if d.admitted}
    free = max(total_gpus, 0)
    running: list[api.Job] = []
    queued: list[api.Job] = []
    for job in jobs:
        if job.id not in admitted:
            queued.append(job)
            continue
        workers = min(max(job.requested, job.min_workers), job.max_workers, free // job.gpus_per_worker)
        if workers < job.min_workers:
            log.debug("cluster %s does not fit in the inventory; not scheduled this pass", job.id)
            continue
        free -= workers * job.gpus_per_worker
        # no attained-service history here: service counts from now (not from the epoch)
        running.append(replace(job, placement=((NODE, workers),), service_since_s=now_s))
    node = api.Node(NODE, max(total_gpus, 0), free)
    return api.ClusterState(nodes=(node,), running=tuple(running), queued=tuple(queued), now_s=now_s)


def plan_targets(state: api.ClusterState, decisions: Sequence[api.Decision]) -> list[Target]:
    """Validate ``decisions`` with :func:`elastrain.scheduler.api.apply` and list every cluster whose
    size or admission changes (started, grown, shrunk) or that keeps waiting, with the reason."""
    after = api.apply(state, decisions)
    before = {j.id: j.workers for j in state.running}
    reasons = {d.job_id: _containers(d.reason) for d in decisions}
    out: list[Target] = []
    for job in after.running:
        if before.get(job.id) != job.workers or job.id in reasons:
            out.append(Target(job.id, job.workers, True, reasons.get(job.id, "")))
    running = {j.id for j in after.running}
    for d in decisions:
        if d.kind is api.DecisionKind.WAIT and d.job_id not in running:
            out.append(Target(d.job_id, 0, False, reasons[d.job_id]))
    return out


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


class ClusterScheduler:
    """Runs a policy over the DB's clusters and writes its outcome back (desired counts, admissions,
    the reason for each size, and a ``cluster.rescheduled`` event per change)."""

    def __init__(self, mode: SchedulerMode | str = SchedulerMode.elastic) -> None:
        self.mode = SchedulerMode(mode)
        self.policy = make_policy(self.mode.value, preemptive=False)  # clusters cannot be suspended yet
        # decisions written so far, by kind (for /metrics); every key present from the start, so a
        # reader in another thread never sees the dict change size
        self.decisions: dict[str, int] = dict.fromkeys(DECISION_KINDS, 0)

    def run(self, db: Database, total_gpus: int, model_gpus: Mapping[str, int] | None = None) -> int:
        """One scheduling step; returns how many clusters changed size or admission. `model_gpus`: the
        node's GPUs per model, which bound a cluster asking for one (``gpu_type``)."""
        with db.session() as session:
            clusters = {
                c.name: c
                for c in all_clusters(session)
                if c.state != ClusterState.Terminating and c.gpus_per_container > 0
            }
            if not clusters:
                return 0
            demands = [cluster_demand(c, _reports(session, c), model_gpus) for c in clusters.values()]
            state = build_state(demands, total_gpus, time.time())
            targets = plan_targets(state, self.policy.decide(state))
            written = [_write(session, clusters[t.cluster], t) for t in targets]
        for kind in written:
            if kind is not None:
                self.decisions[kind] += 1
        return sum(1 for kind in written if kind is not None)


def cluster_demand(
    cluster: Cluster,
    reports: Iterable[tuple[int | None, float | None]] = (),
    model_gpus: Mapping[str, int] | None = None,
) -> ClusterDemand:
    """A cluster row as a :class:`ClusterDemand` (missing bounds: fixed at the desired count). A cluster
    asking for a GPU model never grows beyond what the node has of it (`model_gpus`): the rest of the
    node's GPUs are of no use to it. (The policy still sees one pool: a typed cluster admitted while
    its model's GPUs are held by others waits at the reconciler, saying for which model.)"""
    low = cluster.min_containers or cluster.desired_containers
    high = max(cluster.max_containers or cluster.desired_containers, low)
    if cluster.gpu_type is not None and model_gpus is not None and cluster.gpus_per_container > 0:
        high = max(min(high, model_gpus.get(cluster.gpu_type, 0) // cluster.gpus_per_container), low)
    return ClusterDemand(
        name=cluster.name,
        desired=cluster.desired_containers,
        min_containers=low,
        max_containers=high,
        gpus_per_container=cluster.gpus_per_container,
        priority=cluster.priority or 0,
        arrival_s=cluster.created_at.timestamp() if cluster.created_at else 0.0,
        admitted=cluster.admitted,
        throughput=measured_throughput(reports, cluster.gpus_per_container),
    )


def _job(d: ClusterDemand) -> api.Job:
    requested = min(max(d.desired, d.min_containers), d.max_containers)
    return api.Job(
        id=d.name,
        min_workers=d.min_containers,
        max_workers=d.max_containers,
        gpus_per_worker=d.gpus_per_container,
        priority=d.priority,
        arrival_s=d.arrival_s,
        requested_workers=requested,
        throughput=d.throughput,
    )


def _containers(reason: str) -> str:
    """The policies count workers; a cluster's scheduled unit is a container (launcher included)."""
    return reason.replace("worker(s)", "container(s)")


def _reports(session: Session, cluster: Cluster) -> list[tuple[int | None, float | None]]:
    query = (
        select(JobMetric.world_size, JobMetric.samples_per_s)
        .join(Job, Job.id == JobMetric.job_id)
        .where(Job.cluster_id == cluster.id, JobMetric.samples_per_s.is_not(None))
        .order_by(JobMetric.id.desc())
        .limit(METRIC_WINDOW)
    )
    return [(w, s) for w, s in session.execute(query)]


def _write(session: Session, cluster: Cluster, target: Target) -> str | None:
    """Record one target on its row; an event (with the reason) only when the size or admission
    changes. Returns that decision's kind (`DECISION_KINDS`; None: nothing changed)."""
    if not target.admitted:
        if cluster.size_reason != target.reason:
            cluster.size_reason = target.reason
        return None
    before, was_admitted = cluster.desired_containers, cluster.admitted
    cluster.size_reason = target.reason or cluster.size_reason
    if before == target.containers and was_admitted:
        return None
    cluster.desired_containers, cluster.admitted = target.containers, True
    add_event(
        session,
        ACTOR,
        EventAction.cluster_admitted if not was_admitted else EventAction.cluster_rescheduled,
        cluster.name,
        cluster.owner_id,
        before=before if was_admitted else 0,
        after=target.containers,
        reason=target.reason,
    )
    log.info("cluster %s: %d -> %d containers (%s)", cluster.name, before, target.containers, target.reason)
    return "rescheduled" if was_admitted else "admitted"
