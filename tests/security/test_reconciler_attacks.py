"""The reconciler under attack (moved here from tests/unit so that the security line counts them): one
tenant's cluster whose reconcile step fails on every pass, or hangs (shown Degraded until it returns),
must not stall the others' clusters, and a
mount whose stored (resolved) source a tenant later redirects through a symbolic link is refused at
container start. Both run against a fake backend and a real (SQLite) database: fast.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from elastrain.backends.api import ContainerSpec, ContainerStatus
from elastrain.backends.fake import FakeBackend
from elastrain.db.models import Cluster, ClusterState, ContainerState, Framework
from elastrain.db.repository import all_clusters, create_user, events_for
from elastrain.db.session import Database
from elastrain.server.inventory import Inventory
from elastrain.server.reconciler import Reconciler
from elastrain.testing.reconcile import alice_cluster_db, clusters, settle
from elastrain.testing.waits import wait_until

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    """Alice's 3-container cluster `c` (one GPU each), not yet reconciled."""
    database = alice_cluster_db(tmp_path)
    yield database
    database.dispose()


class OneClusterBreaks(FakeBackend):
    """`create_container` raises an unexpected error (not an `ElastrainError`) for cluster `broken` only."""

    def __init__(self, broken: str) -> None:
        super().__init__()
        self.broken = broken
        self.attempts = 0

    def create_container(self, spec: ContainerSpec) -> ContainerStatus:
        if spec.cluster == self.broken:
            self.attempts += 1
            raise RuntimeError(f"cannot start {spec.cluster}\nsecond line of the traceback text")
        return super().create_container(spec)


@pytest.mark.attack
def test_one_failing_cluster_does_not_stall_the_others(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    """Cluster `c` (planned first) fails on every start; bob's cluster `d` still reaches Running in the
    same passes, and `c` carries one ``reconcile.failed`` event and one log line, not one per pass."""
    with db.session() as session:
        bob, _token = create_user(session, "bob")
        other = Cluster(name="d", uid="u2", owner_id=bob.id, framework=Framework.horovod)
        other.desired_containers, other.gpus_per_container = 2, 1
        session.add(other)
    backend = OneClusterBreaks("c")
    r = Reconciler(db, backend, Inventory(8, False))
    with caplog.at_level("ERROR", logger="elastrain.reconciler"):
        settle(r)
        for _ in range(5):
            assert r.reconcile_once() == 0  # a decision failing each pass is not counted as progress
    c, d = clusters(db)
    assert d.state == ClusterState.Running and all(k.state == ContainerState.Running for k in d.containers)
    assert backend.attempts >= 5 and c.state != ClusterState.Running
    assert all(k.state == ContainerState.Pending for k in c.containers)  # retried, never half-applied
    with db.session() as session:
        failed = [e for e in events_for(session, "c") if e.action == "reconcile.failed"]
        assert not [e for e in events_for(session, "d") if e.action == "reconcile.failed"]
    assert len(failed) == 1, [e.detail for e in failed]
    detail = json.loads(failed[0].detail)
    assert detail["reason"] == "RuntimeError: cannot start c" and detail["step"] == "add"
    assert len([r for r in caplog.records if "cannot start c" in r.getMessage()]) == 1


class OneClusterHangs(FakeBackend):
    """`create_container` of cluster `stuck` blocks until `release` is set (as a step blocked on a file
    its tenant controls would: a FUSE mount that never answers)."""

    def __init__(self, stuck: str) -> None:
        super().__init__()
        self.stuck = stuck
        self.release = threading.Event()

    def create_container(self, spec: ContainerSpec) -> ContainerStatus:
        if spec.cluster == self.stuck:
            assert self.release.wait(60), "the test never released the hanging step"
        return super().create_container(spec)


@pytest.mark.attack("29.fifo-log")
def test_a_hanging_step_degrades_only_its_cluster(db: Database) -> None:
    """Cluster `c`'s container start hangs: bob's cluster `d` still reaches Running, each pass returns
    within the step deadline, `c` is shown Degraded (with a ``cluster.degraded`` event) while its step
    hangs, and recovers to Running once the step returns."""
    with db.session() as session:
        bob, _token = create_user(session, "bob")
        other = Cluster(name="d", uid="u2", owner_id=bob.id, framework=Framework.horovod)
        other.desired_containers, other.gpus_per_container = 2, 1
        session.add(other)
    backend = OneClusterHangs("c")
    r = Reconciler(db, backend, Inventory(8, False), step_deadline_s=0.5)
    try:
        slowest = 0.0

        def d_running_and_c_degraded() -> bool:
            nonlocal slowest
            start = time.monotonic()
            r.reconcile_once()
            slowest = max(slowest, time.monotonic() - start)
            c, d = clusters(db)
            return d.state == ClusterState.Running and c.state == ClusterState.Degraded

        wait_until(d_running_and_c_degraded, 30, "d Running and c Degraded", interval=0)
        assert slowest < 0.5 + 2.0, slowest  # a pass waits for a hanging step its deadline, not 60 s
        c, _d = clusters(db)
        assert "deadline" in c.reason and r.steps.busy("c")
    finally:
        backend.release.set()
    wait_until(lambda: not r.steps.busy("c"), 30, "c's step returned")
    settle(r)
    c, d = clusters(db)
    assert c.state == ClusterState.Running and d.state == ClusterState.Running
    with db.session() as session:
        actions = [e.action for e in events_for(session, "c")]
    assert "cluster.degraded" in actions
    assert actions.index("cluster.running") > actions.index("cluster.degraded")


@pytest.mark.attack("29.mount-race")
def test_a_mount_redirected_by_a_link_after_creation_is_refused(db: Database, tmp_path: Path) -> None:
    """A tenant swaps a directory of a mount's stored (resolved) path for a link to the server's data:
    the container is refused at start, never started with the redirected mount."""
    shared, secret = tmp_path / "shared", tmp_path / "server-data"
    (shared / "sub").mkdir(parents=True)
    secret.mkdir()
    with db.session() as session:
        cluster = all_clusters(session)[0]
        cluster.mounts = json.dumps([{"source": str(shared / "sub"), "target": "/data"}])
    (shared / "sub").rmdir()
    (shared / "sub").symlink_to(secret)
    backend = FakeBackend()
    r = Reconciler(db, backend, Inventory(8, False))
    for _ in range(3):
        r.reconcile_once()
    (c,) = clusters(db)
    assert backend.creates == 0 and c.state != ClusterState.Running
    # a refused start fails its row; then every row waits out the start backoff, saying why
    assert all("symbolic link" in k.reason for k in c.containers), [k.reason for k in c.containers]
    assert {k.state for k in c.containers} <= {ContainerState.Failed, ContainerState.Pending}
