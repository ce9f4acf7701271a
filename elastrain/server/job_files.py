"""A job's files and records: its log and exit-code paths, private files, the API view of its row, the
refusals of a job in a cluster being deleted, and the progress lines scraped from its log."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from elastrain.db.models import Cluster, ClusterState, Job
from elastrain.server import schemas
from elastrain.server.errors import Conflict
from elastrain.server.reconciler import aware

PROGRESS = re.compile(
    r"epoch (?P<epoch>\d+) done: world (?P<world_size>\d+), step (?P<step>\d+), loss (?P<loss>[-\d.eE+]+)"
    r"|generation \d+ formed: (?P<generation_world>\d+) workers"  # `elastrain run -v`
)
FIELDS = ("step", "epoch", "loss", "samples_per_s", "world_size")


def check_not_terminating(cluster: Cluster) -> None:
    """Refuse (409) a new job in a cluster being deleted: its row goes away with the cluster."""
    if cluster.state == ClusterState.Terminating:
        raise Conflict(f"cluster {cluster.name!r} is being deleted")


def recheck_not_terminating(session: Session, cluster: Cluster) -> None:
    """After the job row is written (the write lock held on SQLite; the cluster row key-share locked on
    PostgreSQL): refuse it if the cluster was deleted, or marked for deletion, since it was read."""
    state = session.scalar(select(Cluster.state).where(Cluster.id == cluster.id))
    if state is None or state == ClusterState.Terminating:
        raise Conflict(f"cluster {cluster.name!r} is being deleted")


def log_path_of(job_id: int) -> str:
    """The job's log, a path in the launcher container."""
    return f"/var/log/jobs/{job_id}.log"  # in the launcher container


def exit_path(job_id: int) -> str:
    """The file its exit code is written to, a path in the launcher container."""
    return f"/var/log/jobs/{job_id}.exit"


def create_private_file(path: Path, data: bytes, owner_uid: int | None) -> None:
    """Create `path` afresh, 0600 (never through a link a tenant planted there), owned by `owner_uid` if
    given (the tenant whose job writes it; nobody else reads it)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, data)
        if owner_uid is not None:
            try:
                os.fchown(fd, owner_uid, owner_uid)
            except PermissionError:
                pass
    finally:
        os.close(fd)


def job_out(job: Job, cluster: str) -> schemas.JobOut:
    """The API view of a job row."""
    return schemas.JobOut(
        id=job.id,
        cluster=cluster,
        command=json.loads(job.command),
        status=job.status,
        pid=job.pid,
        exit_code=job.exit_code,
        step=job.step,
        epoch=job.epoch,
        loss=job.loss,
        samples_per_s=job.samples_per_s,
        world_size=job.world_size,
        tensorboard_dir=job.tensorboard_dir,
        platform_restarts=job.platform_restarts or 0,
        max_platform_restarts=job.max_platform_restarts if job.max_platform_restarts is not None else 3,
        user_restarts=job.user_restarts or 0,
        max_user_restarts=job.max_user_restarts or 0,
        created_at=aware(job.created_at) or job.created_at,
        finished_at=aware(job.finished_at),
    )


def progress_values(text: str) -> dict[str, object]:
    """The latest step/epoch/loss/world_size the progress lines of `text` show (see `PROGRESS`)."""
    values: dict[str, object] = {}
    for match in PROGRESS.finditer(text):
        found = {k: v for k, v in match.groupdict().items() if v is not None}
        if "generation_world" in found:
            found = {"world_size": found["generation_world"]}
        values.update({k: (float(v) if k == "loss" else int(v)) for k, v in found.items()})
    return values
