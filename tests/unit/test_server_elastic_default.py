"""Elastic by default (issue 28): job ranges set a cluster's bounds, attained service survives a
restart, better-ranked clusters preempt, reported gradient statistics make a goodput, idle clusters
release their workers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from elastrain.backends.fake import FakeBackend
from elastrain.db.models import Cluster, ClusterState, ContainerRole, Event, Framework, Job, JobStatus, utcnow
from elastrain.db.repository import create_user
from elastrain.db.session import Database
from elastrain.scheduler.goodput import GoodputSpeed, GradParams, ReportedEfficiency
from elastrain.scheduler.registry import make_policy
from elastrain.server.cluster_demand import Report, effective_bounds, reported_efficiency
from elastrain.server.idle_release import IdleRelease, duration_words
from elastrain.server.inventory import Inventory
from elastrain.server.job_range import RankRange, rank_range
from elastrain.server.reconciler import Reconciler
from elastrain.server.scheduler_step import ClusterScheduler
from elastrain.server.scheduling import fold_service
from elastrain.server.settings import ServerSettings
from elastrain.testing.reconcile import clusters, settle


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = Database(f"sqlite:///{tmp_path / 'db.sqlite'}")
    database.migrate()
    with database.session() as session:
        create_user(session, "alice")
    yield database
    database.engine.dispose()


def add_cluster(db: Database, name: str, containers: int, priority: int = 0, **fields: object) -> None:
    with db.session() as session:
        c = Cluster(name=name, uid=f"u-{name}", owner_id=1, framework=Framework.horovod, priority=priority)
        c.desired_containers = c.requested_containers = containers
        c.gpus_per_container, c.admitted = 1, False
        for key, value in fields.items():
            setattr(c, key, value)
        session.add(c)


def run_job(db: Database, name: str, command: str, status: JobStatus = JobStatus.Running) -> None:
    with db.session() as session:
        c = session.scalars(select(Cluster).where(Cluster.name == name)).one()
        session.add(Job(cluster_id=c.id, owner_id=1, command=json.dumps(command.split()), status=status))


def actions(db: Database, name: str) -> list[str]:
    with db.session() as session:
        return [
            e.action for e in session.scalars(select(Event).where(Event.cluster == name).order_by(Event.id))
        ]


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (
            "elastrain run --min-np 1 --max-np 4 --hostfile /etc/mpi/hostfile python t.py -np 9",
            RankRange(1, 4),
        ),
        ("horovodrun -np 2 --min-np 1 --max-np 3 python t.py", RankRange(1, 3)),
        ("horovodrun -np 2 python t.py", RankRange(2, 2)),
        ("elastrain run -v --min-np=2 --max-np=6 python t.py", RankRange(2, 6)),
        ("python t.py --min-np 3", None),
    ],
)
def test_a_jobs_rank_range_comes_from_its_launcher_options(command: str, expected: RankRange | None) -> None:
    assert rank_range(command.split()) == expected


def test_a_clusters_bounds_follow_its_running_jobs_range_within_its_own(db: Database) -> None:
    add_cluster(db, "a", 4, min_containers=2, max_containers=6, gpus_per_container=2)
    (c,) = clusters(db)
    assert effective_bounds(c, []) == (2, 4)  # idle: never grows past the size asked for
    assert effective_bounds(c, [["elastrain", "run", "--min-np", "4", "--max-np", "16"]]) == (2, 6)
    assert effective_bounds(c, [["horovodrun", "-np", "6", "python"]]) == (3, 3)  # fixed: 6 ranks, 2 slots
    assert effective_bounds(c, [["python", "t.py"]]) == (4, 4)  # no rank count: kept as it is


def test_elastic_is_the_default_and_idle_release_defaults_to_600_s() -> None:
    settings = ServerSettings()
    assert (settings.scheduler, settings.idle_release_after) == ("elastic", 600)


def test_attained_service_is_persisted_and_ranks_after_a_restart(db: Database) -> None:
    """Two elastic clusters with elastic jobs share 8 GPUs; "old" came first but has had 10 GPU-hours
    (on its row, as a server before the restart left it): a newcomer's minimum comes from "old"."""
    for name in ("old", "new"):
        add_cluster(db, name, 4, min_containers=2, max_containers=4)
        run_job(db, name, "elastrain run --min-np 2 --max-np 4 python t.py")
    backend = FakeBackend()
    settle(Reconciler(db, backend, Inventory(8, False), drain_s=0, scheduler=ClusterScheduler()))
    assert [k.desired_containers for k in clusters(db)] == [4, 4]
    with db.session() as session:
        old = session.scalars(select(Cluster).where(Cluster.name == "old")).one()
        fold_service(old, utcnow())
        old.attained_gpu_s += 10 * 3600.0
    restarted = Reconciler(db, backend, Inventory(8, False), drain_s=0, scheduler=ClusterScheduler())
    add_cluster(db, "newcomer", 2, min_containers=2, max_containers=2)
    settle(restarted)
    old, new, newcomer = clusters(db)
    assert (old.desired_containers, new.desired_containers, newcomer.admitted) == (2, 4, True)
    assert old.size_reason == "shrunk for cluster newcomer (priority 0)"
    assert old.attained_gpu_s > 10 * 3600.0 and old.service_since is not None


def test_a_better_ranked_cluster_preempts_and_the_preempted_one_gives_back_every_container(
    db: Database,
) -> None:
    add_cluster(db, "low", 4, min_containers=4, max_containers=4)
    r = Reconciler(db, FakeBackend(), Inventory(4, False), drain_s=0, scheduler=ClusterScheduler())
    settle(r)
    add_cluster(db, "high", 2, priority=5, min_containers=2, max_containers=2)
    settle(r)
    low, high = clusters(db)
    assert (low.desired_containers, low.admitted, low.containers) == (0, False, [])
    assert low.state == ClusterState.Pending
    assert high.admitted and len(high.containers) == 2
    with db.session() as session:
        query = select(Event).where(Event.action == "cluster.preempted")
        (event,) = [json.loads(e.detail) for e in session.scalars(query)]
    assert (event["before"], event["reason"]) == (4, "preempted for cluster high (priority 5)")
    assert low.size_reason == "preempted for cluster high (priority 5); waiting for 4 GPUs (its minimum)"


def test_reported_gradient_statistics_make_the_speed_a_goodput() -> None:
    report = Report(4, 400.0, {"grad_sqr": 1.0, "grad_var": 4.0, "batch_size": 128.0})
    eff = reported_efficiency([report])
    assert eff == ReportedEfficiency(GradParams(1.0, 4.0), 32.0, 32.0)
    assert eff.efficiency(1) == pytest.approx(1.0) and eff.efficiency(8) < 0.5  # big batches: less per sample
    policy = make_policy("elastic")
    speed = policy.speed  # type: ignore[attr-defined]
    assert isinstance(speed, GoodputSpeed)
    from elastrain.scheduler.api import Job

    job = Job("j", 1, 8)
    plain = speed(job, 4, 1)
    speed.set_reported("j", eff)
    assert speed(job, 4, 1) == pytest.approx(plain * eff.efficiency(4))
    assert Report(2, None, {"batch_size": 64.0, "step_time_s": 0.5}).rate() == 128.0


def test_an_idle_cluster_releases_its_workers_and_a_job_brings_them_back(db: Database) -> None:
    add_cluster(db, "a", 4, idle_release_after=60)
    r = Reconciler(
        db, FakeBackend(), Inventory(4, False), drain_s=0, scheduler=ClusterScheduler(), idle=IdleRelease(600)
    )
    settle(r)
    (a,) = clusters(db)
    assert a.desired_containers == 4 and len(a.containers) == 4
    with db.session() as session:  # its last activity 2 minutes ago
        session.scalars(select(Cluster)).one().active_at = utcnow() - timedelta(minutes=2)
        session.scalars(select(Cluster)).one().created_at = utcnow() - timedelta(minutes=2)
    r.idle._last = None  # type: ignore[union-attr]
    settle(r)
    (a,) = clusters(db)
    assert (a.desired_containers, a.idle_released, a.size_reason) == (
        1,
        True,
        "idle for 60 s: workers released",
    )
    assert [k.role for k in a.containers] == [ContainerRole.launcher] and a.state == ClusterState.Running
    assert "cluster.idle_released" in actions(db, "a")
    run_job(db, "a", "elastrain run --min-np 2 --max-np 4 python t.py")
    r.idle._last = None  # type: ignore[union-attr]
    settle(r)
    (a,) = clusters(db)
    assert (a.desired_containers, a.idle_released, len(a.containers)) == (4, False, 4)


def test_a_static_server_releases_idle_workers_too_and_a_job_restores_the_requested_size(
    db: Database,
) -> None:
    add_cluster(db, "a", 3, admitted=True)
    r = Reconciler(db, FakeBackend(), Inventory(4, False), drain_s=0, idle=IdleRelease(30, elastic=False))
    settle(r)
    with db.session() as session:
        row = session.scalars(select(Cluster)).one()
        row.created_at = row.active_at = utcnow() - timedelta(seconds=31)
    r.idle._last = None  # type: ignore[union-attr]
    settle(r)
    (a,) = clusters(db)
    assert (a.desired_containers, a.size_reason) == (1, "idle for 30 s: workers released")
    run_job(db, "a", "python t.py")
    r.idle._last = None  # type: ignore[union-attr]
    settle(r)
    (a,) = clusters(db)
    assert (a.desired_containers, a.idle_released, len(a.containers)) == (3, False, 3)


def test_idle_release_off_and_words(db: Database) -> None:
    add_cluster(db, "a", 3, admitted=True, idle_release_after=0)  # 0: never, whatever the server says
    r = Reconciler(db, FakeBackend(), Inventory(4, False), drain_s=0, idle=IdleRelease(1, elastic=False))
    with db.session() as session:
        row = session.scalars(select(Cluster)).one()
        row.created_at = row.active_at = utcnow() - timedelta(hours=1)
    settle(r)
    assert clusters(db)[0].desired_containers == 3
    assert (duration_words(600), duration_words(90), duration_words(7200)) == ("10 min", "90 s", "2 h")


def test_a_fixed_size_job_fits_its_cluster_to_the_ranks_it_runs(db: Database) -> None:
    add_cluster(db, "a", 4)
    r = Reconciler(db, FakeBackend(), Inventory(4, False), drain_s=0, scheduler=ClusterScheduler())
    settle(r)
    assert clusters(db)[0].desired_containers == 4
    run_job(db, "a", "horovodrun -np 2 python t.py")  # two ranks: the launcher and one worker
    settle(r)
    (a,) = clusters(db)
    assert (a.desired_containers, len(a.containers)) == (2, 2)
    assert a.size_reason == "fitted to its job's range (2..2 containers)"
