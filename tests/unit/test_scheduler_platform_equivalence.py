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
from elastrain.scheduler.api import ClusterState as SimState
from elastrain.scheduler.api import Decision, DecisionKind, Policy
from elastrain.scheduler.registry import make_policy
from elastrain.scheduler.simulator import SimConfig, simulate
from elastrain.scheduler.trace import TraceJob
from elastrain.server.inventory import Inventory
from elastrain.server.reconciler import Reconciler
from elastrain.server.scheduler_step import ClusterScheduler
from elastrain.testing.reconcile import settle

GPUS = 6
# (id, submit s, GPUs asked, min, max, duration s, the job's elastrain run range)
TRACE = (
    ("a", 0.0, 4, 2, 4, 1e6, "--min-np 2 --max-np 4"),
    ("b", 100.0, 2, 2, 2, 200.0, "-np 2"),
    ("c", 200.0, 2, 2, 2, 200.0, "-np 2"),
    ("d", 500.0, 2, 2, 2, 1e6, "-np 2"),
)
STEPS = ("+a", "+b", "+c", "-b", "-c", "+d")  # the trace's events in time order (arrival +, end -)


class Recording(Policy):
    """The policy, with every resize decision noted as (kind, job, workers after)."""

    name = "elastic"

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.log: list[tuple[str, str, int]] = []

    def decide(self, state: SimState) -> list[Decision]:
        decisions = self.inner.decide(state)
        for d in decisions:
            if d.kind in (DecisionKind.START, DecisionKind.GROW, DecisionKind.SHRINK):
                self.log.append((d.kind.value, d.job_id, getattr(d, "workers", 0)))
            elif d.kind is DecisionKind.PREEMPT:
                self.log.append(("preempt", d.job_id, 0))
        return decisions

    def next_wakeup_s(self, state: SimState) -> float | None:
        return self.inner.next_wakeup_s(state)


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = Database(f"sqlite:///{tmp_path / 'db.sqlite'}")
    database.migrate()
    yield database
    database.engine.dispose()


def simulator_decisions() -> list[tuple[str, str, int]]:
    trace = [TraceJob(j, t, n, dur, min_gpus=lo, max_gpus=hi) for j, t, n, lo, hi, dur, _ in TRACE]
    policy = Recording(make_policy("elastic"))
    simulate(trace, policy, SimConfig(gpus=GPUS, gpus_per_node=GPUS, restart_cost_s=0.0))
    return policy.log


def platform_decisions(db: Database) -> list[tuple[str, str, int]]:
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
    log: list[tuple[str, str, int]] = []
    for action, name, detail in out:
        before, after = detail.get("before", 0), detail.get("after", 0)
        kind = {"cluster.admitted": "start", "cluster.preempted": "preempt"}.get(action)
        log.append((kind or ("grow" if after > before else "shrink"), name, after))
    return log


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
