"""One scheduler, end to end: a real `elastrain server --gpus 6` (process backend, no scheduler flag)
running real `elastrain run` jobs and `elastrain simulate`'s elastic policy, fed the same short trace,
make the same decisions in the same order (the unit test of the same trace drives the reconciler
in-process: tests/unit/test_scheduler_platform_equivalence.py)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from elastrain.client import Client, ClusterInfo
from elastrain.testing.clusters import settled
from elastrain.testing.scheduler_trace import (
    DECISIONS_AFTER,
    GPUS,
    STEPS,
    TRACE,
    Decided,
    event_decision,
    simulator_decisions,
)
from elastrain.testing.server import ControlPlane
from elastrain.testing.waits import wait_until

pytestmark = pytest.mark.timeout(300)
SLEEP = ["python", "-c", "import time; time.sleep(600)"]


def at_size(c: Client, name: str, containers: int) -> Callable[[ClusterInfo], bool]:
    ready = settled(c, name)
    return lambda cluster: cluster.desired_containers == containers and ready(cluster)


def scheduler_log(db: Path) -> list[Decided]:
    """The scheduler's decisions from the server's database, in the order it wrote them."""
    with sqlite3.connect(db) as conn:
        query = "SELECT action, cluster, detail FROM events WHERE actor = 'scheduler' ORDER BY id"
        rows = conn.execute(query).fetchall()
    out = []
    for action, name, detail in rows:
        d = json.loads(detail)
        out.append(event_decision(action, name, d.get("before", 0), d.get("after", 0)))
    return out


def test_a_real_server_decides_as_the_simulator(tmp_path: Path) -> None:
    cp = ControlPlane(tmp_path, gpus=GPUS, drain_seconds=5)
    cp.start()
    spec = {j[0]: j for j in TRACE}
    expected = simulator_decisions()
    jobs: dict[str, int] = {}
    db = cp.data / "elastrain.db"
    try:
        with cp.client() as c:
            for step in STEPS:
                name = step[1:]
                _, _, asked, low, high, _, ranks = spec[name]
                if step[0] == "+":
                    c.create_cluster(
                        name, containers=asked, min_containers=low, max_containers=high, gpus_per_container=1
                    )
                    c.wait_cluster(name, settled(c, name), timeout=60)
                    run = ["elastrain", "run", *ranks.split(), "--hostfile", "/etc/mpi/hostfile", *SLEEP]
                    jobs[name] = c.submit_job(name, run)["id"]
                else:
                    c.cancel_job(jobs.pop(name))
                    c.delete_cluster(name)
                    c.wait_deleted(name, timeout=60)
                # the decisions this step causes (as many as the simulator's), carried out, before the next
                wait_until(
                    lambda s=step: len(scheduler_log(db)) >= DECISIONS_AFTER[s],
                    90,
                    f"the scheduler's decisions after {step}",
                )
                for live in jobs:
                    size = c.get_cluster(live).desired_containers
                    c.wait_cluster(live, at_size(c, live, size), timeout=90)
            platform = scheduler_log(db)
    finally:
        cp.cleanup()
    print(f"\nsimulator: {expected}\nplatform:  {platform}")
    assert platform == expected
