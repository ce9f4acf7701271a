"""Real GPUs through the container backend: one GPU per container, NCCL across containers, 2 -> 4 -> 2.

The server is started without ``--gpus``, so its inventory holds the GPUs ``nvidia-smi -L`` lists
(``real``): each container gets its own GPU (CUDA device 0 inside), plus nvidiactl and nvidia-uvm.
Skips (tests/gpu/conftest.py) unless >= 2 CUDA devices exist and podman runs containers; the
2 -> 4 -> 2 test skips below 4 GPUs.

What the GPU machine must give the containers (checked first, with the fix in the message): a CUDA
build of torch in the image, and the NVIDIA user-space driver (libcuda.so.1), which the plain
``--device /dev/nvidiaN`` nodes do not bring in (the NVIDIA container toolkit's CDI spec does).
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from elastrain.client import Client
from elastrain.report import build_report
from elastrain.testing.clusters import all_running, job_world, run_in
from elastrain.testing.containers import ContainerPlane, shared_storage
from elastrain.testing.waits import wait_until

pytestmark = [pytest.mark.gpu(devices=2, podman=True), pytest.mark.timeout(900)]
SAMPLES = 10000
EPOCHS = 6

# Facts about CUDA in a container, as JSON: what is missing shows which fix the machine needs.
GPU_FACTS = r"""
import ctypes, json, os, shutil, subprocess
facts = {
    "env": {k: os.environ.get(k) for k in
            ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "ELASTRAIN_VISIBLE_GPUS")},
    "dev": sorted(n for n in os.listdir("/dev") if n.startswith("nvidia")),
}
try:
    ctypes.CDLL("libcuda.so.1")
    facts["libcuda"] = ""
except OSError as exc:
    facts["libcuda"] = str(exc)
import torch
facts["torch"], facts["torch_cuda"] = torch.__version__, torch.version.cuda
facts["count"] = torch.cuda.device_count()
if facts["count"]:
    props = torch.cuda.get_device_properties(0)
    facts["name"], facts["uuid"] = props.name, str(getattr(props, "uuid", "") or "")
smi = shutil.which("nvidia-smi")
if smi:
    done = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60)
    facts["smi"] = done.stdout + done.stderr
print("FACTS " + json.dumps(facts), flush=True)
"""

# One all-reduce on the group elastrain builds: which backend, on which device, with what result.
PROBE = '''"""Print the process group's backend and do one all-reduce on its device (tests/gpu)."""
import torch
import torch.distributed as dist

import elastrain

elastrain.init()
state = elastrain.State(checks=0)


@elastrain.run
def probe(state):
    device = elastrain.get_runtime().groups.device
    value = torch.full((1,), float(state.rank + 1), device=device)
    dist.all_reduce(value)
    print(
        f"probe rank={state.rank} world={state.world_size} backend={dist.get_backend()} "
        f"device={value.device.type} sum={value.item():g} cuda_devices={torch.cuda.device_count()}",
        flush=True,
    )


probe(state)
'''
PROBE_LINE = re.compile(
    r"probe rank=(\d+) world=(\d+) backend=(\S+) device=(\S+) sum=(\S+) cuda_devices=(\d+)"
)


class RealGpuPlane(ContainerPlane):
    """A server on the container backend without ``--gpus``: its inventory detects the real GPUs."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, gpu_dir=None, gpus=None)  # the real /dev and the detected GPUs


@pytest.fixture(scope="module")
def gcp(image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealGpuPlane]:
    """The server on the real GPUs (its inventory must say so: otherwise no nvidiactl/nvidia-uvm)."""
    root = tmp_path_factory.mktemp("gcp")
    plane = RealGpuPlane(root)
    plane.start()
    try:
        with plane.client() as c:
            inventory = c.inventory()
        assert inventory["real"] and inventory["gpus"] >= 2, (
            f"the server did not detect >= 2 real GPUs with `nvidia-smi -L`: {inventory}"
        )
        yield plane
    finally:
        plane.cleanup()


def host_gpu_uuids() -> dict[int, str]:
    """nvidia-smi index -> GPU UUID on this machine (the inventory's GPU ids are these indexes)."""
    done = subprocess.run(
        ["nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    rows = [line.split(",") for line in done.stdout.splitlines() if line.strip()]
    return {int(index): normal_uuid(uuid) for index, uuid in rows}


def normal_uuid(text: str) -> str:
    """``GPU-1a2b...`` (nvidia-smi) and ``1a2b...`` (torch) -> ``1a2b...``."""
    text = text.strip().lower()
    return text[len("gpu-") :] if text.startswith("gpu-") else text


def gpu_facts(c: Client, cluster: str, container: str) -> dict[str, object]:
    code, out = run_in(c, cluster, "python", "-c", GPU_FACTS, container=container)
    line = next((x for x in out.splitlines() if x.startswith("FACTS ")), None)
    assert code == 0 and line is not None, f"{container}: the CUDA facts script failed: {out[-3000:]}"
    return dict(json.loads(line[len("FACTS ") :]))


def check_cuda_is_usable(container: str, facts: dict[str, object]) -> None:
    """The two things the GPU machine must give every container, each with its fix."""
    assert facts["torch_cuda"], (
        f"{container}: the image's torch {facts['torch']} is a CPU build; a GPU cluster needs a CUDA "
        "torch wheel in the image (elastrain/images/wheels.py accepts +cpu wheels only)"
    )
    assert facts["libcuda"] == "", (
        f"{container}: the NVIDIA user-space driver is not in the container ({facts['libcuda']}; "
        f"device nodes {facts['dev']}): plain --device /dev/nvidiaN brings no libcuda.so.1; the "
        "backend must pass --device nvidia.com/gpu=N (CDI: `nvidia-ctk cdi generate`, /etc/cdi)"
    )


def probe_backend(c: Client, cluster: str, data: Path, np: int) -> list[tuple[str, ...]]:
    """Run the probe under `elastrain run -np N` in the launcher: one (rank, world, backend, device,
    sum, cuda devices) row per worker, sorted by rank."""
    (data / "probe.py").write_text(PROBE)
    run = f"elastrain run -np {np} --hostfile /etc/mpi/hostfile python /data/probe.py"
    code, out = run_in(c, cluster, *run.split())
    assert code == 0, out[-3000:]
    rows = sorted(PROBE_LINE.findall(out))
    assert len(rows) == np, out[-3000:]
    return rows


def test_each_container_sees_its_own_gpu(gcp: RealGpuPlane) -> None:
    """2 containers x 1 GPU: each sees exactly one GPU (CUDA device 0), the one the server assigned it."""
    with gcp.client() as c:
        c.create_cluster("gpus", framework="pytorch", containers=2, gpus_per_container=1)
        cluster = c.wait_cluster("gpus", all_running, timeout=120)
        assigned = sorted(g for k in cluster.containers for g in k.gpu_ids)
        assert len(assigned) == 2 and len(set(assigned)) == 2, assigned
        host = host_gpu_uuids()
        uuids = {}
        for k in cluster.containers:
            facts = gpu_facts(c, "gpus", k.name)
            env = facts["env"]
            assert isinstance(env, dict) and env["CUDA_VISIBLE_DEVICES"] == "0", (k.name, facts)
            assert env["ELASTRAIN_VISIBLE_GPUS"] == str(k.gpu_ids[0]), (k.name, facts)
            check_cuda_is_usable(k.name, facts)

            code, out = run_in(
                c,
                "gpus",
                "python",
                "-c",
                "import torch; print(torch.cuda.device_count(), torch.cuda.get_device_name(0))",
                container=k.name,
            )
            assert code == 0 and out.strip().splitlines()[-1].startswith("1 "), (k.name, out[-3000:])
            assert facts["count"] == 1, (k.name, facts)
            if "smi" in facts:  # nvidia-smi is in the container (CDI mounts it): it lists one GPU
                listed = [line for line in str(facts["smi"]).splitlines() if line.startswith("GPU ")]
                assert len(listed) == 1, (k.name, facts["smi"])
                if facts.get("uuid"):
                    assert normal_uuid(str(facts["uuid"])) in listed[0].lower(), (k.name, facts)
            if facts.get("uuid"):
                uuids[k.name] = normal_uuid(str(facts["uuid"]))
                assert uuids[k.name] == host[k.gpu_ids[0]], (
                    f"{k.name} was assigned GPU {k.gpu_ids[0]} (nvidia-smi index, UUID "
                    f"{host[k.gpu_ids[0]]}) but sees UUID {uuids[k.name]}: /dev/nvidiaN is numbered by "
                    "the driver's minor number, which need not equal the nvidia-smi index"
                )
        if len(uuids) == 2:
            assert len(set(uuids.values())) == 2, f"two containers share a GPU: {uuids}"
        c.delete_cluster("gpus")
        c.wait_deleted("gpus", timeout=120)


def test_nccl_backend_across_containers(gcp: RealGpuPlane) -> None:
    """2 containers x 1 GPU: elastrain's group is NCCL on the GPU, and an all-reduce crosses containers."""
    data = shared_storage(gcp, "nccl-probe")
    with gcp.client() as c:
        c.create_cluster(
            "probe", framework="pytorch", containers=2, gpus_per_container=1,
            shm="512Mi", mounts=[f"{data}:/data"],
        )  # fmt: skip
        cluster = c.wait_cluster("probe", all_running, timeout=120)
        check_cuda_is_usable(cluster.containers[0].name, gpu_facts(c, "probe", cluster.containers[0].name))
        rows = probe_backend(c, "probe", data, 2)
        assert rows == [
            ("0", "2", "nccl", "cuda", "3", "1"),
            ("1", "2", "nccl", "cuda", "3", "1"),
        ], rows
        c.delete_cluster("probe")
        c.wait_deleted("probe", timeout=120)


def test_nccl_elastic_training_2_4_2_across_containers(gcp: RealGpuPlane) -> None:
    """An elastic job on NCCL follows the cluster 2 -> 4 -> 2 containers; every epoch exactly once."""
    with gcp.client() as c:
        gpus = int(c.inventory()["gpus"])
    if gpus < 4:
        pytest.skip(f"the 2 -> 4 -> 2 step needs 4 GPUs (this machine has {gpus})")
    data = shared_storage(gcp, "nccl-elastic")
    slow = data / "slow"  # the job sleeps per step only while this exists: no race with the resizes
    slow.touch()
    with gcp.client() as c:
        c.create_cluster(
            "elastic", framework="pytorch", containers=2, gpus_per_container=1,
            min_containers=2, max_containers=4, shm="512Mi", mounts=[f"{data}:/data"],
        )  # fmt: skip
        cluster = c.wait_cluster("elastic", all_running, timeout=120)
        check_cuda_is_usable(cluster.containers[0].name, gpu_facts(c, "elastic", cluster.containers[0].name))
        assert {row[2] for row in probe_backend(c, "elastic", data, 2)} == {"nccl"}

        run = "elastrain run -v --min-np 2 --max-np 4 --hostfile /etc/mpi/hostfile --ledger /data/ledger"
        run += " --join-grace 10"  # both new containers join one generation of 4
        train = f"python /data/mnist_elastic.py --epochs {EPOCHS} --batch-size 200"
        train += " --step-sleep 0.5 --slow-while /data/slow"  # <= 150 s at full size
        job = c.submit_job("elastic", f"{run} {train}".split())
        world = job_world(c, job["id"])
        wait_until(world(2), 180, "the job to train with 2 workers")
        c.scale_cluster("elastic", 4)
        c.wait_cluster("elastic", all_running, timeout=120)
        wait_until(world(4), 180, "the job to grow to 4 workers")
        c.scale_cluster("elastic", 2)
        wait_until(world(2), 180, "the job to shrink back to 2 workers")
        slow.unlink()
        done = wait_until(
            lambda: (j := c.get_job(job["id"]))["status"] != "Running" and j, 600, "the job to finish"
        )
        log = c.job_logs(job["id"])[0]
        assert (done["status"], done["exit_code"]) == ("Succeeded", 0), log[-3000:]
        grown = log.find("formed: 4 workers")
        assert grown != -1 and "formed: 2 workers (scale_in)" in log[grown:], log[-3000:]

        report = build_report(data / "ledger", SAMPLES)
        epochs = [(e["samples"], e["duplicates"], e["missing"]) for e in report["epochs"]]
        assert epochs == [(SAMPLES, 0, 0)] * EPOCHS, report["epochs"]
        sizes = [g["world_size"] for g in report["generations"]]
        assert sizes == [2, 4, 2], report["generations"]
        c.delete_cluster("elastic")
        c.wait_deleted("elastic", timeout=120)
