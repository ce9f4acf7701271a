"""Queries and small write helpers over the models; services and the reconciler use these."""

from __future__ import annotations

import hashlib
import json
import secrets
from datetime import datetime, timezone

from sqlalchemy import select
from sqlalchemy.orm import Session, joinedload, selectinload

from elastrain.db.models import ApiToken, Cluster, Container, Event, EventAction, Job, User, utcnow


def hash_token(token: str) -> str:
    """SHA-256 hex digest of a token (only the hash is stored)."""
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    """A fresh random bearer token."""
    return "et_" + secrets.token_urlsafe(32)


def issue_token(
    session: Session, user: User, name: str = "initial", expires_at: datetime | None = None
) -> str:
    """Create a token for `user` (named `name`, valid until `expires_at`, None: never), store its
    hash, return the token itself (shown once)."""
    token = new_token()
    session.add(ApiToken(user=user, token_hash=hash_token(token), name=name, expires_at=expires_at))
    return token


def create_user(
    session: Session, name: str, is_admin: bool = False, expires_at: datetime | None = None
) -> tuple[User, str]:
    """Create a user with one token (valid until `expires_at`, None: never); returns (user, token)."""
    user = User(name=name, is_admin=is_admin)
    session.add(user)
    token = issue_token(session, user, expires_at=expires_at)
    session.flush()
    return user, token


def user_by_name(session: Session, name: str) -> User | None:
    """The user called `name`, if any."""
    return session.scalar(select(User).where(User.name == name))


def token_row(session: Session, token: str) -> ApiToken | None:
    """The stored row of a bearer token (whatever its state), if any."""
    query = select(ApiToken).options(joinedload(ApiToken.user))  # every request reads the user next
    return session.scalar(query.where(ApiToken.token_hash == hash_token(token)))


def user_by_token(session: Session, token: str) -> User | None:
    """The user a bearer token belongs to, if any and the token is neither revoked nor expired."""
    row = token_row(session, token)
    if row is None or row.revoked_at is not None:
        return None
    expires = row.expires_at
    if expires is not None and expires.replace(tzinfo=expires.tzinfo or timezone.utc) <= utcnow():
        return None
    return row.user


def add_event(
    session: Session,
    actor: str,
    action: EventAction,
    cluster: str = "",
    owner_id: int | None = None,
    **detail: object,
) -> None:
    """Append an audit event, keyed by the uid and owner of the cluster called `cluster` now (names
    are reused after a delete); an event of a cluster belongs to its owner's trail, whoever acted."""
    stored = EventAction(action).value  # a stray string that is no action is refused (ValueError)
    row = _cluster_now(session, cluster)
    session.add(
        Event(
            actor=actor,
            action=stored,
            cluster=cluster,
            cluster_uid=row.uid if row is not None else "",
            owner_id=row.owner_id if row is not None else owner_id,
            detail=json.dumps(detail, default=str),
        )
    )


def _cluster_now(session: Session, name: str) -> Cluster | None:
    """The cluster `name` as this session sees it: one it is adding, or the stored row (a pending
    delete is not flushed first, so a ``cluster.deleted`` event still finds its cluster)."""
    if not name:
        return None
    for obj in session.new:
        if isinstance(obj, Cluster) and obj.name == name:
            return obj
    with session.no_autoflush:
        return session.scalar(select(Cluster).where(Cluster.name == name))


def visible_clusters(session: Session, user: User) -> list[Cluster]:
    """Clusters `user` may see: their own (admins see every cluster)."""
    query = select(Cluster).options(selectinload(Cluster.containers), joinedload(Cluster.owner))
    query = query.order_by(Cluster.id)
    if not user.is_admin:
        query = query.where(Cluster.owner_id == user.id)
    return list(session.scalars(query))


def find_cluster(session: Session, user: User, name: str) -> Cluster | None:
    """The cluster `name` if `user` may see it, else None (the API answers 404 either way)."""
    # the API view reads the containers and the owner's name: loaded here, not one query each later
    query = select(Cluster).options(selectinload(Cluster.containers), joinedload(Cluster.owner))
    cluster = session.scalar(query.where(Cluster.name == name))
    if cluster is None or (cluster.owner_id != user.id and not user.is_admin):
        return None
    return cluster


def cluster_by_name(session: Session, name: str) -> Cluster | None:
    """The cluster `name`, whoever owns it."""
    return session.scalar(select(Cluster).where(Cluster.name == name))


def all_clusters(session: Session) -> list[Cluster]:
    """Every cluster with its containers (the reconciler's view)."""
    query = select(Cluster).options(selectinload(Cluster.containers)).order_by(Cluster.id)
    return list(session.scalars(query))


def events_for(session: Session, cluster: Cluster | str, limit: int = 100) -> list[Event]:
    """The newest audit events of a cluster (a row, or the name of an existing one), oldest first.

    Keyed by the cluster's uid and owner, never by name alone: a cluster created under a name another
    tenant used before sees none of the older cluster's events.
    """
    row = cluster_by_name(session, cluster) if isinstance(cluster, str) else cluster
    if row is None:
        return []
    query = (
        select(Event)
        .where(Event.cluster_uid == row.uid, Event.owner_id == row.owner_id)
        .order_by(Event.id.desc())
        .limit(limit)
    )
    return list(reversed(list(session.scalars(query))))


def all_containers(session: Session) -> list[Container]:
    """Every container row."""
    return list(session.scalars(select(Container)))


def visible_jobs(session: Session, user: User, cluster: Cluster | None = None) -> list[Job]:
    """Jobs `user` may see, optionally of one cluster."""
    query = select(Job).order_by(Job.id)
    if not user.is_admin:
        query = query.where(Job.owner_id == user.id)
    if cluster is not None:
        query = query.where(Job.cluster_id == cluster.id)
    return list(session.scalars(query))
