"""The reconcile loop against a fake backend and a real (SQLite) database with the Alembic schema."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from elastrain.backends.fake import FakeBackend
from elastrain.db.models import Cluster, ClusterState, ContainerState, Framework, Job, JobStatus, User
from elastrain.db.repository import all_clusters, events_for
from elastrain.db.session import Database
from elastrain.server.inventory import Inventory
from elastrain.server.reconciler import Reconciler
from elastrain.server.scheduler_step import ClusterScheduler
from elastrain.testing.reconcile import alice_cluster_db, clusters, settle


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    """Alice's 3-container cluster `c` (one GPU each), not yet reconciled."""
    database = alice_cluster_db(tmp_path)
    database.migrate()  # idempotent
    yield database
    database.dispose()


def test_converges_then_is_idempotent(db: Database) -> None:
    backend = FakeBackend()
    r = Reconciler(db, backend, Inventory(8, False))
    settle(r)
    (c,) = clusters(db)
    assert c.state == ClusterState.Running and [k.state for k in c.containers] == [ContainerState.Running] * 3
    assert backend.files["c"]["/etc/mpi/hostfile"].splitlines()[1:] == [
        f"{k.address} slots=1" for k in c.containers
    ]
    assert r.reconcile_once() == 0 and backend.creates == 3


def test_restarted_reconciler_adopts_without_duplicates(db: Database) -> None:
    backend = FakeBackend()
    settle(Reconciler(db, backend, Inventory(8, False)))
    before = dict(backend.containers)
    settle(Reconciler(db, backend, Inventory(8, False)))  # a new server process, same backend state
    assert backend.containers == before and backend.creates == 3


def test_delete_requested_during_a_pass_is_not_overwritten(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    import elastrain.server.reconciler as module

    backend = FakeBackend()
    r = Reconciler(db, backend, Inventory(8, False))
    real_plan = module.plan

    def plan_then_delete(*args: object, **kwargs: object) -> list:  # the API deletes mid-pass
        decisions = real_plan(*args, **kwargs)  # type: ignore[arg-type]
        with db.session() as session:
            all_clusters(session)[0].state = ClusterState.Terminating
        return decisions

    monkeypatch.setattr(module, "plan", plan_then_delete)
    r.reconcile_once()  # the first pass adds containers and sets the cluster's state and reason
    monkeypatch.setattr(module, "plan", real_plan)
    assert clusters(db)[0].state == ClusterState.Terminating
    settle(r)
    assert clusters(db) == [] and backend.containers == {}


def _elastic(db: Database, name: str, desired: int, low: int, high: int) -> None:
    with db.session() as session:
        owner = session.scalars(select(User)).first()
        assert owner is not None
        cluster = Cluster(name=name, uid=f"u-{name}", owner_id=owner.id, framework=Framework.horovod)
        cluster.desired_containers, cluster.gpus_per_container = desired, 1
        cluster.min_containers, cluster.max_containers, cluster.admitted = low, high, False
        session.add(cluster)


def _running_job(db: Database, cluster: str, command: str) -> None:
    with db.session() as session:
        row = next(c for c in all_clusters(session) if c.name == cluster)
        session.add(
            Job(
                cluster_id=row.id,
                owner_id=row.owner_id,
                command=json.dumps(command.split()),
                status=JobStatus.Running,
            )
        )


def test_elastic_scheduler_grows_then_shrinks_for_a_newcomer(db: Database) -> None:
    with db.session() as session:
        session.delete(all_clusters(session)[0])
    _elastic(db, "a", 2, 2, 4)
    backend = FakeBackend()
    r = Reconciler(db, backend, Inventory(4, False), drain_s=0, scheduler=ClusterScheduler("elastic"))
    settle(r)
    (a,) = clusters(db)
    assert (a.desired_containers, a.admitted, len(a.containers)) == (2, True, 2)  # idle: never grows
    _running_job(db, "a", "elastrain run --min-np 2 --max-np 4 python train.py")
    settle(r)
    (a,) = clusters(db)
    assert (a.desired_containers, len(a.containers)) == (4, 4)  # its job can use 4: grown into them
    assert "grown into 2 idle GPUs" in a.size_reason
    _elastic(db, "b", 2, 2, 2)
    settle(r)
    a, b = clusters(db)
    shrunk = "shrunk for cluster b (priority 0)"
    assert (a.desired_containers, a.size_reason, len(a.containers)) == (2, shrunk, 2)
    assert b.state == ClusterState.Running and len(b.containers) == 2
    used = [g for c in (a, b) for k in c.containers for g in k.gpu_ids.split(",")]
    assert sorted(used) == ["0", "1", "2", "3"]  # no GPU double-booked
    with db.session() as session:
        actions = [e.action for e in events_for(session, "a") if e.actor == "scheduler"]
    assert actions == ["cluster.admitted", "cluster.rescheduled", "cluster.rescheduled"]


def test_without_a_scheduler_queued_clusters_are_admitted(db: Database) -> None:
    _elastic(db, "q", 2, 2, 4)
    settle(Reconciler(db, FakeBackend(), Inventory(8, False)))
    _c, q = clusters(db)
    assert q.admitted and q.desired_containers == 2 and q.state == ClusterState.Running


def test_a_failing_hook_does_not_stop_the_pass(db: Database) -> None:
    r = Reconciler(db, FakeBackend(), Inventory(8, False))
    ran: list[str] = []

    def broken() -> int:
        raise ValueError("job monitor broke")

    r.hooks += [broken, lambda: ran.append("second") or 0]
    settle(r)
    assert ran and clusters(db)[0].state == ClusterState.Running


def test_a_hostfile_changed_behind_the_loops_back_is_restored_on_the_next_recheck(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fast passes trust the hostfile they last wrote; every HOSTFILE_RECHECK_S they read it back."""
    import elastrain.server.hostfile_sync as module

    backend = FakeBackend()
    r = Reconciler(db, backend, Inventory(8, False))
    settle(r)
    good = backend.files["c"]["/etc/mpi/hostfile"]
    backend.files["c"]["/etc/mpi/hostfile"] = "# tampered\n"
    monkeypatch.setattr(module, "HOSTFILE_RECHECK_S", 3600.0)
    r.hostfiles.checked_at = 0.0  # a recheck ran just now (monotonic time is far past 0)
    monkeypatch.setattr(module.time, "monotonic", lambda: 1.0)
    r.reconcile_once()
    assert backend.files["c"]["/etc/mpi/hostfile"] == "# tampered\n"  # trusted between rechecks
    monkeypatch.setattr(module.time, "monotonic", lambda: 3602.0)
    r.reconcile_once()
    assert backend.files["c"]["/etc/mpi/hostfile"] == good


def test_the_busy_poll_backs_off_after_a_second(db: Database) -> None:
    import elastrain.server.reconciler as module

    r = Reconciler(db, FakeBackend(), Inventory(8, False), interval_s=0.5)
    assert r._poll_interval(100.0) == 0.5  # idle
    r._busy = True
    assert r._poll_interval(100.0) == 0.1 and r._poll_interval(100.9) == 0.1
    assert r._poll_interval(101.1) == module.BUSY_POLL_S
    r._busy = False
    assert r._poll_interval(102.0) == 0.5
    r._busy = True
    assert r._poll_interval(103.0) == 0.1  # a new busy streak starts fast again
