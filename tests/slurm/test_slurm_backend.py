"""The Slurm backend end to end: a real ``elastrain server --backend slurm`` on the private cluster.

A 3-container cluster is created (every container a Slurm job placed by Slurm), the example elastic
job trains on it, the cluster is scaled to 5 (new Slurm jobs, the job grows), a node holding a worker
is drained (that container leaves, the hostfile and the job shrink), the job finishes with every
sample trained exactly once, and deleting the cluster leaves no Slurm job behind.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from elastrain.client import Client, ClusterInfo
from elastrain.report import build_report
from elastrain.testing.clusters import hostfile_hosts, job_world, settled
from elastrain.testing.jobs import REPO, TRAIN_SAMPLES, assert_exactly_once
from elastrain.testing.server import ControlPlane
from elastrain.testing.timings import record_timing
from elastrain.testing.waits import wait_until
from tests.slurm.conftest import SlurmCluster

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(120)]
EPOCHS = 4


class SlurmControlPlane(ControlPlane):
    """`ControlPlane` whose server runs ``--backend slurm`` (SLURM_CONF from the session fixture)."""

    def start(self) -> float:
        argv = [
            sys.executable,
            "-m",
            "elastrain",
            "server",
            "--backend",
            "slurm",
            "--port",
            str(self.port),
            "--data-dir",
            str(self.data),
            "--allow-mount",
            str(self.mounts),
            "--drain-seconds",
            "20",  # the bound; scale-in waits for the jobs' reports that the workers have left
            "--reconcile-interval",
            "0.2",
            "--insecure-host-commands",  # the tests submit jobs: they run here, as the server's user
        ]
        log = open(self.root / "server.log", "ab")  # noqa: SIM115 - closed when the process ends
        t0 = time.monotonic()
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        log.close()
        with Client(self.url, "") as probe:
            wait_until(
                lambda: probe.health() or self.proc is None or self.proc.poll() is not None, 60, "server"
            )
        assert self.proc.poll() is None, (self.root / "server.log").read_text()[-3000:]
        self.token = (self.data / "admin-token").read_text().strip()
        return time.monotonic() - t0


@pytest.fixture
def scp(slurm: SlurmCluster, tmp_path: Path) -> Iterator[SlurmControlPlane]:
    plane = SlurmControlPlane(tmp_path)
    plane.start()
    try:
        yield plane
    finally:
        plane.cleanup()
        for node in ("n1", "n2", "n3", "n4"):  # a failed test may leave its drained node behind
            slurm.cmd("scontrol", "update", f"nodename={node}", "state=resume", check=False)


def elastrain_jobs(slurm: SlurmCluster) -> dict[str, tuple[str, str, str]]:
    """Active elastrain Slurm jobs: job id -> (name, state, node)."""
    data = json.loads(slurm.cmd("squeue", "--json"))
    active = {"PENDING", "CONFIGURING", "RUNNING"}
    return {
        str(j["job_id"]): (j["name"], j["job_state"], j["batch_host"] or j["nodes"])
        for j in data["jobs"]
        if j["name"].startswith("elastrain-") and j["job_state"] in active
    }


def container_meta(cp: ControlPlane, cluster: str, name: str) -> dict[str, Any]:
    return json.loads((cp.data / "clusters" / cluster / name / "container.json").read_text())


def check_placement(cp: ControlPlane, slurm: SlurmCluster, cluster: ClusterInfo) -> dict[str, str]:
    """Every Running container is a RUNNING Slurm job named after it, on the node it records."""
    jobs = elastrain_jobs(slurm)
    nodes = {}
    for k in cluster.containers:
        if k.state != "Running":
            continue
        meta = container_meta(cp, cluster.name, k.name)
        name, state, node = jobs[str(meta["slurm_job_id"])]
        assert (name, state) == (f"elastrain-{cluster.name}-{k.name}", "RUNNING")
        assert meta["slurm_node"] == node and node in ("n1", "n2", "n3", "n4")
        nodes[k.name] = node
    return nodes


def test_cluster_on_slurm_scale_drain_delete(scp: SlurmControlPlane, slurm: SlurmCluster) -> None:
    examples = scp.mounts / "examples"
    examples.mkdir()
    for name in ("mnist_elastic.py", "mnist1d_data.py"):
        shutil.copy(REPO / "examples" / name, examples / name)
    with scp.client() as c:
        assert c.inventory()["gpus"] == 16, "the server counts the Slurm cluster's GPUs"
        t0 = time.monotonic()
        c.create_cluster(
            "sl", containers=3, gpus_per_container=1, mounts=[f"{examples}:/examples"], restart_policy="Never"
        )
        cluster = c.wait_cluster("sl", settled(c, "sl"), timeout=60)
        record_timing(scp, "slurm: create 3 -> all Running", time.monotonic() - t0)
        first = check_placement(scp, slurm, cluster)
        metas = [container_meta(scp, "sl", k.name) for k in cluster.containers]
        latency = max(m["running_at"] - m["submitted_at"] for m in metas)
        record_timing(scp, "slurm: sbatch -> job seen RUNNING (slowest of 3)", latency)
        assert len(first) == 3 and len(elastrain_jobs(slurm)) == 3
        assert sorted(hostfile_hosts(c.hostfile("sl"))) == sorted(k.address for k in cluster.containers)
        assert "elastrain: slurm job" in c.container_logs("sl")

        run = "elastrain run -v --min-np 1 --max-np 5 --hostfile /etc/mpi/hostfile --join-grace 1"
        train = f"python /examples/mnist_elastic.py --epochs {EPOCHS} --batch-size 128 --step-sleep 0.12"
        job = c.submit_job("sl", [*run.split(), "--ledger", "/examples/ledger", *train.split()])

        world = job_world(c, job["id"])
        wait_until(world(3), 60, "the job to train with 3 workers (the launcher trains too)")

        t0 = time.monotonic()
        c.scale_cluster("sl", 5)
        cluster = c.wait_cluster("sl", lambda x: len(x.containers) == 5 and settled(c, "sl")(x), timeout=60)
        record_timing(scp, "slurm: scale 3->5 -> new containers Running", time.monotonic() - t0)
        placed = check_placement(scp, slurm, cluster)
        assert len(elastrain_jobs(slurm)) == 5 and set(first.items()) <= set(placed.items())
        wait_until(world(5), 60, "the job to grow to 5 workers")
        record_timing(scp, "slurm: scale 3->5 -> job trains with 5 workers", time.monotonic() - t0)

        roles = {k.name: k.role for k in cluster.containers}
        by_node: dict[str, list[str]] = {}
        for name, node in placed.items():
            by_node.setdefault(node, []).append(name)
        worker_nodes = [n for n, names in by_node.items() if all(roles[k] == "worker" for k in names)]
        assert worker_nodes, f"no node holds only workers: {by_node}"
        node = min(worker_nodes, key=lambda n: len(by_node[n]))
        leaving = set(by_node[node])
        slurm.cmd("scontrol", "update", f"nodename={node}", "state=drain", "reason=test")
        try:
            t0 = time.monotonic()
            cluster = c.wait_cluster(
                "sl",
                lambda x: {k.name for k in x.containers if k.state == "Failed"} == leaving,
                timeout=30,
            )
            stay = sorted(k.address for k in cluster.containers if k.state == "Running")
            wait_until(lambda: sorted(hostfile_hosts(c.hostfile("sl"))) == stay, 30, "the hostfile to shrink")
            record_timing(scp, "slurm: drain node -> hostfile shrinks", time.monotonic() - t0)
            assert len(stay) == 5 - len(leaving)
            wait_until(
                lambda: not {v[2] for v in elastrain_jobs(slurm).values()} & {node}, 30, "the jobs to leave"
            )
            wait_until(world(5 - len(leaving)), 60, "the job to shrink")
        finally:
            slurm.cmd("scontrol", "update", f"nodename={node}", "state=resume")

        done = wait_until(
            lambda: (j := c.get_job(job["id"]))["status"] != "Running" and j, 90, "the job to end"
        )
        log = c.job_logs(job["id"])[0]
        assert done["status"] == "Succeeded", log[-3000:]
        assert "formed: 5 workers" in log and "scale_in" in log, log[-3000:]
        assert_exactly_once(build_report(examples / "ledger", TRAIN_SAMPLES), EPOCHS)

        c.delete_cluster("sl")
        c.wait_deleted("sl", timeout=30)
        assert elastrain_jobs(slurm) == {}
        assert not (scp.data / "clusters" / "sl").exists()


def test_restart_adopts_slurm_jobs_and_scale_in_cancels(scp: SlurmControlPlane, slurm: SlurmCluster) -> None:
    """A restarted server adopts the running Slurm jobs; scaling in ends the surplus job gracefully."""
    with scp.client() as c:
        c.create_cluster("ad", containers=3)
        cluster = c.wait_cluster("ad", settled(c, "ad"), timeout=60)
        before = check_placement(scp, slurm, cluster)
        jobs = elastrain_jobs(slurm)
    scp.kill()
    scp.start()
    with scp.client() as c:
        cluster = c.wait_cluster("ad", settled(c, "ad"), timeout=60)
        assert check_placement(scp, slurm, cluster) == before and elastrain_jobs(slurm) == jobs
        gone = container_meta(scp, "ad", "ad-worker-1")["slurm_job_id"]
        c.scale_cluster("ad", 2)
        c.wait_cluster("ad", lambda x: len(x.containers) == 2 and settled(c, "ad")(x), timeout=60)
        wait_until(lambda: str(gone) not in elastrain_jobs(slurm), 30, "the surplus Slurm job to end")
        assert slurm.job_field(str(gone), "JobState") in ("COMPLETED", "CANCELLED", "")
        assert len(elastrain_jobs(slurm)) == 2
        c.delete_cluster("ad")
        c.wait_deleted("ad", timeout=30)
        assert elastrain_jobs(slurm) == {}
