"""The PyTorch framework for real, in containers: ssh between them with the cluster's keys, and real
``torchrun`` across containers with its c10d rendezvous on the launcher.

One 3-container cluster (launcher + 2 workers) serves every test here; skips where podman cannot run.
"""

from __future__ import annotations

import re
import shutil
import threading
from collections.abc import Iterator

import pytest

from elastrain.client import Client
from elastrain.testing.clusters import run_in
from elastrain.testing.containers import ContainerPlane, shared_storage
from elastrain.testing.jobs import REPO

pytestmark = pytest.mark.timeout(600)
CLUSTER = "pt"


@pytest.fixture(scope="module")
def cluster(ccp: ContainerPlane) -> Iterator[Client]:
    data = shared_storage(ccp, "pt-data")
    shutil.copy(REPO / "examples" / "torchrun_ddp.py", data / "torchrun_ddp.py")
    made = ccp.cli(
        "cluster", "create", CLUSTER, "--framework", "pytorch", "--containers", "3",
        "--mount", f"{data}:/data", "--wait",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    with ccp.client() as c:
        yield c
        c.delete_cluster(CLUSTER)
        c.wait_deleted(CLUSTER, timeout=60)


def test_ssh_between_containers_uses_the_clusters_keys(cluster: Client) -> None:
    """`ssh <cluster>-worker-1` from the launcher: no password, no host-key prompt, the tenant's user,
    the container's own environment; pdsh (DeepSpeed's launcher) reaches every host of the hostfile."""
    code, out = run_in(
        cluster,
        CLUSTER,
        "ssh",
        f"{CLUSTER}-worker-1",
        "hostname; id -un; echo path=$PATH; echo gpus=$CUDA_VISIBLE_DEVICES",
    )
    assert code == 0, out
    assert out.splitlines()[0] == f"{CLUSTER}-worker-1", out
    assert "path=/opt/elastrain/venv/bin:" in out, out
    hosts = ",".join(f"{CLUSTER}-{n}" for n in ("launcher", "worker-0", "worker-1"))
    code, out = run_in(cluster, CLUSTER, "pdsh", "-w", hosts, "hostname")
    assert code == 0, out
    assert sorted(line.split(": ", 1)[1] for line in out.splitlines() if ": " in line) == sorted(
        hosts.split(",")
    )
    # keys are the cluster's own: mounted read-only, not baked into the image
    code, out = run_in(
        cluster, CLUSTER, "sh", "-c", "ls /etc/ssh/ | grep -c ssh_host_ ; touch /etc/elastrain/keys/x"
    )
    assert code != 0 and out.splitlines()[0] == "0", out


def test_torchrun_across_containers(cluster: Client) -> None:
    """Real torchrun on the launcher and a worker (c10d rendezvous on the launcher): 2 nodes train the
    10,000 samples, 5,000 each, and both report the same world."""
    endpoint = f"{CLUSTER}-launcher:29400"
    torchrun = (
        f"torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint {endpoint} "
        "--rdzv-id job1 /data/torchrun_ddp.py --epochs 1"
    )
    results: dict[str, tuple[int, str]] = {}

    def node(container: str | None, key: str) -> None:
        results[key] = run_in(cluster, CLUSTER, *torchrun.split(), container=container)

    threads = [
        threading.Thread(target=node, args=(None, "launcher")),
        threading.Thread(target=node, args=(f"{CLUSTER}-worker-0", "worker")),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    for key, (code, out) in results.items():
        assert code == 0, f"{key}: {out[-3000:]}"
    lines = [ln for _, out in results.values() for ln in out.splitlines() if re.match(r"rank \d/2 ", ln)]
    assert len(lines) == 2, results
    assert all(" samples 5000 " in ln for ln in lines), lines
    hosts = {ln.split(" host ")[1].split()[0] for ln in lines}
    assert hosts == {f"{CLUSTER}-launcher", f"{CLUSTER}-worker-0"}, lines


def test_the_clusters_launch_hint_trains(cluster: Client) -> None:
    """The command the cluster page shows for a PyTorch cluster, typed as shown: every container trains."""
    hint = cluster.get_cluster(CLUSTER).raw["launch_hint"].split("#")[0]
    # the cluster's bounds (2..3 containers: the default minimum is 2), as its first job's range too
    # (elastrain.examples.np_flags)
    assert hint.startswith(
        "elastrain run --min-np 2 --max-np 3 --hostfile /etc/mpi/hostfile python /opt/elastrain/"
    ), hint
    code, out = run_in(cluster, CLUSTER, *hint.split(), "--epochs", "1", "--batch-size", "500")
    assert code == 0, out[-3000:]
    assert "epoch 0 done: world 3" in out, out[-3000:]
