"""Ids are never handed out twice: after a cluster and its jobs are deleted, the next cluster, job and
event get new ids (SQLite would give max(id) + 1 again), on SQLite and PostgreSQL; and a database
migrated to 0010 starts its jobs above the ids its events still name."""

from __future__ import annotations

import secrets

from sqlalchemy import delete, select, text

from elastrain.db.models import Cluster, Event, EventAction, Framework, Job, User
from elastrain.db.repository import add_event
from elastrain.db.session import Database
from tests.unit.test_migrations import _alembic, database  # noqa: F401  (the fixture, both databases)


def new_cluster_with_a_job(db: Database, name: str) -> tuple[int, int, int]:
    """A cluster with one job and one event: their ids."""
    with db.session() as s:
        user = s.scalar(select(User).where(User.name == "ann"))
        if user is None:
            user = User(name="ann")
            s.add(user)
            s.flush()
        cluster = Cluster(
            name=name,
            uid=secrets.token_hex(8),
            owner_id=user.id,
            framework=Framework.horovod,
            desired_containers=1,
        )
        s.add(cluster)
        s.flush()
        job = Job(cluster_id=cluster.id, owner_id=user.id, command="[]")
        s.add(job)
        s.flush()
        add_event(s, "test", EventAction.job_submitted, name, job=job.id)
        s.flush()
        event = s.scalar(select(Event).order_by(Event.id.desc()))
        assert event is not None
        return cluster.id, job.id, event.id


def delete_everything(db: Database) -> None:
    with db.session() as s:
        s.execute(delete(Event))
        s.execute(delete(Job))
        s.execute(delete(Cluster))


def test_a_deleted_clusters_ids_are_not_given_to_the_next_one(database: Database) -> None:  # noqa: F811
    database.migrate()
    first = new_cluster_with_a_job(database, "one")
    delete_everything(database)  # the newest rows of all three tables are gone
    second = new_cluster_with_a_job(database, "two")
    assert all(b > a for a, b in zip(first, second, strict=True)), (first, second)


def test_0010_starts_jobs_above_the_ids_old_events_name(database: Database) -> None:  # noqa: F811
    if database.url.startswith("postgresql"):
        database.migrate()  # its sequences never went back: nothing to seed
        return
    _alembic(database, "upgrade", "0007")
    with database.engine.begin() as conn:  # job 7 was deleted with its cluster; its events remain
        conn.execute(
            text(
                "INSERT INTO events (at, actor, action, cluster, cluster_uid, detail) VALUES "
                "('2026-01-01 00:00:00', 'x', 'job.submitted', 'gone', '', '{\"job\": 7}')"
            )
        )
    database.migrate()
    _, job_id, _ = new_cluster_with_a_job(database, "new")
    assert job_id == 8
