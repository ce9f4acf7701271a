"""Faults: a dead container is replaced, a GPU shortage waits Pending, kill -9 of the server mid-scale."""

from __future__ import annotations

import os
import signal
import time

import pytest

from elastrain.testing.clusters import all_running, hostfile_hosts, settled
from elastrain.testing.server import ControlPlane, sqlite_only
from elastrain.testing.server import container_inits as init_pids
from elastrain.testing.timings import record_timing
from elastrain.testing.waits import wait_until

pytestmark = pytest.mark.timeout(180)


def test_dead_container_is_replaced_and_leaves_the_hostfile(cp: ControlPlane) -> None:
    sqlite_only(cp)
    with cp.client() as c:
        cluster = c.create_cluster("crashy", containers=3)
        cluster = c.wait_cluster("crashy", settled(c, "crashy"), timeout=60)
        victim = cluster.running("worker")[0]
        generation = cluster.hostfile_generation
        assert victim.pid is not None
        os.kill(victim.pid, signal.SIGKILL)
        wait_until(
            lambda: victim.address not in c.hostfile("crashy"), 60, "the hostfile to drop the dead container"
        )
        cluster = c.wait_cluster(
            "crashy", lambda x: settled(c, "crashy")(x) and victim.pid not in {k.pid for k in x.containers}
        )
        assert len(hostfile_hosts(c.hostfile("crashy"))) == 3 and cluster.hostfile_generation > generation
        actions = [e["action"] for e in c.events("crashy")]
        assert "container.failed" in actions and actions.count("container.created") == 4
        c.delete_cluster("crashy")
        c.wait_deleted("crashy")


def test_cluster_waits_for_gpus(cp: ControlPlane) -> None:
    sqlite_only(cp)
    with cp.client() as c:
        c.create_cluster("big", containers=2, gpus_per_container=3)
        c.wait_cluster("big", all_running, timeout=60)
        c.create_cluster("waiting", containers=2, gpus_per_container=2)
        waiting = c.wait_cluster("waiting", lambda x: x.reason.startswith("waiting for"))  # either scheduler
        assert waiting.state == "Pending" and not waiting.containers
        c.delete_cluster("big")
        c.wait_cluster("waiting", all_running, timeout=60)
        assert c.inventory()["used"] == 4
        c.delete_cluster("waiting")
        c.wait_deleted("waiting")
        c.wait_deleted("big")


def test_restart_mid_scale_adopts_without_duplicates(
    request: pytest.FixtureRequest, cp: ControlPlane
) -> None:
    plane = ControlPlane(
        cp.root / "restart", cp.db_url and request.getfixturevalue("postgres").new_database()
    )
    plane.start()
    try:
        with plane.client() as c:
            c.create_cluster("survivor", containers=2)
            before = c.wait_cluster("survivor", all_running, timeout=60)
            c.scale_cluster("survivor", 4)
            plane.kill()  # kill -9 right after the scale was accepted
        record_timing(cp, "server restart -> answering", plane.start())
        t0 = time.monotonic()
        with plane.client() as c:
            after = c.wait_cluster(
                "survivor",
                lambda x: all_running(x) and len(hostfile_hosts(c.hostfile("survivor"))) == 4,
                timeout=60,
            )
            record_timing(
                cp, "server restart -> reconciled (4 Running, 4 hosts in the hostfile)", time.monotonic() - t0
            )
            old = {k.name: k.pid for k in before.containers}
            assert all({k.name: k.pid for k in after.containers}[n] == p for n, p in old.items()), (
                "not adopted"
            )
            assert init_pids(plane.data) == {k.pid for k in after.containers}, "duplicate or orphan processes"
            assert len({k.address for k in after.containers}) == 4
    finally:
        plane.cleanup()
