"""The Slurm framework's configuration, rendered from a cluster's hostfile (no Slurm needed)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from elastrain.agent import slurm_services
from elastrain.agent.slurm_conf import (
    SLURM_CONF_PATH,
    container_cpus,
    controller_host,
    hostfile_workers,
    layout,
    render_gres_conf,
    render_slurm_conf,
    render_task_prolog,
    slurm_cluster_name,
    write_if_changed,
)
from elastrain.backends import container_run
from elastrain.hostfile import parse_hostfile
from tests.unit.test_container_backend import spec

ENV = {"ELASTRAIN_CLUSTER": "tt", "USER": "alice", "ELASTRAIN_SLURM_CPUS": "4"}
HOSTFILE = parse_hostfile("# generation: 3\ntt-launcher slots=1\ntt-worker-0 slots=1\ntt-worker-1 slots=8\n")


def conf_lines(text: str, key: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(f"{key}=")]


def test_the_workers_are_the_nodes_and_the_launcher_the_controller() -> None:
    workers = hostfile_workers(HOSTFILE, controller_host("tt"))
    assert workers == {"tt-worker-0": 1, "tt-worker-1": 8}
    text = render_slurm_conf(layout(ENV, workers))
    assert conf_lines(text, "SlurmctldHost") == ["SlurmctldHost=tt-launcher"]
    assert conf_lines(text, "SlurmUser") == ["SlurmUser=alice"]
    assert conf_lines(text, "SlurmdUser") == ["SlurmdUser=alice"]
    assert conf_lines(text, "NodeName") == [
        "NodeName=tt-worker-0 CPUs=4 State=UNKNOWN",
        "NodeName=tt-worker-1 CPUs=8 State=UNKNOWN",  # slots above the CPUs: the slots
    ]
    assert "ProctrackType=proctrack/linuxproc" in text and "TaskPlugin=task/none" in text
    assert "GresTypes" not in text
    # the same hostfile renders the same text (every container renders its own copy)
    assert render_slurm_conf(layout(ENV, workers)) == text


def test_gpus_a_worker_kept_after_leaving_and_no_worker_at_all() -> None:
    env = {**ENV, "CUDA_VISIBLE_DEVICES": "0,1"}
    text = render_slurm_conf(layout(env, {"tt-worker-0": 2}, extra=("tt-worker-5",)))
    assert "GresTypes=gpu" in text
    assert conf_lines(text, "NodeName") == [
        "NodeName=tt-worker-0 CPUs=4 Gres=gpu:2 State=UNKNOWN",
        "NodeName=tt-worker-5 CPUs=4 Gres=gpu:2 State=UNKNOWN",
    ]
    # slurmctld refuses a config without nodes: a placeholder it does not show
    empty = render_slurm_conf(layout(ENV, {}))
    assert conf_lines(empty, "NodeName") == ["NodeName=tt-launcher-noworker CPUs=1 State=FUTURE"]
    assert conf_lines(empty, "PartitionName")[0].startswith("PartitionName=main Nodes=ALL Default=YES")


def test_gres_conf_task_prolog_and_names(tmp_path: Path) -> None:
    env = {"CUDA_VISIBLE_DEVICES": "0,1", "ELASTRAIN_VISIBLE_GPUS": "3,5"}
    assert render_gres_conf(env, dev=tmp_path) == "Name=gpu Count=2\n"  # no device nodes here
    (tmp_path / "nvidia3").touch()
    (tmp_path / "nvidia5").touch()
    assert render_gres_conf(env, dev=tmp_path) == (
        f"Name=gpu File={tmp_path}/nvidia3\nName=gpu File={tmp_path}/nvidia5\n"
    )
    assert render_gres_conf({}) == ""
    prolog = render_task_prolog({"ELASTRAIN_CONTAINER": "tt-worker-1", "HOSTNAME": "tt-worker-1", "X": "y"})
    assert "echo 'export ELASTRAIN_CONTAINER=tt-worker-1'" in prolog and "X=" not in prolog
    assert slurm_cluster_name("My.Cluster-1") == "my_cluster-1"
    path = tmp_path / "a" / "slurm.conf"
    assert write_if_changed(path, "x\n") and not write_if_changed(path, "x\n")
    assert path.read_text() == "x\n"


def test_container_cpus_follow_the_cgroup_quota(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert container_cpus({}, cgroup=tmp_path) == min(2, os.cpu_count() or 1)  # 1.5 CPUs: 2
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert container_cpus({}, cgroup=tmp_path) >= 1
    assert container_cpus({"ELASTRAIN_SLURM_CPUS": "6"}, cgroup=tmp_path) == 6


def test_the_backend_points_slurm_conf_where_the_containers_render_it(tmp_path: Path) -> None:
    assert str(SLURM_CONF_PATH) == container_run.SLURM_CONF
    files = container_run.ClusterFiles(tmp_path, tmp_path / "sockets", "net")

    def env_of(framework: str) -> list[str]:
        args = container_run.run_args(spec(framework=framework), "s", files, "n", "k", tmp_path)
        return [args[i + 1] for i, a in enumerate(args) if a == "--env"]

    assert f"SLURM_CONF={SLURM_CONF_PATH}" in env_of("slurm")
    assert not [e for e in env_of("pytorch") if e.startswith("SLURM_CONF=")]


def test_no_services_without_slurm_in_the_image(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slurm_services, "SLURMD", "/nonexistent/slurmd")
    assert slurm_services.slurm_services("worker", ENV) == []
