"""The running-jobs bound of a user (``--max-running-jobs``, `elastrain.server.tenant_limits`)."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from elastrain.db.models import Job, JobStatus, User
from elastrain.server.errors import TooMany
from elastrain.server.quotas import lock_owner


def check_running_jobs(session: Session, user: User, limit: int) -> None:
    """Refuse (429) a new job of `user` who has `limit` Running already; holds the user's lock until
    the transaction ends, so concurrent submits cannot both pass."""
    lock_owner(session, user.id)
    running = session.scalar(
        select(func.count()).select_from(Job).where(Job.owner_id == user.id, Job.status == JobStatus.Running)
    )
    if (running or 0) >= limit:
        raise TooMany(
            f"user {user.name} has {running} jobs running, the most allowed at once (--max-running-jobs); "
            "wait for one to end or cancel one"
        )
