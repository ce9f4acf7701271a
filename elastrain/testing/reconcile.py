"""Driving the reconcile loop in tests: a database holding one tenant's cluster, and running passes
until nothing is left to do."""

from __future__ import annotations

from pathlib import Path

from elastrain.db.models import Cluster, Framework
from elastrain.db.repository import all_clusters, create_user
from elastrain.db.session import Database
from elastrain.server.reconciler import Reconciler


def alice_cluster_db(directory: Path) -> Database:
    """A migrated SQLite database in `directory` with Alice's 3-container cluster `c` (one GPU each),
    not yet reconciled."""
    database = Database(f"sqlite:///{directory / 'db.sqlite'}")
    database.migrate()
    with database.session() as session:
        user, _token = create_user(session, "alice")
        cluster = Cluster(name="c", uid="u1", owner_id=user.id, framework=Framework.horovod)
        cluster.desired_containers, cluster.gpus_per_container = 3, 1
        session.add(cluster)
    return database


def settle(reconciler: Reconciler, limit: int = 10) -> int:
    """Run reconcile passes until one changes nothing; returns how many changed something."""
    for passes in range(limit):
        if reconciler.reconcile_once() == 0:
            return passes
    raise AssertionError(f"the reconciler did not settle in {limit} passes")


def clusters(database: Database) -> list[Cluster]:
    """Every cluster in the database."""
    with database.session() as session:
        return all_clusters(session)
