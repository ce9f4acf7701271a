"""The scheduling step's DB side: read the clusters, their running jobs and reports, run the policy
(:mod:`elastrain.server.scheduling`), and write sizes, admissions, preemptions and service back."""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Mapping
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from elastrain.db.models import (
    Cluster,
    ClusterState,
    ContainerRole,
    ContainerState,
    EventAction,
    Job,
    JobMetric,
    JobStatus,
    utcnow,
)
from elastrain.db.repository import add_event, all_clusters
from elastrain.db.session import Database
from elastrain.scheduler.registry import make_policy
from elastrain.server.cluster_demand import Report, cluster_demand
from elastrain.server.scheduling import (
    ACTOR,
    DECISION_KINDS,
    SchedulerMode,
    Target,
    build_state,
    fold_service,
    plan_targets,
    set_speed,
)

log = logging.getLogger("elastrain.scheduling")
METRIC_WINDOW = 200  # newest progress reports per cluster used for its goodput
_LIVE = (ContainerState.Pending, ContainerState.Running)


def scheduler_for(mode: SchedulerMode | str) -> ClusterScheduler | None:
    """The scheduling step of ``elastrain server --scheduler MODE`` (None for ``static``)."""
    if SchedulerMode(mode) == SchedulerMode.static:
        return None
    return ClusterScheduler(SchedulerMode(mode))


class ClusterScheduler:
    """Runs the policy over the DB's clusters and writes its outcome back (desired counts, admissions,
    preemptions, attained service, the reason for each size, and an event per change)."""

    def __init__(self, mode: SchedulerMode | str = SchedulerMode.elastic) -> None:
        self.mode = SchedulerMode(mode)
        self.policy = make_policy(self.mode.value)  # the simulator's policy object and configuration
        # decisions written so far, by kind (for /metrics); every key present from the start, so a
        # reader in another thread never sees the dict change size
        self.decisions: dict[str, int] = dict.fromkeys(DECISION_KINDS, 0)

    def run(self, db: Database, total_gpus: int, model_gpus: Mapping[str, int] | None = None) -> int:
        """One scheduling step; returns how many clusters changed size, admission or were preempted.
        `model_gpus`: the node's GPUs per model, which bound a cluster asking for one (``gpu_type``)."""
        with db.session() as session:
            rows = {
                c.name: c
                for c in all_clusters(session)
                if c.state != ClusterState.Terminating and c.gpus_per_container > 0
            }
            if not rows:
                return 0
            commands = _running_commands(session)
            reports = _reports(session)
            # a cluster idle-released keeps its launcher (and its GPUs) outside the policy
            held = sum(c.desired_containers * c.gpus_per_container for c in rows.values() if c.idle_released)
            demands = [
                cluster_demand(c, reports.get(c.id, ()), commands.get(c.id, ()), _parked(c), model_gpus)
                for c in rows.values()
                if not c.idle_released
            ]
            now = utcnow()
            state = build_state(demands, total_gpus - held, now.timestamp())
            set_speed(self.policy, demands)
            parked = [d.name for d in demands if d.parked]
            priorities = {d.name: d.priority for d in demands}
            desired = {d.name: d.desired for d in demands if d.admitted}
            targets = plan_targets(state, self.policy.decide(state), parked, priorities, desired)
            written = [_write(session, rows[t.cluster], t, now) for t in targets]
        for kind in written:
            if kind is not None:
                self.decisions[kind] += 1
        return sum(1 for kind in written if kind is not None)


def _parked(cluster: Cluster) -> bool:
    """Queued with its launcher up (its workers were released): it waits for workers only."""
    return (
        not cluster.admitted
        and cluster.desired_containers >= 1
        and any(k.role == ContainerRole.launcher and k.state in _LIVE for k in cluster.containers)
    )


def _running_commands(session: Session) -> dict[int, list[list[str]]]:
    out: dict[int, list[list[str]]] = defaultdict(list)
    query = select(Job.cluster_id, Job.command).where(Job.status.in_((JobStatus.Running, JobStatus.Pending)))
    for cluster_id, command in session.execute(query):
        try:
            argv = json.loads(command)
        except ValueError:
            argv = []
        out[cluster_id].append([str(a) for a in argv] if isinstance(argv, list) else [])
    return out


def _reports(session: Session) -> dict[int, list[Report]]:
    """The newest reports of running jobs, per cluster (at most `METRIC_WINDOW` each)."""
    out: dict[int, list[Report]] = defaultdict(list)
    query = (
        select(Job.cluster_id, JobMetric.world_size, JobMetric.samples_per_s, JobMetric.scalars)
        .join(Job, Job.id == JobMetric.job_id)
        .where(Job.status == JobStatus.Running)
        .order_by(JobMetric.id.desc())
        .limit(METRIC_WINDOW * 20)
    )
    for cluster_id, world, rate, scalars in session.execute(query):
        if len(out[cluster_id]) < METRIC_WINDOW:
            out[cluster_id].append(Report.of(world, rate, scalars))
    return out


def _write(session: Session, cluster: Cluster, target: Target, now: datetime) -> str | None:
    """Record one target on its row; an event (with the reason) only when the size, admission or
    queueing changes. Returns that decision's kind (`DECISION_KINDS`; None: nothing changed)."""
    before, was_admitted = cluster.desired_containers, cluster.admitted
    if target.preempted:
        fold_service(cluster, now)  # from now on it waits: service_since is when it queued again
        cluster.desired_containers, cluster.admitted, cluster.size_reason = 0, False, target.reason
        add_event(
            session, ACTOR, EventAction.cluster_preempted, cluster.name, cluster.owner_id,
            before=before, after=0, reason=target.reason,
        )  # fmt: skip
        log.info("cluster %s preempted (%s)", cluster.name, target.reason)
        return "preempted"
    if not target.admitted:
        reason = target.reason
        if cluster.size_reason.startswith("preempted for") and not cluster.admitted:
            reason = f"{cluster.size_reason.partition('; ')[0]}; {reason}"  # keep why it lost its GPUs
        if cluster.size_reason != reason:
            cluster.size_reason = reason
        return None
    cluster.size_reason = target.reason or cluster.size_reason
    if before == target.containers and was_admitted:
        return None
    fold_service(cluster, now)
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
