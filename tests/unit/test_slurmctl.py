"""The Slurm backend's pure helpers: GPU gres counts, node usability, batch script, sbatch options."""

from __future__ import annotations

from pathlib import Path

from elastrain.backends.api import ContainerSpec
from elastrain.backends.slurm import SlurmBackend, _batch_script, job_name
from elastrain.backends.slurmctl import SlurmJob, SlurmNode, gres_gpus


def test_gres_gpus() -> None:
    assert gres_gpus("gpu:4") == 4
    assert gres_gpus("gpu:a100:2(S:0)") == 2
    assert gres_gpus("gpu:a100:2,gpu:v100:1,mps:100") == 3
    assert gres_gpus("") == 0 and gres_gpus("(null)") == 0


def test_node_usable() -> None:
    assert SlurmNode("n1", "idle").usable and SlurmNode("n1", "mixed").usable
    assert not SlurmNode("n1", "mixed", ("DRAIN",), "test").usable
    assert not SlurmNode("n1", "down").usable
    assert SlurmNode("n1", "mixed", ("DRAIN",), "test").describe() == "mixed+drain (test)"


def test_job_active() -> None:
    assert SlurmJob(1, "x", "RUNNING", "n1", "/").active
    assert not SlurmJob(1, "x", "CANCELLED", "n1", "/").active
    assert not SlurmJob(1, "x", "COMPLETING", "n1", "/").active


def test_sbatch_args_and_script(tmp_path: Path) -> None:
    backend = SlurmBackend(tmp_path, env={}, cpus_per_container=2, mem_per_container_mb=1024, partition="gpu")
    spec = ContainerSpec("c", "uid", "c-worker-0", "worker", "127.1.0.2", gpu_ids=(0, 1))
    args = backend._sbatch_args(spec, tmp_path / "root")
    assert f"--job-name={job_name('c', 'c-worker-0')}" in args and "--job-name=elastrain-c-c-worker-0" in args
    wanted = {"--gres=gpu:2", "--cpus-per-task=2", "--mem=1024M", "--partition=gpu", "--no-requeue"}
    assert wanted <= set(args)
    no_gpu = backend._sbatch_args(ContainerSpec("c", "uid", "c-launcher", "launcher", "127.1.0.1"), tmp_path)
    assert not any(a.startswith("--gres") for a in no_gpu)
    script = _batch_script(tmp_path / "root", "127.1.0.2")
    assert script.startswith("#!/bin/sh\n") and "exec " in script
    assert "elastrain.backends.container_proc" in script and "--address 127.1.0.2" in script
