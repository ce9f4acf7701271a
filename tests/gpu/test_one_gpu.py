"""The one-GPU part of the GPU suite: an elastic `elastrain run` whose tensors live on the GPU.

Runs on the host (no podman): two workers on loopback hosts share the machine's one CUDA device, gloo
carrying CUDA tensors (``ELASTRAIN_BACKEND=gloo``; NCCL cannot put two ranks on one device). It covers
what a GPU adds to the CPU suite's paths: the model, batches, gradient buckets and optimizer state on the
GPU through a resize 2 -> 3 (the state broadcast to the newcomer), a kill -9 (survivors go on, at most one
step lost), and a checkpoint of CUDA tensors that a new run resumes from. Skips unless the host's torch
is a CUDA build that sees a device (tests/gpu/conftest.py).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from elastrain.testing.jobs import EXAMPLE, ElasticJob, assert_exactly_once, hosts

pytestmark = [pytest.mark.gpu(devices=1), pytest.mark.timeout(300)]
EPOCHS = 2
GLOO_ON_CUDA = {"ELASTRAIN_BACKEND": "gloo"}


@pytest.fixture(scope="module", autouse=True)
def dataset() -> None:
    """The MNIST-1D cache, made once (the workers then load it in milliseconds)."""
    sys.path.insert(0, str(EXAMPLE.parent))
    import mnist1d_data

    mnist1d_data.load()


def example(workdir: Path, *extra: str, epochs: int = EPOCHS) -> list[str]:
    """The example, slowed per step while the `slow` file exists (the faults happen meanwhile)."""
    workdir.mkdir(parents=True, exist_ok=True)
    slow = workdir / "slow"
    slow.touch()
    return [
        "python",
        str(EXAMPLE),
        "--epochs",
        str(epochs),
        "--step-sleep",
        "0.03",
        "--slow-while",
        str(slow),
        *extra,
    ]


def start(workdir: Path, n: int, run_args: list[str], command: list[str]) -> ElasticJob:
    return ElasticJob(workdir, hosts(n), run_args, command, env=GLOO_ON_CUDA)


def test_gpu_tensors_through_a_resize_and_a_kill_9(tmp_path: Path) -> None:
    job = start(
        tmp_path / "job",
        2,
        ["--min-np", "2", "--max-np", "3", "--join-grace", "20"],
        example(tmp_path / "job"),
    )
    try:
        job.wait_world(2, 5)
        job.set_hosts(hosts(3))
        grown = job.wait_world(3, 5)  # the newcomer got the CUDA state by broadcast
        victim = grown["members"][-1]
        os.kill(victim["pid"], signal.SIGKILL)
        job.wait_world(2, 3)
        (tmp_path / "job" / "slow").unlink()
        assert job.wait() == 0, job.output()
    finally:
        job.cleanup()
    output = (tmp_path / "job" / "job.log").read_text(errors="replace")
    assert "trains on cuda:0" in output and "trains on cpu" not in output, output[-3000:]
    report = job.report()
    failure = next(g for g in report["generations"] if g["cause"] == "worker_failure")
    assert failure["steps_lost"] <= 1, failure
    assert_exactly_once(report, EPOCHS)


def test_a_checkpoint_of_cuda_tensors_resumes_in_a_new_run(tmp_path: Path) -> None:
    checkpoints = tmp_path / "ckpt"
    flags = ["-np", "2", "--checkpoint-dir", str(checkpoints), "--checkpoint-every", "10"]
    first = start(tmp_path / "first", 2, flags, example(tmp_path / "first", epochs=1))
    try:
        (tmp_path / "first" / "slow").unlink()
        assert first.wait() == 0, first.output()
    finally:
        first.cleanup()
    assert any(checkpoints.iterdir()), "the first run wrote no checkpoint"
    second = start(tmp_path / "second", 2, flags, example(tmp_path / "second", epochs=2))
    try:
        (tmp_path / "second" / "slow").unlink()
        assert second.wait() == 0, second.output()
    finally:
        second.cleanup()
    output = (tmp_path / "second" / "job.log").read_text(errors="replace")
    assert "will resume from" in output and "trains on cuda:0" in output, output[-3000:]
    assert "epoch 1 done" in output and "epoch 0 done" not in output, output[-3000:]
