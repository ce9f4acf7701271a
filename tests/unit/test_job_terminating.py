"""Jobs and cluster deletion: no job starts in a cluster being deleted, and the delete never fails on a
job row (the race the contract test found: a submit inserting while the reconciler removed the cluster)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import delete, select

from elastrain.db.models import Cluster, ClusterState, Framework, Job, JobStatus, User
from elastrain.db.repository import all_clusters, create_user
from elastrain.db.session import Database
from elastrain.server import exec_service as exec_module
from elastrain.server.errors import Conflict
from elastrain.server.inventory import Inventory
from elastrain.server.jobs import JobService
from elastrain.server.reconciler import Reconciler
from elastrain.server.schemas import JobSubmit
from tests.unit.test_server_reconciler import FakeBackend, settle


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = Database(f"sqlite:///{tmp_path / 'db.sqlite'}")
    database.migrate()
    with database.session() as session:
        user, _token = create_user(session, "alice")
        cluster = Cluster(name="c", uid="u1", owner_id=user.id, framework=Framework.horovod)
        cluster.desired_containers, cluster.gpus_per_container = 2, 0
        session.add(cluster)
    yield database
    database.dispose()


@pytest.fixture
def backend(db: Database) -> FakeBackend:
    """The cluster's containers Running (its launcher among them)."""
    fake = FakeBackend()
    settle(Reconciler(db, fake, Inventory(8, False)))
    return fake


def _alice(db: Database) -> User:
    with db.session() as session:
        user = session.scalars(select(User).where(User.name == "alice")).one()
        session.expunge(user)
        return user


def _mark_terminating(db: Database) -> None:
    with db.session() as session:
        all_clusters(session)[0].state = ClusterState.Terminating


def _jobs(db: Database) -> list[Job]:
    with db.session() as session:
        return list(session.scalars(select(Job)))


def test_submit_to_a_terminating_cluster_is_a_conflict(db: Database, backend: FakeBackend) -> None:
    _mark_terminating(db)
    service = JobService(db, backend, Inventory(8, False))
    with pytest.raises(Conflict, match="is being deleted"):
        service.submit(_alice(db), "c", JobSubmit(command=["echo", "hi"]))
    assert _jobs(db) == []


@pytest.mark.parametrize("what", ["marked", "deleted"])
def test_a_delete_racing_a_submit_is_a_conflict(
    db: Database, backend: FakeBackend, monkeypatch: pytest.MonkeyPatch, what: str
) -> None:
    real_spec = exec_module.container_spec

    def delete_meanwhile(*args: object, **kwargs: object) -> object:  # after the read, before the insert
        if what == "marked":
            _mark_terminating(db)
        else:
            with db.session() as session:
                session.execute(delete(Cluster))
        return real_spec(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(exec_module, "container_spec", delete_meanwhile)
    service = JobService(db, backend, Inventory(8, False))
    with pytest.raises(Conflict, match="is being deleted"):
        service.submit(_alice(db), "c", JobSubmit(command=["echo", "hi"]))
    assert _jobs(db) == []


def test_the_final_delete_removes_a_job_row_it_finds(db: Database, backend: FakeBackend) -> None:
    with db.session() as session:
        cluster = all_clusters(session)[0]
        session.add(
            Job(cluster_id=cluster.id, owner_id=cluster.owner_id, command="[]", status=JobStatus.Running)
        )
    _mark_terminating(db)
    settle(Reconciler(db, backend, Inventory(8, False)))
    with db.session() as session:
        assert all_clusters(session) == []
    assert _jobs(db) == [] and backend.containers == {}
