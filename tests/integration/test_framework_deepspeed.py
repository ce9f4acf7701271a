"""The DeepSpeed framework for real, in containers: DeepSpeed's own launcher (pdsh over the cluster's
sshd) typed in the launcher trains ZeRO-2 across containers, and a ZeRO-2 job under
``elastrain run --mode restart`` grows with the cluster 2 -> 4 and shrinks back, every sample once.

One cluster serves the module; skips where podman cannot run.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from elastrain.client import Client
from elastrain.testing.clusters import run_in
from elastrain.testing.containers import (
    ContainerPlane,
    follow_scale_out_and_in,
    framework_cluster,
    hold_with,
    shared_storage,
)

pytestmark = pytest.mark.timeout(600)
CLUSTER = "ds"
EXAMPLES = "/opt/elastrain/examples"
SAMPLES, EPOCHS = 4096, 2


@pytest.fixture(scope="module")
def data(ccp: ContainerPlane) -> Path:
    return shared_storage(ccp, "ds-data")


@pytest.fixture(scope="module")
def cluster(ccp: ContainerPlane, data: Path) -> Iterator[Client]:
    with framework_cluster(ccp, CLUSTER, "deepspeed", 2, data) as c:
        yield c


def test_deepspeed_launcher_trains_zero2_across_containers(cluster: Client, data: Path) -> None:
    """The issue's check: `deepspeed --hostfile /etc/mpi/hostfile deepspeed_train.py --deepspeed_config
    ds_zero2.json` typed in the launcher exits 0, with one rank in each container (pdsh over ssh)."""
    hint = cluster.get_cluster(CLUSTER).raw["launch_hint"]
    assert hint.startswith("deepspeed --hostfile /etc/mpi/hostfile"), hint
    code, out = run_in(cluster, CLUSTER, *hint.split(), "--epochs", "1", "--sample-log", "/data/fixed")
    assert code == 0, out[-4000:]
    assert "samples_per_rank=[4096, 4096]" in out or "total 4096" in out, out[-3000:]
    hosts = set(re.findall(rf"({CLUSTER}-(?:launcher|worker-\d+)): ", out))
    assert hosts == {f"{CLUSTER}-launcher", f"{CLUSTER}-worker-0"}, out[-3000:]
    assert sorted(sample_ids(data / "fixed")[0]) == list(range(SAMPLES))


def test_a_config_that_does_not_parse_is_one_line_per_rank(cluster: Client, data: Path) -> None:
    """A DeepSpeed config that is not JSON: non-zero exit, the reason (file and fix) from each rank,
    no traceback, nothing left running in any container."""
    (data / "bad.json").write_text('{"train_batch_size": 64,,}')
    command = f"deepspeed --hostfile /etc/mpi/hostfile {EXAMPLES}/deepspeed_train.py --deepspeed_config"
    code, out = run_in(cluster, CLUSTER, *command.split(), "/data/bad.json")
    assert code != 0, out[-3000:]
    assert "--deepspeed_config /data/bad.json is not valid JSON" in out and "fix the file" in out, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    for container in (None, f"{CLUSTER}-worker-0"):
        code, left = run_in(
            cluster, CLUSTER, "sh", "-c", "pgrep -fc '[d]eepspeed_train' || true", container=container
        )
        assert left.strip() == "0", left


def sample_ids(samples: Path) -> dict[int, list[int]]:
    """Epoch -> the sample ids every rank of every start logged (the example's --sample-log)."""
    by_epoch: dict[int, list[int]] = {}
    for path in samples.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            by_epoch.setdefault(record["epoch"], []).extend(record["ids"])
    return by_epoch


def _steps_at(samples: Path, world: int) -> int:
    """Steps rank 0 logged at data-parallel size `world`."""
    return sum(path.read_text().count(f'"world": {world},') for path in samples.glob("samples-g*-r0-*.jsonl"))


def test_zero2_job_grows_and_shrinks_with_the_cluster(
    ccp: ContainerPlane, cluster: Client, data: Path
) -> None:
    """A ZeRO-2 job under `elastrain run --mode restart` on the hostfile follows scale 2 -> 4 -> 2:
    it resumes at each new data-parallel size from a universal checkpoint, every sample once."""
    samples, hold_file = data / "elastic", data / "hold"
    # held from each resize to its first step at the new size (as the Megatron test): on a loaded
    # machine the job could otherwise end before a resize took effect
    command = (
        "elastrain run --mode restart --min-np 2 --max-np 4 --hostfile /etc/mpi/hostfile "
        f"python {EXAMPLES}/deepspeed_train.py --deepspeed_config {EXAMPLES}/ds_zero2.json "
        f"--epochs {EPOCHS} --checkpoint-dir /data/ckpt --sample-log /data/elastic --step-sleep 0.1 "
        "--hold-file /data/hold"
    )
    job = cluster.submit_job(CLUSTER, command.split())
    done, log = follow_scale_out_and_in(
        ccp,
        cluster,
        CLUSTER,
        job["id"],
        lambda world: _steps_at(samples, world),
        (2, 4),
        "deepspeed ZeRO-2",
        hold_with(hold_file),
    )
    assert (done["status"], done["exit_code"]) == ("Succeeded", 0), log[-4000:]
    resumes = re.findall(r"resumed step=\d+ .* from dp=(\d) to dp=(\d) universal=(\w+)", log)
    assert resumes == [("2", "4", "True"), ("4", "2", "True")], log[-4000:]
    by_epoch = sample_ids(samples)
    assert sorted(by_epoch) == list(range(EPOCHS))
    for epoch, ids in by_epoch.items():
        assert sorted(ids) == list(range(SAMPLES)), f"epoch {epoch}: {len(ids)} ids, {len(set(ids))} distinct"
