"""The Horovod framework for real, in containers: ``horovodrun`` typed in the launcher runs Horovod's
elastic PyTorch example (elastrain's implementation of the Horovod API), and a running ``horovodrun``
job grows with the cluster 2 -> 4 without restarting its workers.

One cluster serves the module; skips where podman cannot run.
"""

# ruff: noqa: F811 - `ccp` and `image` are fixtures imported by name
from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from elastrain.client import Client
from tests.integration.containers import ContainerPlane, ccp, framework_image, image  # noqa: F401
from tests.integration.test_containers import run_in, shared_storage
from tests.integration.test_control_plane import all_running, job_world, record_timing, wait_for

pytestmark = pytest.mark.timeout(600)
CLUSTER = "hv"
EXAMPLE = "/opt/elastrain/examples/horovod_mnist_elastic.py"


@pytest.fixture(scope="module")
def cluster(ccp: ContainerPlane) -> Iterator[Client]:
    framework_image("horovod")
    data = shared_storage(ccp, "hv-data")
    made = ccp.cli(
        "cluster", "create", CLUSTER, "--framework", "horovod", "--containers", "2",
        "--mount", f"{data}:/data", "--wait",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    with ccp.client() as c:
        assert c.get_cluster(CLUSTER).image.startswith("localhost/elastrain-horovod")
        yield c
        c.delete_cluster(CLUSTER)
        c.wait_deleted(CLUSTER, timeout=60)


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


def test_running_horovodrun_job_grows_with_the_cluster(ccp: ContainerPlane, cluster: Client) -> None:
    """An elastic horovodrun job (--min-np 2 --max-np 4 on the hostfile) takes in the 2 new containers
    of a 2 -> 4 scale without restarting its workers, and finishes."""
    command = f"horovodrun --min-np 2 --max-np 4 --hostfile /etc/mpi/hostfile python {EXAMPLE} --epochs 6"
    job = cluster.submit_job(CLUSTER, command.split())
    world = job_world(cluster, job["id"])
    wait_for(world(2), 120, "the job to train with 2 workers")
    t0 = time.monotonic()
    cluster.scale_cluster(CLUSTER, 4)
    cluster.wait_cluster(CLUSTER, all_running, timeout=60)
    wait_for(world(4), 120, "the horovodrun job to grow to 4 workers")
    record_timing(ccp, "horovod: scale 2 -> 4 -> training at 4", time.monotonic() - t0)
    done = wait_for(
        lambda: (j := cluster.get_job(job["id"]))["status"] != "Running" and j, 300, "the job to finish"
    )
    assert (done["status"], done["exit_code"]) == ("Succeeded", 0), cluster.job_logs(job["id"])[0][-3000:]
    cluster.scale_cluster(CLUSTER, 2)
    cluster.wait_cluster(CLUSTER, lambda cl: all_running(cl) and len(cl.containers) == 2, timeout=60)
