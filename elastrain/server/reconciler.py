"""The reconcile loop: snapshot the DB and the backend, run the policy, apply its decisions."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from elastrain.backends.api import Backend, ContainerSpec
from elastrain.backends.local import HOSTFILE_PATH
from elastrain.db.models import (
    Cluster,
    ClusterState,
    Container,
    ContainerState,
    EventAction,
    Job,
    JobStatus,
    utcnow,
)
from elastrain.db.repository import add_event, all_clusters, cluster_by_name
from elastrain.db.session import Database
from elastrain.errors import ElastrainError
from elastrain.hostfile import Hostfile, render_hostfile
from elastrain.server.hostfile_sync import HostfileSync, hostfile_text
from elastrain.server.idle_release import IdleRelease
from elastrain.server.inventory import Inventory, parse_gpu_ids
from elastrain.server.membership import JobHosts, JobMembership
from elastrain.server.metrics_stats import ReconcileStats
from elastrain.server.mount_sources import check_stored_mounts, stored_mounts
from elastrain.server.policy import (
    Action,
    ClusterView,
    ContainerView,
    Decision,
    hosts_text,
    plan,
    worker_index,
)
from elastrain.server.reconcile_errors import StepFailures
from elastrain.server.reconcile_isolation import STEP_DEADLINE_S, ClusterSteps, with_degraded
from elastrain.server.scheduler_step import ClusterScheduler
from elastrain.server.start_backoff import StartBackoff
from elastrain.server.validation import check_mount_unchanged

log = logging.getLogger("elastrain.reconciler")
ACTOR = "reconciler"
BUSY_POLL_S = 0.25  # the pass interval after the first second of containers starting or draining
TENANT_UID_BASE = 20000
PAUSED_REASON = (
    "paused (frozen): its processes are stopped, not exited; a job on it sees a hang, which its "
    "heartbeat bound handles (`podman unpause` resumes it)"
)


def aware(value: datetime | None) -> datetime | None:
    """SQLite returns naive datetimes; treat them as UTC."""
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    return value


def cluster_view(cluster: Cluster, jobs: tuple[JobHosts, ...] = ()) -> ClusterView:
    """The policy's view of a cluster row (with its running jobs' reported hosts)."""
    containers = tuple(
        ContainerView(
            k.name,
            k.role,
            k.address,
            tuple(parse_gpu_ids(k.gpu_ids)),
            k.state,
            k.pid,
            aware(k.terminating_since),
        )
        for k in cluster.containers
    )
    return ClusterView(
        cluster.name,
        cluster.uid,
        cluster.desired_containers,
        cluster.gpus_per_container,
        cluster.state,
        cluster.restart_policy,
        cluster.hostfile_generation,
        cluster.hostfile_text,
        cluster.reason,
        containers,
        admitted=cluster.admitted,
        size_reason=cluster.size_reason,
        jobs=jobs,
        next_index=cluster.next_index or 0,
        gpu_type=cluster.gpu_type,
    )


def container_spec(cluster: Cluster, row: Container, real_gpus: bool) -> ContainerSpec:
    """What the backend needs to start (or run a command in) `row`."""
    mounts = tuple(stored_mounts(cluster.mounts))
    return ContainerSpec(
        cluster=cluster.name,
        cluster_uid=cluster.uid,
        name=row.name,
        role=row.role.value,
        address=row.address,
        gpu_ids=tuple(parse_gpu_ids(row.gpu_ids)),
        real_gpus=real_gpus,
        shm_bytes=cluster.shm_bytes,
        image=cluster.image,
        mounts=mounts,
        framework=cluster.framework.value,
        tenant=cluster.owner.name,
        tenant_uid=tenant_uid(cluster.owner_id),
        memory_bytes=cluster.memory_bytes or 0,
        cpus=cluster.cpus or 0.0,
    )


def tenant_uid(user_id: int) -> int:
    """The unprivileged uid a tenant's processes run as in containers (one per user)."""
    return TENANT_UID_BASE + user_id


class Reconciler:
    """Runs `reconcile_once` every `interval_s` seconds, or sooner when woken."""

    def __init__(
        self,
        db: Database,
        backend: Backend,
        inventory: Inventory,
        interval_s: float = 0.5,
        drain_s: float = 30.0,
        scheduler: ClusterScheduler | None = None,
        membership: JobMembership | None = None,
        step_deadline_s: float = STEP_DEADLINE_S,
        idle: IdleRelease | None = None,
    ) -> None:
        """``scheduler`` (None: ``static``, the requested sizes; see `scheduling.scheduler_for`) sets
        desired sizes and admissions before each pass; ``idle`` releases idle clusters' workers. A
        scaled-down container is removed when
        the running jobs' reported memberships (`membership`) no longer list it, at most ``drain_s``
        after it left the hostfile. Each cluster's steps of a pass run with `step_deadline_s` (see
        `reconcile_isolation`)."""
        self.db = db
        self.backend = backend
        self.inventory = inventory
        self.interval_s = interval_s
        self.drain = timedelta(seconds=drain_s)
        self.membership = membership if membership is not None else JobMembership()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.passes = 0
        self._busy = False
        self._busy_since: float | None = None  # when the current run of busy passes began
        self.hooks: list[Callable[[], int]] = []  # run after each pass (e.g. the job monitor)
        self.scheduler = scheduler
        self.idle = idle  # releases idle clusters' workers (None: never)
        self.failures = StepFailures(db, ACTOR)
        self.start_backoff = StartBackoff()  # refused starts wait, doubling (per cluster)
        self.stats = ReconcileStats()  # pass durations and failures, for /metrics
        self.steps = ClusterSteps(step_deadline_s, wake=self.wake)
        self.steps.troubles.append(self.start_backoff.given_up)  # given up: the cluster shows Degraded
        self.hostfiles = HostfileSync(db, backend, self.steps, self.stats, self.failures)

    def start(self) -> None:
        """Start the loop in a daemon thread."""
        self._thread = threading.Thread(target=self._run, name="reconciler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the loop (containers keep running; a restarted server adopts them)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def wake(self) -> None:
        """Run a pass now (after an API change)."""
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            try:
                changed = self.reconcile_once()
            except Exception:  # the loop must survive any one bad pass
                log.exception("reconcile pass failed")
                changed = 0
            if not changed:  # poll faster while containers are starting or draining
                self._wake.wait(self._poll_interval(time.monotonic()))

    def _poll_interval(self, now: float) -> float:
        """`interval_s` when idle; while containers start or drain, 0.1 s for the first second (a
        container is usually up within it), then `BUSY_POLL_S`: a pass reads every cluster and
        container, and a steady stream of scale requests must not make the loop eat the API's CPU."""
        if not self._busy:
            self._busy_since = None
            return self.interval_s
        if self._busy_since is None:
            self._busy_since = now
        fast = now - self._busy_since < 1.0
        return min(self.interval_s, 0.1 if fast else BUSY_POLL_S)

    def reconcile_once(self) -> int:
        """One pass: returns how many decisions were applied."""
        with self.stats.timed_pass():
            return self._pass()

    def _pass(self) -> int:
        released = self.idle.run(self.db, utcnow()) if self.idle is not None else 0
        if self.scheduler is not None:
            scheduled = self.scheduler.run(self.db, self.inventory.gpus, self.inventory.model_counts())
        else:
            scheduled = self._admit_queued() if self.passes == 0 else 0
        actual = self.backend.list_containers()
        with self.db.session() as session:
            running: dict[int, list[int]] = {}
            for job_id, cluster_id in session.execute(
                select(Job.id, Job.cluster_id).where(Job.status == JobStatus.Running)
            ):
                running.setdefault(cluster_id, []).append(job_id)
            views = [
                cluster_view(c, self.membership.of(running.get(c.id, []))) for c in all_clusters(session)
            ]
        decisions = plan(
            views, actual, self.inventory, utcnow(), self.drain, named_hosts=not self.backend.translates_paths
        )
        transient = (ContainerState.Pending, ContainerState.Terminating)
        self._busy = any(k.state in transient for c in views for k in c.containers)
        uids = {c.name: c.uid for c in views}
        self.failures.keep_only(uids.items())
        marks, decisions = with_degraded(decisions, views, self.steps.degraded())
        applied = sum(self._apply_isolated(d, uids.get(d.cluster, "")) for d in marks)
        groups: dict[str, list[Decision]] = {}
        for decision in decisions:
            groups.setdefault(decision.cluster, []).append(decision)
        steps = {name: self._steps_of(group, uids.get(name, "")) for name, group in groups.items()}
        applied += sum(self.steps.run(steps).values())
        self.hostfiles.sync()
        for hook in self.hooks:
            try:
                hook()
            except Exception as exc:
                self.stats.failed("hook")
                self.failures.report("", "", getattr(hook, "__qualname__", "hook"), exc, record=False)
        self.passes += 1
        return applied + scheduled + released

    def _steps_of(self, group: list[Decision], uid: str) -> Callable[[], int]:
        """Apply one cluster's decisions in order; the first that fails leaves the rest to the next pass.
        How many were applied."""

        def steps() -> int:
            for done, decision in enumerate(group):
                if not self._apply_isolated(decision, uid):
                    return done
            return len(group)

        return steps

    def _apply_isolated(self, decision: Decision, uid: str) -> bool:
        """Apply `decision` in its own transaction: an error rolls it back and is reported (once) on its
        cluster instead of stopping the pass for every cluster. False when it failed."""
        try:
            with self.db.session() as session:
                self._apply(session, decision)
        except Exception as exc:
            step = decision.action.value
            self.stats.failed(step)
            self.failures.report(decision.cluster, uid, step, exc, container=decision.container)
            return False
        return True

    def _admit_queued(self) -> int:
        """Without a scheduler every cluster runs at its desired size: admit the ones a scheduler of an
        earlier server process left queued."""
        with self.db.session() as session:
            result = session.execute(
                update(Cluster).where(Cluster.admitted.is_(False)).values(admitted=True, size_reason="")
            )
            session.execute(  # preempted by an elastic scheduler: back at the size last asked for
                update(Cluster)
                .where(Cluster.desired_containers == 0)
                .values(desired_containers=func.coalesce(Cluster.requested_containers, 2))
            )
            return int(getattr(result, "rowcount", 0) or 0)

    @staticmethod
    def hostfile_text(cluster: Cluster) -> str:
        """The full hostfile text of a cluster (generation line + host lines)."""
        return hostfile_text(cluster)

    def _apply(self, session: Session, d: Decision) -> None:
        cluster = cluster_by_name(session, d.cluster)
        if d.action == Action.stop_orphan:
            log.info("stopping orphan container %s/%s", d.cluster, d.container)
            self.backend.delete_container(d.cluster, d.container, cluster.uid if cluster else "")
            add_event(session, ACTOR, EventAction.container_orphan_stopped, d.cluster, container=d.container)
            return
        if cluster is None:
            return
        if cluster.state == ClusterState.Terminating and d.action != Action.finalize_delete:
            return  # deleted after the snapshot: the next pass finalizes it
        if d.action in (Action.write_hostfile, Action.set_cluster_state):
            self._apply_cluster(session, cluster, d)
            return
        row = next((k for k in cluster.containers if k.name == d.container), None)
        if d.action == Action.finalize_delete:
            self.backend.delete_cluster(cluster.name, cluster.uid)
            session.execute(delete(Job).where(Job.cluster_id == cluster.id))
            session.delete(cluster)
            add_event(session, ACTOR, EventAction.cluster_deleted, d.cluster, cluster.owner_id)
        elif d.action == Action.add:
            assert d.role is not None
            row = Container(
                cluster=cluster,
                name=d.container,
                role=d.role,
                address=d.address,
                gpus=len(d.gpu_ids),
                gpu_ids=",".join(map(str, d.gpu_ids)),
                state=ContainerState.Pending,
            )
            session.add(row)
            cluster.next_index = max(cluster.next_index or 0, worker_index(d.container) + 1)
            add_event(
                session,
                ACTOR,
                EventAction.container_created,
                d.cluster,
                cluster.owner_id,
                container=d.container,
                address=d.address,
                gpus=list(d.gpu_ids),
            )
            # the row exists before the process (a crash in between is adopted), and nothing is written
            # while the backend starts it: SQLite's one write lock is free for the API meanwhile
            session.commit()
            self._start(session, cluster, row)
        elif row is None:
            return
        elif d.action == Action.start:
            self._start(session, cluster, row)
        elif d.action == Action.mark_running:
            adopted = row.pid != d.pid  # started by an earlier server process
            row.state, row.pid, row.reason = ContainerState.Running, d.pid, ""
            row.started_at = row.started_at or utcnow()
            add_event(
                session,
                ACTOR,
                EventAction.container_running,
                d.cluster,
                cluster.owner_id,
                container=row.name,
                pid=d.pid,
                adopted=adopted,
            )
        elif d.action == Action.mark_paused:
            row.state, row.reason = ContainerState.Paused, PAUSED_REASON
            add_event(
                session, ACTOR, EventAction.container_paused, d.cluster, cluster.owner_id, container=row.name
            )
        elif d.action == Action.mark_failed:
            row.state, row.reason = ContainerState.Failed, d.reason
            add_event(
                session,
                ACTOR,
                EventAction.container_failed,
                d.cluster,
                cluster.owner_id,
                container=row.name,
                reason=d.reason,
            )
        elif d.action == Action.begin_terminate:
            row.state, row.terminating_since = ContainerState.Terminating, utcnow()
            add_event(
                session,
                ACTOR,
                EventAction.container_terminating,
                d.cluster,
                cluster.owner_id,
                container=row.name,
            )
        elif d.action == Action.remove:
            self.backend.delete_container(cluster.name, row.name, cluster.uid)
            session.delete(row)
            detail = {"container": row.name, **({"reason": d.reason} if d.reason else {})}
            add_event(session, ACTOR, EventAction.container_removed, d.cluster, cluster.owner_id, **detail)

    def _start(self, session: Session, cluster: Cluster, row: Container) -> None:
        """Start the container; a backend that refuses (podman failing, image gone) or a mount source that
        a link now redirects fails the row with its message instead of failing every later pass, and
        the cluster's next start waits (`StartBackoff`: doubling, at most 5 minutes); meanwhile the
        row stays Pending with the reason."""
        waiting = self.start_backoff.waiting(cluster.uid)
        if waiting is not None:
            reason = f"waiting before it starts again (backoff); the last start was refused: {waiting[1]}"
            if math.isinf(waiting[0]):
                reason = f"not started: the server gave up after repeated refusals; the last: {waiting[1]}"
            if row.reason != reason:
                row.reason = reason
            return
        try:
            spec = container_spec(cluster, row, self.inventory.real)
            for mount in spec.mounts:
                check_mount_unchanged(mount)
            owner_uid = None if self.backend.translates_paths else spec.tenant_uid
            check_stored_mounts(
                cluster.mounts, owner_uid, cluster.owner.is_admin
            )  # areas: the server's alone
            row.pid = self.backend.create_container(spec).pid
            self.start_backoff.started(cluster.uid)
        except ElastrainError as exc:
            count, delay = self.start_backoff.refused(cluster.uid, str(exc), cluster.name)
            log.warning("cannot start container %s/%s (%d in a row): %s", cluster.name, row.name, count, exc)
            row.state = ContainerState.Failed
            then = (
                "gave up: scale the cluster to try again" if math.isinf(delay) else f"next try in {delay:g} s"
            )
            row.reason = f"the backend could not start it ({count} in a row; {then}): {exc}"
            add_event(
                session,
                ACTOR,
                EventAction.container_failed,
                cluster.name,
                cluster.owner_id,
                container=row.name,
                reason=row.reason,
            )

    def _apply_cluster(self, session: Session, cluster: Cluster, d: Decision) -> None:
        if d.action == Action.write_hostfile:
            cluster.hostfile_generation, cluster.hostfile_text = d.generation, hosts_text(d.hosts)
            text = render_hostfile(Hostfile(d.hosts, d.generation))
            self.backend.write_cluster_file(cluster.name, HOSTFILE_PATH, text)
            add_event(
                session,
                ACTOR,
                EventAction.hostfile_written,
                d.cluster,
                cluster.owner_id,
                generation=d.generation,
                hosts=[f"{h.name}:{h.slots}" for h in d.hosts],
            )
        elif d.action == Action.set_cluster_state:
            assert d.state is not None
            before = cluster.state
            # conditional: a delete committed by the API since this pass read the row must win
            result = session.execute(
                update(Cluster)
                .where(Cluster.id == cluster.id, Cluster.state != ClusterState.Terminating)
                .values(state=d.state, reason=d.reason)
            )
            if getattr(result, "rowcount", 0) and before != d.state:
                add_event(
                    session,
                    ACTOR,
                    EventAction.of_cluster_state(d.state),
                    d.cluster,
                    cluster.owner_id,
                    reason=d.reason,
                )
