"""DeepSpeed ZeRO-2 resized in place under `elastrain run` (native mode), with real processes (gloo).

The survivors of every resize and of a kill -9 keep their PIDs: no process restarts, no checkpoint
file; the ZeRO partitions move between the ranks' memories (`elastrain.deepspeed.ElasticZero`). In
float64 the weights after 2 -> 4 -> 3 -> 2 equal a fixed 2-rank run's within 1e-6, and every sample
is used once per epoch (elastrain's ledger).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from elastrain.report import build_report
from elastrain.testing.jobs import REPO, ElasticJob, hosts

pytest.importorskip("deepspeed")
pytestmark = pytest.mark.timeout(400)

EXAMPLE = REPO / "examples" / "deepspeed_train.py"
ZERO2 = REPO / "examples" / "ds_zero2.json"
ZERO1 = REPO / "examples" / "ds_zero1.json"
EPOCHS = 2
SAMPLES = 4096  # 64 steps of 64 per epoch


def command(workdir: Path, sleep: float = 0.05, config: Path = ZERO2) -> list[str]:
    """The shipped example in float64, slowed per step while `workdir/slow` exists (the faults)."""
    workdir.mkdir(parents=True, exist_ok=True)
    slow = workdir / "slow"
    slow.touch()
    return [
        "python", str(EXAMPLE), "--deepspeed_config", str(config), "--epochs", str(EPOCHS),
        "--samples", str(SAMPLES), "--dtype", "float64", "--params-out", str(workdir / "params.pt"),
        "--step-sleep", str(sleep), "--hold-file", str(slow),
    ]  # fmt: skip


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    """The weights of a fixed 2-rank run: what every resized run must end with."""
    work = tmp_path_factory.mktemp("reference")
    job = ElasticJob(work, hosts(2), ["-np", "2"], command(work, sleep=0.0))
    try:
        (work / "slow").unlink()
        assert job.wait() == 0, job.output()
    finally:
        job.cleanup()
    return dict(torch.load(work / "params.pt"))


@pytest.fixture
def ds_job(tmp_path: Path) -> Callable[..., ElasticJob]:
    jobs: list[ElasticJob] = []

    def start(n: int, run_args: list[str], config: Path = ZERO2) -> ElasticJob:
        job = ElasticJob(tmp_path, hosts(n), run_args, command(tmp_path, config=config))
        jobs.append(job)
        return job

    yield start
    for job in jobs:
        job.cleanup()


def assert_same_weights(reference: dict[str, torch.Tensor], path: Path) -> None:
    final = torch.load(path)
    for name, ref in reference.items():
        diff = (ref - final[name]).abs().max().item()
        assert diff < 1e-6, (name, diff)


def pids(generation: dict) -> dict[str, int]:
    return {m["worker_id"]: m["pid"] for m in generation["members"]}


def epochs_once(report: dict) -> None:
    assert [e["epoch"] for e in report["epochs"]] == list(range(EPOCHS)), report["epochs"]
    for epoch in report["epochs"]:
        assert epoch["duplicates"] == 0 and epoch["missing"] == 0, epoch


def test_zero2_resizes_2_4_3_2_in_place_with_the_fixed_size_trajectory(
    ds_job: Callable[..., ElasticJob], tmp_path: Path, reference: dict[str, torch.Tensor]
) -> None:
    job = ds_job(2, ["--min-np", "2", "--max-np", "4", "--join-grace", "20"])
    first = job.wait_world(2, 3)
    job.set_hosts(hosts(4))
    grown = job.wait_world(4, 3)
    job.set_hosts(hosts(3))
    job.wait_world(3, 3)
    job.set_hosts(hosts(2))
    last = job.wait_world(2, 3)
    (tmp_path / "slow").unlink()
    assert job.wait() == 0, job.output()
    original = pids(first)
    assert {w: p for w, p in pids(grown).items() if w in original} == original  # no restart
    assert pids(last) == original
    report = build_report(job.ledger, SAMPLES)
    assert [g["world_size"] for g in report["generations"]] == [2, 4, 3, 2]
    assert len(re.findall(r"resized in place at step \d+: dp \d -> \d", job.output())) == 3, job.output()[
        -3000:
    ]
    epochs_once(report)
    assert_same_weights(reference, tmp_path / "params.pt")


def test_zero1_two_neighbours_leave_at_once_then_a_killed_rank_costs_at_most_one_step(
    ds_job: Callable[..., ElasticJob], tmp_path: Path, reference: dict[str, torch.Tensor]
) -> None:
    """ZeRO-1 (optimizer state partitioned, gradients all-reduced): 4 -> 2 drops ranks 2 and 3, each
    the other's ring replica (every rank gathers every partition before a planned change), then 3 -> a
    kill -9 -> 2 rebuilds the dead rank's partition from its replica. It ends on the ZeRO-2 reference."""
    job = ds_job(4, ["--min-np", "2", "--max-np", "4"], ZERO1)
    job.wait_world(4, 3)
    job.set_hosts(hosts(2))
    job.wait_world(2, 3)
    job.set_hosts(hosts(3))
    gen = job.wait_world(3, 3)
    victim = gen["members"][1]
    os.kill(victim["pid"], signal.SIGKILL)
    after = job.wait_world(2, 2)
    (tmp_path / "slow").unlink()
    assert job.wait() == 0, job.output()
    survivors = {w: p for w, p in pids(gen).items() if w != victim["worker_id"]}
    assert pids(after) == survivors  # the survivors rebuilt the lost partition from its replica
    report = build_report(job.ledger, SAMPLES)
    assert [g["world_size"] for g in report["generations"]][:3] == [4, 2, 3]
    failure = next(g for g in report["generations"] if g["cause"] == "worker_failure")
    assert failure["steps_lost"] <= 1, failure
    epochs_once(report)
    assert_same_weights(reference, tmp_path / "params.pt")


def test_a_stopped_zero2_job_resumes_from_its_durable_partitions(
    tmp_path: Path, reference: dict[str, torch.Tensor]
) -> None:
    """Both copies of every partition gone (the whole job killed): a new run resumes from the last
    step-based checkpoint, its ZeRO partitions included, and ends on the reference's weights."""
    checkpoints = tmp_path / "ckpt"
    flags = ["-np", "2", "--checkpoint-dir", str(checkpoints), "--checkpoint-every", "8"]
    first = ElasticJob(tmp_path / "first", hosts(2), flags, command(tmp_path / "first"))
    try:
        first.wait_world(2, 20)
        for pid in first.known_pids():  # every process at once, as a lost machine would
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        first.proc.wait(timeout=30)
    finally:
        first.cleanup()
    assert any((checkpoints / "zero").glob("step-*/rank-00001-of-00002.pt"))
    second = ElasticJob(tmp_path / "second", hosts(2), flags, command(tmp_path / "second"))
    try:
        (tmp_path / "second" / "slow").unlink()
        assert second.wait() == 0, second.output()
        output = second.output()
    finally:
        second.cleanup()
    assert re.search(r"resumed from .* at step (8|16|24)", output), output[-3000:]
    assert_same_weights(reference, tmp_path / "second" / "params.pt")
