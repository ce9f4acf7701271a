"""The Megatron-LM framework for real, in containers: the launch hint typed in the launcher
(``elastrain run --mode restart --hostfile /etc/mpi/hostfile python .../megatron_gpt.py``) trains
megatron-core's GPT at tensor parallel 2 x data parallel 1 across the 2 containers, and a job on the
hostfile follows the cluster's scale 2 -> 4 -> 2 (data parallel 1 -> 2 -> 1), every sequence once.

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
CLUSTER = "mg"
EXAMPLE = "/opt/elastrain/examples/megatron_gpt.py"
GLOBAL_BATCH = 16


@pytest.fixture(scope="module")
def data(ccp: ContainerPlane) -> Path:
    return shared_storage(ccp, "mg-data")


@pytest.fixture(scope="module")
def cluster(ccp: ContainerPlane, data: Path) -> Iterator[Client]:
    with framework_cluster(ccp, CLUSTER, "megatron", 2, data) as c:
        yield c


def sequence_ids(samples: Path) -> list[int]:
    """Every sequence id any rank of any start logged (the example's --sample-log)."""
    ids: list[int] = []
    for path in samples.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            ids.extend(json.loads(line)["ids"])
    return ids


def test_launch_hint_trains_tp2_dp1_across_containers(cluster: Client, data: Path) -> None:
    """The hint typed in the launcher exits 0: one rank in each container, TP2 x DP1, the loss falls,
    the two tensor-parallel ranks agree."""
    hint = cluster.get_cluster(CLUSTER).raw["launch_hint"]
    assert hint == f"elastrain run --mode restart --hostfile /etc/mpi/hostfile python {EXAMPLE}", hint
    code, out = run_in(cluster, CLUSTER, *hint.split(), "--steps", "12", "--sample-log", "/data/fixed")
    assert code == 0, out[-4000:]
    assert re.search(r"done: steps=12 tp=2 dp=1 step_ms=[\d.]+ tp_maxdiff=0\.0e\+00", out), out[-3000:]
    assert f"hosts={CLUSTER}-launcher,{CLUSTER}-worker-0" in out, out[-3000:]  # rank 0, rank 1
    losses = [float(v) for v in re.findall(r"step \d+ loss ([\d.]+)", out)]
    assert len(losses) == 12 and losses[-1] < losses[0] - 0.5, losses
    assert sorted(sequence_ids(data / "fixed")) == list(range(12 * GLOBAL_BATCH))


def _steps_at(samples: Path, dp: int) -> int:
    """Steps rank 0 logged at data-parallel size `dp`."""
    return sum(p.read_text().count(f'"dp": {dp},') for p in samples.glob("samples-g*-r0-*.jsonl"))


def test_job_follows_scale_2_to_4_and_back(ccp: ContainerPlane, cluster: Client, data: Path) -> None:
    """`elastrain run --mode restart --min-np 2 --max-np 4` on the hostfile: scale 2 -> 4 makes it
    DP 2 (resumed from the TP-rank checkpoints), 4 -> 2 DP 1 again; it finishes, every sequence once."""
    samples, steps, hold_file = data / "elastic", 40, data / "hold"
    # held from each resize to its first step at the new size: 40 steps of 0.25 s took less time
    # than a scale-out on a loaded machine, and the job ended at DP 1 before it could grow
    command = (
        f"elastrain run --mode restart --min-np 2 --max-np 4 --hostfile /etc/mpi/hostfile python {EXAMPLE} "
        f"--steps {steps} --checkpoint-dir /data/ckpt --sample-log /data/elastic --step-sleep 0.2 "
        "--hold-file /data/hold"
    )

    job = cluster.submit_job(CLUSTER, command.split())
    done, log = follow_scale_out_and_in(
        ccp,
        cluster,
        CLUSTER,
        job["id"],
        lambda dp: _steps_at(samples, dp),
        (1, 2),
        "megatron (DP)",
        hold_with(hold_file),
    )
    assert (done["status"], done["exit_code"]) == ("Succeeded", 0), log[-4000:]
    resumes = re.findall(r"resumed step=\d+ from dp=(\d) to dp=(\d)", log)
    assert resumes == [("1", "2"), ("2", "1")], log[-4000:]
    assert re.search(rf"steps per start dp1:\d+ dp2:\d+ dp1:\d+; sequences {steps * GLOBAL_BATCH}", log), log
    ids = sequence_ids(samples)
    assert sorted(ids) == list(range(steps * GLOBAL_BATCH)), f"{len(ids)} ids, {len(set(ids))} distinct"
