"""Per-user quotas: clusters, containers (summed over the user's clusters) and GPUs (containers x
gpus_per_container). A limit stored on the user row overrides the server default; admins are exempt.

An elastic cluster counts at its ``max_containers`` (the scheduler may grow it that far), a cluster
being deleted counts until it is gone. A request that would take a user past a limit is refused
(403) before anything is written; shrinking is always allowed, even above a lowered limit.

A check and the write it allows are one transaction that holds the owner's lock (`lock_owner`): of
concurrent requests of one user, each counts what the ones before it committed (no race past a limit).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from elastrain.db.models import Cluster, User
from elastrain.server.errors import Forbidden

# Defaults for a user without their own limit (None: unlimited); a server's settings
# (`--quota-clusters/--quota-containers/--quota-gpus`) give its own, passed to every check as `defaults`.
DEFAULT_MAX_CLUSTERS: int | None = 20
DEFAULT_MAX_CONTAINERS: int | None = 64
DEFAULT_MAX_GPUS: int | None = None
KINDS = ("clusters", "containers", "gpus")


@dataclass(frozen=True)
class Usage:
    """What some clusters hold (or a request adds): clusters, containers, GPUs."""

    clusters: int = 0
    containers: int = 0
    gpus: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.clusters + other.clusters, self.containers + other.containers, self.gpus + other.gpus
        )

    def __sub__(self, other: Usage) -> Usage:
        return Usage(
            self.clusters - other.clusters, self.containers - other.containers, self.gpus - other.gpus
        )


@dataclass(frozen=True)
class Limits:
    """A user's limits; None: unlimited."""

    clusters: int | None = None
    containers: int | None = None
    gpus: int | None = None


def server_defaults() -> Limits:
    """The limits of a user without their own where the server's settings give none: the constants."""
    return Limits(DEFAULT_MAX_CLUSTERS, DEFAULT_MAX_CONTAINERS, DEFAULT_MAX_GPUS)


def overrides(user: User) -> Limits:
    """The limits stored on the user row (None: the server default)."""
    return Limits(user.quota_clusters, user.quota_containers, user.quota_gpus)


def effective(user: User, defaults: Limits | None = None) -> Limits:
    """The user's limits: their own where set, else the server default."""
    base = defaults or server_defaults()
    own = overrides(user)
    return Limits(*(getattr(own, k) if getattr(own, k) is not None else getattr(base, k) for k in KINDS))


def footprint(containers: int, max_containers: int | None, gpus_per_container: int) -> Usage:
    """What one cluster holds: itself, its containers (an elastic one at its upper bound), their GPUs."""
    held = max(containers, max_containers or 0)
    return Usage(1, held, held * gpus_per_container)


def cluster_footprint(cluster: Cluster) -> Usage:
    """`footprint` of a cluster row."""
    return footprint(cluster.desired_containers, cluster.max_containers, cluster.gpus_per_container or 0)


def usage_of(session: Session, owner_id: int) -> Usage:
    """What the clusters of user `owner_id` hold now (clusters being deleted included)."""
    rows = session.scalars(select(Cluster).where(Cluster.owner_id == owner_id))
    total = Usage()
    for cluster in rows:
        total += cluster_footprint(cluster)
    return total


def refusal(owner: str, limits: Limits, usage: Usage, adding: Usage) -> str | None:
    """Why adding `adding` to `usage` breaks one of `limits` (one line naming the limit, the usage and
    who can raise it), or None when it fits. Parts that do not grow are never refused."""
    for kind in KINDS:
        limit, used, more = getattr(limits, kind), getattr(usage, kind), getattr(adding, kind)
        if limit is None or more <= 0 or used + more <= limit:
            continue
        return (
            f"quota exceeded: user {owner} may hold at most {limit} {kind} and holds {used}, this "
            f"request needs {more} more; free some, or ask an admin to raise it "
            f"(elastrain user quota {owner} --{kind} N)"
        )
    return None


def lock_owner(session: Session, owner_id: int) -> None:
    """Serialize the quota-checked writes of user `owner_id` until this transaction ends: a no-op
    UPDATE of their row takes SQLite's write lock (a plain SELECT takes none, so two requests could
    both count before either wrote) and the row's lock on PostgreSQL. Call it before anything that
    counts; reads after it see every write committed before it."""
    session.execute(
        update(User)
        .where(User.id == owner_id)
        .values(quota_clusters=User.quota_clusters)
        .execution_options(synchronize_session=False)
    )


def _owner_locked(session: Session, owner_id: int) -> User:
    """The owner row, locked until commit (`lock_owner`; concurrent requests of one owner queue)."""
    lock_owner(session, owner_id)
    owner = session.get(User, owner_id, with_for_update=True, populate_existing=True)
    if owner is None:
        raise Forbidden("the cluster's owner no longer exists")
    return owner


def check_create(
    session: Session,
    actor: User,
    containers: int,
    max_containers: int | None,
    gpus_per_container: int,
    defaults: Limits | None = None,
) -> None:
    """Refuse (403) a new cluster of `actor` that takes them past a quota (their own, else `defaults`);
    admins are exempt."""
    if actor.is_admin:
        return
    owner = _owner_locked(session, actor.id)
    adding = footprint(containers, max_containers, gpus_per_container)
    message = refusal(owner.name, effective(owner, defaults), usage_of(session, owner.id), adding)
    if message is not None:
        raise Forbidden(message)


def check_scale(
    session: Session, actor: User, cluster: Cluster, containers: int, defaults: Limits | None = None
) -> None:
    """Refuse (403) scaling `cluster` to `containers` when it takes its owner past a quota (an admin
    acting, or an admin owner, is exempt; shrinking always passes)."""
    if actor.is_admin:
        return
    owner = _owner_locked(session, cluster.owner_id)
    if owner.is_admin:
        return
    before = cluster_footprint(cluster)
    after = footprint(containers, cluster.max_containers, cluster.gpus_per_container or 0)
    message = refusal(owner.name, effective(owner, defaults), usage_of(session, owner.id), after - before)
    if message is not None:
        raise Forbidden(message)
