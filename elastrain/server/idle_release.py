"""Idle GPUs go back: a cluster with GPUs and no running job for ``idle_release_after`` seconds
(its own, else the server's ``--idle-release-after``; 0: never) releases its workers.

Its launcher stays, with its GPUs: JupyterLab, the terminal, the mounts and the launcher's files
live in that container, and a container's GPUs are fixed when it starts, so taking them away would
mean restarting it (and losing what runs there). The workers come back when a job starts in the
cluster (the elastic scheduler queues it for its workers; ``static`` restores its requested size)
or when it is scaled (`elastrain.server.services`). Runs once per reconcile pass, before the
scheduler.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from elastrain.db.models import Cluster, ClusterState, EventAction, Job, JobStatus
from elastrain.db.repository import add_event, all_clusters
from elastrain.db.session import Database
from elastrain.server.scheduling import fold_service

log = logging.getLogger("elastrain.idle_release")
ACTOR = "scheduler"
DEFAULT_IDLE_RELEASE_S = 600
CHECK_EVERY_S = 1.0
_ACTIVE = (JobStatus.Running, JobStatus.Pending)


def duration_words(seconds: float) -> str:
    """``600`` -> ``10 min``, ``90`` -> ``90 s``, ``7200`` -> ``2 h``."""
    s = int(seconds)
    if s >= 7200 and s % 3600 == 0:
        return f"{s // 3600} h"
    if s >= 120 and s % 60 == 0:
        return f"{s // 60} min"
    return f"{s} s"


def _utc(value: datetime | None) -> datetime | None:
    return value.replace(tzinfo=timezone.utc) if value is not None and value.tzinfo is None else value


class IdleRelease:
    """The idle-release step of a reconcile pass (module docstring). ``elastic``: a woken cluster is
    queued for its workers by the scheduler instead of getting its requested size back at once."""

    def __init__(self, default_s: float = DEFAULT_IDLE_RELEASE_S, elastic: bool = True) -> None:
        self.default_s = default_s
        self.elastic = elastic
        self._last: datetime | None = None

    def run(self, db: Database, now: datetime) -> int:
        """Release idle clusters' workers and wake released ones a job started in; returns how many
        clusters changed. Reads every cluster, so it runs at most every `CHECK_EVERY_S`."""
        if self._last is not None and (now - self._last).total_seconds() < CHECK_EVERY_S:
            return 0
        self._last = now
        changed = 0
        with db.session() as session:
            active = {
                cid for (cid,) in session.execute(select(Job.cluster_id).where(Job.status.in_(_ACTIVE)))
            }
            last_end = select(Job.cluster_id, func.max(Job.finished_at)).group_by(Job.cluster_id)
            ended = dict(session.execute(last_end).all())
            for cluster in all_clusters(session):
                if cluster.state == ClusterState.Terminating or cluster.gpus_per_container <= 0:
                    continue
                if cluster.idle_released and cluster.id in active:
                    self._wake(cluster, now)
                    changed += 1
                elif not cluster.idle_released and cluster.id not in active and cluster.admitted:
                    changed += self._maybe_release(session, cluster, _utc(ended.get(cluster.id)), now)
        return changed

    def _maybe_release(
        self, session: Session, cluster: Cluster, ended: datetime | None, now: datetime
    ) -> int:
        after = cluster.idle_release_after if cluster.idle_release_after is not None else self.default_s
        if after <= 0 or cluster.desired_containers <= 1:
            return 0
        marks = [_utc(cluster.created_at), _utc(cluster.active_at), ended]
        since = max(m for m in marks if m is not None)
        if (now - since).total_seconds() < after:
            return 0
        before = cluster.desired_containers
        reason = f"idle for {duration_words(after)}: workers released"
        fold_service(cluster, now)
        cluster.desired_containers, cluster.idle_released, cluster.size_reason = 1, True, reason
        add_event(
            session,
            ACTOR,
            EventAction.cluster_idle_released,
            cluster.name,
            cluster.owner_id,
            before=before,
            after=1,
            reason=f"{reason}; the launcher keeps its {cluster.gpus_per_container} GPU(s)",
        )
        log.info("cluster %s: %s", cluster.name, reason)
        return 1

    def _wake(self, cluster: Cluster, now: datetime) -> None:
        """A job started in a released cluster: its workers come back."""
        fold_service(cluster, now)
        cluster.idle_released, cluster.active_at = False, now
        if self.elastic:
            cluster.admitted, cluster.size_reason = False, "a job started: queued for its workers"
        else:
            cluster.desired_containers = max(cluster.requested_containers or 2, 2)
            cluster.size_reason = "a job started: workers back"
