"""The Horovod framework for real, in containers: ``horovodrun`` typed in the launcher runs Horovod's
elastic PyTorch example (elastrain's implementation of the Horovod API), and a running ``horovodrun``
job grows with the cluster 2 -> 4 without restarting its workers.

One cluster serves the module; skips where podman cannot run.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from elastrain.client import Client
from elastrain.testing.clusters import all_running, job_world, run_in
from elastrain.testing.containers import ContainerPlane, framework_cluster, shared_storage
from elastrain.testing.timings import record_timing
from elastrain.testing.waits import wait_until

pytestmark = pytest.mark.timeout(600)
CLUSTER = "hv"
EXAMPLE = "/opt/elastrain/examples/horovod_mnist_elastic.py"


@pytest.fixture(scope="module")
def data(ccp: ContainerPlane) -> Path:
    return shared_storage(ccp, "hv-data")


@pytest.fixture(scope="module")
def cluster(ccp: ContainerPlane, data: Path) -> Iterator[Client]:
    with framework_cluster(ccp, CLUSTER, "horovod", 2, data) as c:
        yield c


def test_horovodrun_runs_horovods_elastic_example(cluster: Client) -> None:
    """The issue's check: `horovodrun -np 2 --hostfile /etc/mpi/hostfile python <example>` exits 0, on
    both containers; the hint shown for the cluster is that command."""
    hint = cluster.get_cluster(CLUSTER).raw["launch_hint"]
    assert hint.startswith("horovodrun -np 2 --hostfile /etc/mpi/hostfile"), hint
    code, out = run_in(cluster, CLUSTER, *hint.split())
    assert code == 0, out[-3000:]
    code, out = run_in(
        cluster,
        CLUSTER,
        "python",
        "-c",
        "import horovod, horovod.torch as h; print(horovod.__version__, h.__name__)",
    )
    assert code == 0 and "elastrain" in out, out


def test_horovodrun_refuses_what_it_cannot_do(cluster: Client) -> None:
    """Unknown flags, --mpi, and -np above the hostfile's slots: one line, non-zero, nothing left."""
    for argv, needle in (
        (["horovodrun", "--no-such-flag", "-np", "2", "python", EXAMPLE], "--no-such-flag"),
        (["horovodrun", "-np", "9", "--hostfile", "/etc/mpi/hostfile", "python", EXAMPLE], "9"),
    ):
        code, out = run_in(cluster, CLUSTER, *argv)
        assert code != 0, out
        lines = [ln for ln in out.splitlines() if ln.strip()]
        assert len(lines) == 1 and needle in lines[0] and "Traceback" not in out, out
    code, out = run_in(cluster, CLUSTER, "sh", "-c", "pgrep -fc '[e]lastrain.agent.agent' || true")
    assert out.strip() == "0", out


def test_running_horovodrun_job_grows_with_the_cluster(
    ccp: ContainerPlane, cluster: Client, data: Path
) -> None:
    """An elastic horovodrun job (--min-np 2 --max-np 4 on the hostfile) takes in the 2 new containers
    of a 2 -> 4 scale without restarting its workers, and finishes, every sample once per epoch."""
    slow = data / "slow"
    slow.touch()  # the batches are slowed while it exists: the job is still training when 4 join
    command = (
        f"horovodrun --min-np 2 --max-np 4 --hostfile /etc/mpi/hostfile python {EXAMPLE} --epochs 3 "
        "--batch-sleep 0.1 --slow-while /data/slow"
    )
    job = cluster.submit_job(CLUSTER, command.split())
    world = job_world(cluster, job["id"])
    wait_until(world(2), 120, "the job to train with 2 workers")
    t0 = time.monotonic()
    cluster.scale_cluster(CLUSTER, 4)
    cluster.wait_cluster(CLUSTER, all_running, timeout=60)
    wait_until(world(4), 120, "the horovodrun job to grow to 4 workers")
    record_timing(ccp, "horovod: scale 2 -> 4 -> training at 4", time.monotonic() - t0)
    slow.unlink()
    done = wait_until(
        lambda: (j := cluster.get_job(job["id"]))["status"] != "Running" and j, 300, "the job to finish"
    )
    log = cluster.job_logs(job["id"])[0]
    assert (done["status"], done["exit_code"]) == ("Succeeded", 0), log[-3000:]
    assert "duplicates=0 missing=0 exactly_once=True" in log, log[-3000:]
    assert re.search(r"\n\s+\d+\s+scale_out\s+4\s", log), log[-1500:]
    cluster.scale_cluster(CLUSTER, 2)
    cluster.wait_cluster(CLUSTER, lambda cl: all_running(cl) and len(cl.containers) == 2, timeout=60)
