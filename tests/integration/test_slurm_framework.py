"""Slurm as a framework, for real: a ``--framework slurm`` cluster is a Slurm cluster inside its containers.

munged in every container, slurmctld in the launcher, slurmd in each worker, all as the tenant with no
capabilities (`elastrain.agent.slurm_services`). Checked: ``sinfo`` shows the workers as idle nodes,
``srun``/``sbatch`` run on them, scaling 3 -> 5 containers adds two nodes, and an ``elastrain run
--slurm`` job in a 4-node allocation shrinks gracefully when the cluster scales back to 3 (its
allocation shrinks with it, every sample exactly once); an ``elastrain run --slurm --max-np 4`` job in a
2-node allocation expands its allocation onto the 2 nodes a scale 3 -> 5 adds and grows to 4 workers.

One cluster serves the module; skips (with the reason) where podman cannot run or images cannot be built.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from elastrain.backends.podmanctl import podman
from elastrain.client import Client
from elastrain.launcher.slurm import expand_hostlist
from elastrain.report import build_report
from elastrain.testing.clusters import all_running, job_world, run_in
from elastrain.testing.containers import ContainerPlane, framework_image, shared_storage
from elastrain.testing.timings import record_timing
from elastrain.testing.waits import wait_until

pytestmark = pytest.mark.timeout(300)
CLUSTER = "slm"
SAMPLES = 10000


def nodes(c: Client) -> dict[str, str]:
    """Node -> state as the launcher's ``sinfo`` shows it ({} while slurmctld does not answer)."""
    code, out = run_in(c, CLUSTER, "sinfo", "-h", "-N", "-o", "%N %T")
    if code != 0:
        return {}
    return dict(line.split()[:2] for line in out.splitlines() if len(line.split()) >= 2)


def idle(c: Client, count: int) -> Callable[[], dict[str, str] | None]:
    """A `wait_until` check: exactly `count` nodes, all idle."""

    def check() -> dict[str, str] | None:
        current = nodes(c)
        ok = len(current) == count and set(current.values()) == {"idle"}
        return current if ok else None

    return check


def allocation(c: Client) -> list[str]:
    """The running jobs' node counts and node lists (``squeue -o "%D %N"``)."""
    return run_in(c, CLUSTER, "squeue", "-h", "-t", "R", "-o", "%D %N")[1].split()


def diagnosis(ccp: ContainerPlane, c: Client) -> str:
    """squeue, sinfo, the Slurm daemons' last log lines and the launcher's runner log (for a failure)."""
    show = "squeue; sinfo; cd /tmp/elastrain-slurm; tail -n 15 log/*.log; head -n 3 munge/munged.log"
    state = run_in(c, CLUSTER, "sh", "-c", show)[1]
    for container in (f"{CLUSTER}-worker-0", f"{CLUSTER}-worker-1"):
        state += f"--- {container}\n" + run_in(c, CLUSTER, "sh", "-c", show, container=container)[1]
    logs = podman("logs", f"elastrain-{ccp.key}-{CLUSTER}-launcher", check=False)
    return state + "".join(
        line + "\n" for line in (logs.stdout + logs.stderr).splitlines() if "slurm" in line
    )


def workers(count: int) -> list[str]:
    return [f"{CLUSTER}-worker-{i}" for i in range(count)]


@pytest.fixture(scope="module")
def cluster(ccp: ContainerPlane) -> Iterator[Client]:
    framework_image("slurm")
    data = shared_storage(ccp, "slm-data")
    t0 = time.monotonic()
    made = ccp.cli(
        "cluster", "create", CLUSTER, "--framework", "slurm", "--containers", "3",
        "--mount", f"{data}:/data", "--wait",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    with ccp.client() as c:
        assert c.get_cluster(CLUSTER).image.startswith("localhost/elastrain-slurm")
        wait_until(idle(c, 2), 60, "sinfo to show the 2 workers idle")
        record_timing(ccp, "slurm: create 3 containers -> sinfo 2 nodes idle", time.monotonic() - t0)
        yield c
        c.delete_cluster(CLUSTER)
        c.wait_deleted(CLUSTER, timeout=60)


def test_slurm_runs_in_the_containers_as_the_tenant(ccp: ContainerPlane, cluster: Client) -> None:
    """The workers are the nodes; srun and sbatch run on them; every daemon is the tenant's."""
    assert nodes(cluster) == dict.fromkeys(workers(2), "idle")
    code, out = run_in(cluster, CLUSTER, "srun", "-N", "2", "hostname")
    assert code == 0 and sorted(out.split()) == workers(2), f"{out}\n{diagnosis(ccp, cluster)}"
    # the batch script runs on the first node, with that container's own variables (task prolog)
    script = "echo on $(hostname) as $ELASTRAIN_CONTAINER; srun hostname"
    code, out = run_in(
        cluster, CLUSTER, "sbatch", "--wait", "-N", "2", "-o", "batch-%j.out", "--wrap", script
    )
    assert code == 0, out
    job = out.split()[-1]
    code, out = run_in(cluster, CLUSTER, "cat", f"batch-{job}.out")  # the home is the cluster's
    assert code == 0 and f"on {CLUSTER}-worker-0 as {CLUSTER}-worker-0" in out, out
    assert sorted(out.split()[-2:]) == workers(2), out
    for container in (None, f"{CLUSTER}-worker-1"):
        code, out = run_in(cluster, CLUSTER, "ps", "-eo", "uid=,comm=", container=container)
        daemons = {line.split()[1]: int(line.split()[0]) for line in out.splitlines() if line.strip()}
        assert code == 0 and "munged" in daemons, out
        assert ("slurmctld" if container is None else "slurmd") in daemons, out
        assert min(daemons.values()) >= 20000, out  # no root process, Slurm's daemons included
    code, out = run_in(cluster, CLUSTER, "sh", "-c", "grep -E '^Slurm(d)?User=' $SLURM_CONF; id -un")
    assert code == 0 and len(set(line.split("=")[-1] for line in out.split())) == 1, out


def test_scaling_changes_the_nodes_and_a_slurm_job_shrinks(ccp: ContainerPlane, cluster: Client) -> None:
    """3 -> 5 containers: 4 idle nodes. An elastic `elastrain run --slurm` in a 4-node allocation, then
    5 -> 3: the leaving nodes' agents leave gracefully, the allocation shrinks to the 2 staying nodes,
    the job finishes with every sample exactly once and the 2 nodes are left, idle."""
    t0 = time.monotonic()
    cluster.scale_cluster(CLUSTER, 5)
    found = wait_until(idle(cluster, 4), 60, "sinfo to show 4 idle nodes")
    record_timing(ccp, "slurm: scale 3 -> 5 containers -> 4 nodes idle", time.monotonic() - t0)
    assert sorted(found) == workers(4)
    assert all_running(cluster.get_cluster(CLUSTER))

    data = ccp.mounts / "slm-data"
    (data / "slow").touch()
    run = "elastrain run -v --slurm --min-np 1 --ledger /data/ledger python /data/mnist_elastic.py"
    train = "--epochs 12 --batch-size 200 --step-sleep 0.2 --slow-while /data/slow"
    job = cluster.submit_job(CLUSTER, ["salloc", "-N", "4", *run.split(), *train.split()])
    world = job_world(cluster, job["id"])
    wait_until(world(4), 150, "the job to train with 4 workers")
    t0 = time.monotonic()
    cluster.scale_cluster(CLUSTER, 3)
    shrunk = "formed: 2 workers (scale_in)"
    wait_until(lambda: shrunk in cluster.job_logs(job["id"])[0], 60, "the job to shrink to 2 workers")
    record_timing(ccp, "slurm: scale 5 -> 3 -> the job at 2 workers", time.monotonic() - t0)
    wait_until(world(2), 60, "the job to report 2 workers")
    staying = ["2", f"{CLUSTER}-worker-[0-1]"]
    try:
        wait_until(
            lambda: allocation(cluster) == staying, 30, "the allocation to shrink to the staying nodes"
        )
        wait_until(lambda: sorted(nodes(cluster)) == workers(2), 30, "the leaving nodes to leave Slurm")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{diagnosis(ccp, cluster)}") from None
    record_timing(ccp, "slurm: scale 5 -> 3 -> 2 nodes left in Slurm", time.monotonic() - t0)
    (data / "slow").unlink()
    try:
        done = wait_until(
            lambda: (j := cluster.get_job(job["id"]))["status"] != "Running" and j, 120, "the job to finish"
        )
    except AssertionError as exc:
        tail = cluster.job_logs(job["id"])[0][-4000:]
        raise AssertionError(f"{exc}\n{tail}\n{diagnosis(ccp, cluster)}") from None
    log = cluster.job_logs(job["id"])[0]
    assert (done["status"], done["exit_code"]) == ("Succeeded", 0), log[-3000:]
    assert "scale_in" in log and "worker_failure" not in log, log[-3000:]
    report = build_report(data / "ledger", SAMPLES)
    assert [(e["samples"], e["duplicates"], e["missing"]) for e in report["epochs"]] == [(SAMPLES, 0, 0)] * 12
    wait_until(idle(cluster, 2), 30, "the 2 staying nodes to be idle")


def test_an_elastic_slurm_job_grows_its_allocation(ccp: ContainerPlane, cluster: Client) -> None:
    """3 containers (2 idle nodes): ``salloc -N 2 elastrain run --slurm --min-np 2 --max-np 4`` trains
    with 2 workers; scaling to 5 containers adds 2 idle nodes, the launcher expands its allocation onto
    them (once, `elastrain.launcher.slurm_grow`), starts agents there and the job grows to 4 workers;
    it finishes with every sample exactly once."""
    if sorted(nodes(cluster)) != workers(2):
        cluster.scale_cluster(CLUSTER, 3)
    wait_until(idle(cluster, 2), 90, "sinfo to show 2 idle nodes")
    data = ccp.mounts / "slm-data"
    (data / "slow-grow").touch()
    run = "elastrain run -v --slurm --min-np 2 --max-np 4 --ledger /data/ledger-grow"
    run += " python /data/mnist_elastic.py"
    train = "--epochs 4 --batch-size 200 --step-sleep 0.2 --slow-while /data/slow-grow"
    job = cluster.submit_job(CLUSTER, ["salloc", "-N", "2", *run.split(), *train.split()])
    world = job_world(cluster, job["id"])
    wait_until(world(2), 60, "the job to train with 2 workers")
    t0 = time.monotonic()
    cluster.scale_cluster(CLUSTER, 5)
    try:
        wait_until(world(4), 60, "the job to grow to 4 workers")
    except AssertionError as exc:
        tail = cluster.job_logs(job["id"])[0][-4000:]
        raise AssertionError(f"{exc}\n{tail}\n{diagnosis(ccp, cluster)}") from None
    record_timing(ccp, "slurm: scale 3 -> 5 -> the job's allocation grown, 4 workers", time.monotonic() - t0)
    count, nodelist = allocation(cluster)  # one job (the helper that brought the nodes is gone)
    assert count == "4" and expand_hostlist(nodelist) == sorted(nodes(cluster)), (count, nodelist)
    (data / "slow-grow").unlink()
    done = wait_until(
        lambda: (j := cluster.get_job(job["id"]))["status"] != "Running" and j, 60, "the job to finish"
    )
    log = cluster.job_logs(job["id"])[0]
    assert (done["status"], done["exit_code"]) == ("Succeeded", 0), log[-3000:]
    assert "formed: 4 workers (scale_out)" in log and "worker_failure" not in log, log[-3000:]
    report = build_report(data / "ledger-grow", SAMPLES)
    assert [(e["samples"], e["duplicates"], e["missing"]) for e in report["epochs"]] == [(SAMPLES, 0, 0)] * 4
