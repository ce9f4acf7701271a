"""One scheduler: the control plane (real DB, reconciler and scheduling step, fake backend, 6 virtual
GPUs) and the simulator, fed the same short trace, make the same decisions in the same order."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from elastrain.backends.fake import FakeBackend
from elastrain.db.models import Cluster, ClusterState, Event, Framework, Job, JobStatus
from elastrain.db.repository import all_clusters, create_user
from elastrain.db.session import Database
from elastrain.server.inventory import Inventory
from elastrain.server.reconciler import Reconciler
from elastrain.server.scheduler_step import ClusterScheduler
from elastrain.testing.reconcile import settle
from elastrain.testing.scheduler_trace import (
    GPUS,
    STEPS,
    TRACE,
    Decided,
    event_decision,
    simulator_decisions,
)


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = Database(f"sqlite:///{tmp_path / 'db.sqlite'}")
    database.migrate()
    yield database
    database.engine.dispose()


def platform_decisions(db: Database) -> list[Decided]:
    backend = FakeBackend()
    r = Reconciler(db, backend, Inventory(GPUS, False), drain_s=0, scheduler=ClusterScheduler("elastic"))
    with db.session() as session:
        owner, _ = create_user(session, "alice")
        owner_id = owner.id
    spec = {j[0]: j for j in TRACE}
    try:
        for step in STEPS:
            name = step[1:]
            _, _, asked, low, high, _, ranks = spec[name]
            with db.session() as session:
                if step[0] == "+":  # a cluster of the job's size with its job running
                    c = Cluster(name=name, uid=f"u-{name}", owner_id=owner_id, framework=Framework.horovod)
                    c.desired_containers = c.requested_containers = asked
                    c.gpus_per_container, c.min_containers, c.max_containers = 1, low, high
                    c.admitted = False
                    session.add(c)
                    session.flush()
                    argv = f"elastrain run {ranks} --hostfile /etc/mpi/hostfile python train.py".split()
                    session.add(
                        Job(
                            cluster_id=c.id,
                            owner_id=owner_id,
                            command=json.dumps(argv),
                            status=JobStatus.Running,
                        )
                    )
                else:  # its job ends and the cluster is deleted
                    c = next(k for k in all_clusters(session) if k.name == name)
                    for job in session.scalars(select(Job).where(Job.cluster_id == c.id)):
                        job.status = JobStatus.Succeeded
                    c.state = ClusterState.Terminating
            settle(r)
        with db.session() as session:
            query = select(Event).where(Event.actor == "scheduler").order_by(Event.id)
            out = [(e.action, e.cluster, json.loads(e.detail)) for e in session.scalars(query)]
    finally:
        backend.close()
    return [event_decision(a, name, d.get("before", 0), d.get("after", 0)) for a, name, d in out]


def test_the_control_plane_and_the_simulator_decide_alike(db: Database) -> None:
    sim = simulator_decisions()
    platform = platform_decisions(db)
    print(f"\nsimulator: {sim}\nplatform:  {platform}")
    assert sim == [
        ("start", "a", 4),
        ("start", "b", 2),
        ("shrink", "a", 2),
        ("start", "c", 2),
        ("grow", "a", 4),
        ("start", "d", 2),
    ]
    assert platform == sim
