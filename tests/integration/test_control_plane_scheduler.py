"""The elastic scheduler in a real server (`--gpus 4`, no scheduler flag: elastic is the default): a
cluster starts grown into idle GPUs, shrinks to admit a newcomer, a third waits Pending with a reason;
a real elastic job's range lets its cluster grow, and it follows; an idle cluster releases its workers."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from elastrain.client import Client, ClientError, ClusterInfo
from elastrain.report import build_report
from elastrain.testing.clusters import job_world, settled
from elastrain.testing.jobs import REPO
from elastrain.testing.server import ControlPlane
from elastrain.testing.waits import wait_until

pytestmark = pytest.mark.timeout(180)
SAMPLES = 10000  # MNIST-1D training set


@pytest.fixture
def elastic_cp(tmp_path: Path) -> Iterator[ControlPlane]:
    """A server of its own with 4 virtual GPUs and the default (elastic) scheduler; stopped by PID."""
    plane = ControlPlane(tmp_path, gpus=4)
    plane.start()
    try:
        yield plane
    finally:
        plane.cleanup()


def at_size(c: Client, name: str, containers: int) -> Callable[[ClusterInfo], bool]:
    """Desired == ``containers``, every container Running, the hostfile listing all of them."""
    ready = settled(c, name)
    return lambda cluster: cluster.desired_containers == containers and ready(cluster)


def scheduler_events(c: Client, name: str) -> list[dict[str, object]]:
    return [e["detail"] for e in c.events(name) if e["actor"] == "scheduler"]


def test_grow_into_idle_gpus_then_shrink_for_a_newcomer(elastic_cp: ControlPlane) -> None:
    cp = elastic_cp
    with cp.client() as c:
        t0 = time.monotonic()
        out = cp.cli(
            "cluster", "create", "a", "--containers", "4", "--min-containers", "2",
            "--max-containers", "4", "--gpus-per-container", "1",
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        a = c.wait_cluster("a", at_size(c, "a", 4), timeout=60)
        grown_s = time.monotonic() - t0
        assert len(a.running("worker")) == 3 and sum(k.gpus for k in a.containers) == 4
        assert "grown into 2 idle GPUs" in a.size_reason
        assert (a.min_containers, a.max_containers, a.priority) == (2, 4, 0)
        assert scheduler_events(c, "a")[0]["after"] == 4

        t1 = time.monotonic()
        c.create_cluster("b", containers=2, gpus_per_container=1)
        b = c.wait_cluster("b", at_size(c, "b", 2), timeout=60)
        a = c.wait_cluster("a", at_size(c, "a", 2), timeout=60)
        shrunk_s = time.monotonic() - t1
        shrunk = "shrunk for cluster b (priority 0)"
        assert a.size_reason == shrunk and len(b.running("worker")) == 1
        last = scheduler_events(c, "a")[-1]
        assert (last["before"], last["after"], last["reason"]) == (4, 2, shrunk)
        shown = json.loads(cp.cli("cluster", "get", "a", "-o", "json").stdout)
        assert (shown["desired_containers"], shown["size_reason"]) == (2, shrunk)
        assert shrunk in cp.cli("cluster", "get", "a").stdout

        c.create_cluster("c", containers=2, gpus_per_container=1)  # A is at its minimum: C waits
        waiting = c.wait_cluster("c", lambda k: k.reason.startswith("waiting for 2 GPUs"), timeout=30)
        assert waiting.state == "Pending" and not waiting.containers
        time.sleep(1.0)
        assert c.get_cluster("a").desired_containers == 2 and not c.get_cluster("c").containers

        c.delete_cluster("b")  # C takes B's GPUs
        c.wait_deleted("b", timeout=60)
        c.wait_cluster("c", at_size(c, "c", 2), timeout=60)
        c.delete_cluster("c")  # A runs no job: it does not take the idle GPUs back
        c.wait_deleted("c", timeout=60)
        time.sleep(1.0)
        assert c.get_cluster("a").desired_containers == 2
        print(f"\nA grew to 4 containers in {grown_s:.1f} s; shrank to 2 for B in {shrunk_s:.1f} s")


def test_bounds_are_validated(elastic_cp: ControlPlane) -> None:
    with elastic_cp.client() as c:
        for kwargs, message in (
            ({"containers": 2, "min_containers": 1}, "min_containers must be at least 2"),
            ({"containers": 5, "max_containers": 4}, "min_containers <= containers <= max_containers"),
            ({"containers": 5, "min_containers": 5, "max_containers": 6}, "but this node has 4"),
            ({"containers": 2, "priority": 2**40}, "priority"),
        ):
            with pytest.raises(ClientError) as err:
                c.create_cluster("bad", gpus_per_container=1, **kwargs)  # type: ignore[arg-type]
            status = 409 if "this node has" in message else 422  # valid, but more GPUs than the node has
            assert err.value.status == status and message in str(err.value), err.value
        c.create_cluster("ok", containers=2, min_containers=2, max_containers=3, gpus_per_container=1)
        with pytest.raises(ClientError) as err:
            c.scale_cluster("ok", 4)
        assert err.value.status == 409 and "elastic between 2 and 3" in str(err.value)  # its own bounds


def test_elastic_job_follows_the_scheduler_without_losing_a_sample(elastic_cp: ControlPlane) -> None:
    cp = elastic_cp
    examples, ledger = cp.mounts / "examples", cp.mounts / "ledger"
    examples.mkdir()
    ledger.mkdir()
    for name in ("mnist_elastic.py", "mnist1d_data.py"):
        shutil.copy(REPO / "examples" / name, examples / name)
    with cp.client() as c:
        mounts = [f"{examples}:/examples", f"{ledger}:/ledger"]
        c.create_cluster(
            "a", containers=2, min_containers=2, max_containers=4, gpus_per_container=1, mounts=mounts
        )
        c.wait_cluster("a", at_size(c, "a", 2), timeout=60)  # idle: the size asked for
        run = "elastrain run -v --min-np 1 --max-np 4 --hostfile /etc/mpi/hostfile --join-grace 1"
        train = "python /examples/mnist_elastic.py --epochs 2 --batch-size 256 --step-sleep 0.05"
        job = c.submit_job("a", f"{run} --ledger /ledger/run {train}".split())
        c.wait_cluster("a", at_size(c, "a", 4), timeout=60)  # its job can use 4: grown into them

        world = job_world(c, job["id"])
        wait_until(world(4), 90, "the job to train with 4 workers")
        c.create_cluster("b", containers=2, gpus_per_container=1, mounts=mounts)
        wait_until(world(2), 90, "the job to shrink to 2 workers for cluster b")
        c.wait_cluster("b", at_size(c, "b", 2), timeout=60)
        # the second cluster trains too, on the GPUs the first one gave up
        train_b = "python /examples/mnist_elastic.py --epochs 1 --batch-size 256"
        job_b = c.submit_job(
            "b", f"elastrain run -np 1 --hostfile /etc/mpi/hostfile --ledger /ledger/b {train_b}".split()
        )
        for finished in (job, job_b):
            done = wait_until(
                lambda f=finished: (j := c.get_job(f["id"]))["status"] not in ("Pending", "Running") and j,
                150,
                "both jobs to finish",
            )
            assert done["status"] == "Succeeded", c.job_logs(finished["id"])[0][-3000:]
    report_b = build_report(ledger / "b", SAMPLES)
    assert [(e["samples"], e["duplicates"], e["missing"]) for e in report_b["epochs"]] == [(SAMPLES, 0, 0)]
    report = build_report(ledger / "run", SAMPLES)
    assert [e["epoch"] for e in report["epochs"]] == [0, 1]
    for epoch in report["epochs"]:
        assert (epoch["samples"], epoch["duplicates"], epoch["missing"]) == (SAMPLES, 0, 0), epoch
    sizes = [g.get("world_size", g.get("workers")) for g in report["generations"]]
    assert 4 in sizes and sizes[-1] == 2, report["generations"]


def test_an_idle_cluster_releases_its_workers_and_a_scale_brings_them_back(tmp_path: Path) -> None:
    plane = ControlPlane(tmp_path, gpus=4, extra_args=("--idle-release-after", "2"))
    plane.start()
    try:
        with plane.client() as c:
            out = plane.cli(
                "cluster", "create", "a", "--containers", "3", "--gpus-per-container", "1",
                "--idle-release-after", "1",
            )  # fmt: skip
            assert out.returncode == 0, out.stderr
            assert c.get_cluster("a").raw["idle_release_after"] == 1
            a = c.wait_cluster(
                "a", lambda k: k.desired_containers == 1 and len(k.containers) == 1, timeout=60
            )
            assert a.size_reason == "idle for 1 s: workers released" and a.state == "Running"
            assert [k.role for k in a.containers] == ["launcher"]
            released = [e for e in c.events("a") if e["action"] == "cluster.idle_released"]
            assert released and "the launcher keeps its 1 GPU(s)" in released[0]["detail"]["reason"]
            before = sum(e["action"] == "container.created" for e in c.events("a"))
            assert c.scale_cluster("a", 3).desired_containers == 3  # the workers come back (for 1 s)
            wait_until(
                lambda: sum(e["action"] == "container.created" for e in c.events("a")) >= before + 2,
                60,
                "two workers to be created again after the scale",
            )
    finally:
        plane.cleanup()
