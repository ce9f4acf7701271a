"""Collectors of ``/metrics`` that read the control plane's state at scrape time (nothing kept).

`ControlPlaneCollector`: clusters, containers and jobs by state, queued clusters, GPUs, scheduler
decisions, and per job its last reported step, samples/s, world size and loss, with its incidents and
pauses. `UsageCollector`: CPU, memory and GPU figures per running container, and NVML's figures per GPU.

Label cardinality is bounded: per-job series only for jobs that run or ended in the last
`RECENT_JOB_S` seconds, at most `MAX_JOB_SERIES` of them (the newest); the only free-form labels are
cluster names (DNS labels) and job ids; every other label comes from a closed set (an enum).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from elastrain.db.models import (
    Cluster,
    ClusterState,
    Container,
    ContainerState,
    Event,
    EventAction,
    Job,
    JobStatus,
    utcnow,
)
from elastrain.db.repository import all_clusters
from elastrain.db.session import Database
from elastrain.rendezvous.api import Cause
from elastrain.server.inventory import Inventory
from elastrain.server.scheduler_step import ClusterScheduler
from elastrain.server.scheduling import DECISION_KINDS
from elastrain.server.usage_service import ClusterRow, UsageService

RECENT_JOB_S = 900.0
MAX_JOB_SERIES = 100
MAX_USAGE_CLUSTERS = 100  # running clusters whose containers a scrape reads (the newest)
JOB_LABELS = ("cluster", "job")


@dataclass
class JobIncidents:
    """A job's generation changes, from its ``job.incident`` events."""

    by_cause: dict[str, int] = field(default_factory=lambda: dict.fromkeys((c.value for c in Cause), 0))
    pauses: int = 0  # generation changes after the first (each pauses training)
    pause_seconds: float = 0.0  # detection to the new generation's first step, summed
    steps_lost: int = 0


def _gauge(name: str, doc: str, labels: Iterable[str] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


class ControlPlaneCollector(Collector):
    """The database's view of clusters, containers and jobs, read at each scrape."""

    def __init__(self, db: Database, inventory: Inventory, scheduler: ClusterScheduler | None) -> None:
        self.db, self.inventory, self.scheduler = db, inventory, scheduler

    def collect(self) -> Iterator[Metric]:
        """Every series, from one database session."""
        with self.db.session() as session:
            clusters = all_clusters(session)
            yield from self._clusters(clusters)
            job_counts = dict(session.execute(select(Job.status, func.count()).group_by(Job.status)).all())
            jobs = _recent_jobs(session)
            names = {c.id: c.name for c in clusters}
            incidents = _incidents(session, jobs)
        by_status = _gauge("elastrain_jobs", "Jobs by status", ["status"])
        for status in JobStatus:
            by_status.add_metric([status.value], job_counts.get(status, 0))
        yield by_status
        yield from _job_series(jobs, names, incidents)
        decisions = CounterMetricFamily(
            "elastrain_scheduler_decisions",
            "Cluster sizes and admissions the scheduler changed",
            labels=["decision"],
        )
        counts = dict(self.scheduler.decisions) if self.scheduler is not None else {}
        for kind in DECISION_KINDS:
            decisions.add_metric([kind], counts.get(kind, 0))
        yield decisions

    def _clusters(self, clusters: list[Cluster]) -> Iterator[Metric]:
        by_state = _gauge("elastrain_clusters", "Clusters by state", ["state"])
        for state in ClusterState:
            by_state.add_metric([state.value], sum(1 for c in clusters if c.state == state))
        yield by_state
        queued = _gauge("elastrain_clusters_queued", "Clusters waiting for the scheduler's admission")
        queued.add_metric([], sum(1 for c in clusters if not c.admitted))
        yield queued
        containers = [k for c in clusters for k in c.containers]
        by_state = _gauge("elastrain_containers", "Containers by state", ["state"])
        for kstate in ContainerState:
            by_state.add_metric([kstate.value], sum(1 for k in containers if k.state == kstate))
        yield by_state
        desired = _gauge("elastrain_cluster_desired_containers", "A cluster's desired size", ["cluster"])
        running = _gauge(
            "elastrain_cluster_running_containers", "A cluster's Running containers", ["cluster"]
        )
        for c in clusters:
            desired.add_metric([c.name], c.desired_containers)
            running.add_metric([c.name], sum(1 for k in c.containers if k.state == ContainerState.Running))
        yield desired
        yield running
        gpus = _gauge("elastrain_gpus", "GPUs of this node (real or virtual)")
        gpus.add_metric([], self.inventory.gpus)
        yield gpus
        used = _gauge("elastrain_gpus_used", "GPUs held by containers that have not failed")
        used.add_metric([], sum(k.gpus for k in containers if k.state != ContainerState.Failed))
        yield used


def _recent_jobs(session: Session) -> list[Job]:
    """Jobs running, or finished in the last `RECENT_JOB_S` seconds: the newest `MAX_JOB_SERIES`."""
    since = utcnow() - timedelta(seconds=RECENT_JOB_S)
    query = (
        select(Job)
        .where(or_(Job.status.in_((JobStatus.Running, JobStatus.Pending)), Job.finished_at >= since))
        .order_by(Job.id.desc())
        .limit(MAX_JOB_SERIES)
    )
    return list(session.scalars(query))


def _incidents(session: Session, jobs: list[Job]) -> dict[int, JobIncidents]:
    """The incidents of `jobs`, by job id (keyed by the cluster's uid and owner, as the job's events)."""
    if not jobs:
        return {}
    cluster_ids = {j.cluster_id for j in jobs}
    uids: dict[int, str] = {
        cid: uid
        for cid, uid in session.execute(select(Cluster.id, Cluster.uid).where(Cluster.id.in_(cluster_ids)))
    }
    wanted = {(uids.get(j.cluster_id), j.owner_id, j.id) for j in jobs}
    query = select(Event).where(
        Event.action == EventAction.job_incident.value, Event.cluster_uid.in_(set(uids.values()))
    )
    found: dict[int, JobIncidents] = defaultdict(JobIncidents)
    for event in session.scalars(query):
        try:
            detail = json.loads(event.detail or "{}")
        except ValueError:
            continue
        job_id = detail.get("job")
        if (event.cluster_uid, event.owner_id, job_id) not in wanted:
            continue
        record = found[job_id]
        cause = str(detail.get("cause", ""))
        if cause in record.by_cause:
            record.by_cause[cause] += 1
        if cause != Cause.START.value:
            record.pauses += 1
            record.pause_seconds += float(detail.get("recover_s") or 0.0)
        record.steps_lost += int(detail.get("steps_lost") or 0)
    return found


def _job_series(
    jobs: list[Job], names: dict[int, str], incidents: dict[int, JobIncidents]
) -> Iterator[Metric]:
    """Per job: its last reported figures, its incidents and pauses."""
    step = _gauge("elastrain_job_step", "A job's last reported step", JOB_LABELS)
    rate = _gauge("elastrain_job_samples_per_second", "A job's last reported throughput", JOB_LABELS)
    world = _gauge("elastrain_job_world_size", "A job's last reported world size (ranks)", JOB_LABELS)
    loss = _gauge("elastrain_job_loss", "A job's last reported loss", JOB_LABELS)
    running = _gauge("elastrain_job_running", "1 while the job runs, 0 once it ended", JOB_LABELS)
    by_cause = CounterMetricFamily(
        "elastrain_job_incidents", "A job's generation changes, by cause", labels=[*JOB_LABELS, "cause"]
    )
    pauses = CounterMetricFamily(
        "elastrain_job_pauses", "A job's pauses (generation changes after the first)", labels=JOB_LABELS
    )
    paused = CounterMetricFamily(
        "elastrain_job_pause_seconds",
        "Seconds from a fault's detection to the new generation's first step",
        labels=JOB_LABELS,
    )
    lost = CounterMetricFamily(
        "elastrain_job_steps_lost", "Committed steps lost in generation changes", labels=JOB_LABELS
    )
    for job in jobs:
        labels = [names.get(job.cluster_id, ""), str(job.id)]
        running.add_metric(labels, 1 if job.status == JobStatus.Running else 0)
        for family, value in (
            (step, job.step),
            (rate, job.samples_per_s),
            (world, job.world_size),
            (loss, job.loss),
        ):
            if value is not None:
                family.add_metric(labels, float(value))
        record = incidents.get(job.id, JobIncidents())
        for cause, count in record.by_cause.items():
            if count:  # a cause the job never had adds no series
                by_cause.add_metric([*labels, cause], count)
        pauses.add_metric(labels, record.pauses)
        paused.add_metric(labels, record.pause_seconds)
        lost.add_metric(labels, record.steps_lost)
    yield from (step, rate, world, loss, running, by_cause, pauses, paused, lost)


class UsageCollector(Collector):
    """CPU, memory and GPU figures of every Running container, and NVML's per-GPU figures."""

    def __init__(self, db: Database, usage: UsageService) -> None:
        self.db, self.usage = db, usage

    def collect(self) -> Iterator[Metric]:
        """Read the backend and NVML now (the usage service reuses a reading of the last second)."""
        with self.db.session() as session:
            query = (
                select(Cluster)
                .where(Cluster.containers.any(Container.state == ContainerState.Running))
                .order_by(Cluster.id.desc())
                .limit(MAX_USAGE_CLUSTERS)
            )
            rows = [ClusterRow.of(c) for c in session.scalars(query)]
        self.usage.forget(r.uid for r in rows)
        labels = ("cluster", "container")
        cpu = CounterMetricFamily(
            "elastrain_container_cpu_seconds", "CPU time a container used", labels=labels
        )
        memory = _gauge("elastrain_container_memory_working_set_bytes", "A container's memory in use", labels)
        limit = _gauge("elastrain_container_memory_limit_bytes", "A container's memory limit", labels)
        gpu_util = _gauge(
            "elastrain_container_gpu_utilization_percent", "A container's GPU busy %", [*labels, "gpu"]
        )
        gpu_mem = _gauge(
            "elastrain_container_gpu_memory_used_bytes", "A container's GPU memory in use", [*labels, "gpu"]
        )
        for row in rows:
            for k in self.usage.cluster_usage(row).containers:
                key = [row.name, k.name]
                if k.cpu_seconds is not None:
                    cpu.add_metric(key, k.cpu_seconds)
                if k.memory_bytes is not None:
                    memory.add_metric(key, k.memory_bytes)
                if k.memory_limit_bytes is not None:
                    limit.add_metric(key, k.memory_limit_bytes)
                for g in k.gpus:
                    if g.utilization_percent is not None:
                        gpu_util.add_metric([*key, str(g.index)], g.utilization_percent)
                    if g.memory_used_bytes is not None:
                        gpu_mem.add_metric([*key, str(g.index)], g.memory_used_bytes)
        yield from (cpu, memory, limit, gpu_util, gpu_mem)
        yield from self._gpus()

    def _gpus(self) -> Iterator[Metric]:
        snapshot = self.usage.gpu_snapshot()
        devices = _gauge("elastrain_gpu_devices", "GPUs NVML lists on this node (0: no GPUs, or no NVML)")
        devices.add_metric([], len(snapshot.gpus))
        util = _gauge("elastrain_gpu_utilization_percent", "A GPU's busy % (NVML)", ["gpu", "model"])
        used = _gauge("elastrain_gpu_memory_used_bytes", "A GPU's memory in use (NVML)", ["gpu"])
        total = _gauge("elastrain_gpu_memory_total_bytes", "A GPU's memory (NVML)", ["gpu"])
        for g in snapshot.gpus:
            if g.utilization_percent is not None:
                util.add_metric([str(g.index), g.name], g.utilization_percent)
            if g.memory_used_bytes is not None and g.memory_total_bytes is not None:
                used.add_metric([str(g.index)], g.memory_used_bytes)
                total.add_metric([str(g.index)], g.memory_total_bytes)
        yield from (devices, util, used, total)
