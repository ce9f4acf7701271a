"""The container backend's pieces that need no podman: run flags, paths, the node daemon's protocol."""

from __future__ import annotations

import json
import os
import socket
import threading
from pathlib import Path

import pytest

from elastrain.agent.noded import NodeDaemon
from elastrain.backends.api import ContainerSpec, Mount
from elastrain.backends.container import ContainerBackend
from elastrain.backends.nsprocs import container_pids, host_pid


def spec(**extra: object) -> ContainerSpec:
    values: dict[str, object] = {
        "cluster": "c1",
        "cluster_uid": "u1",
        "name": "c1-worker-0",
        "role": "worker",
        "address": "c1-worker-0",
        "gpu_ids": (3, 5),
        "shm_bytes": 256 << 20,
        "image": "localhost/elastrain-pytorch:latest",
        "mounts": (Mount("/srv/data", "/data"),),
        "tenant": "alice",
        "tenant_uid": 20002,
        "memory_bytes": 1 << 30,
        "cpus": 1.5,
    }
    values.update(extra)
    return ContainerSpec(**values)  # type: ignore[arg-type]


def flag_values(args: list[str], flag: str) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args) if a == flag]


def test_run_flags_isolate_the_container(tmp_path: Path) -> None:
    gpus = tmp_path / "dev"
    gpus.mkdir()
    for index in (3, 5, 6):
        (gpus / f"nvidia{index}").touch()
    backend = ContainerBackend(tmp_path / "data")
    backend.gpu_device_dir = gpus
    args = backend._run_args(spec(), "s3cret")
    assert args[-4:] == ["localhost/elastrain-pytorch:latest", "python", "-m", "elastrain.agent.noded"]
    assert flag_values(args, "--user") == ["20002:20002"]
    assert flag_values(args, "--hostname") == ["c1-worker-0"]
    assert flag_values(args, "--network") == [backend.network_name("c1")]
    assert flag_values(args, "--cap-drop") == ["all"]
    assert flag_values(args, "--log-opt") == ["max-size=64m"]  # a tenant's output cannot fill the disk
    assert flag_values(args, "--shm-size") == [f"{256 << 20}b"]
    assert flag_values(args, "--memory") == [f"{1 << 30}b"] and flag_values(args, "--cpus") == ["1.5"]
    volumes = flag_values(args, "--volume")
    base = backend.cluster_dir("c1")
    assert f"{base / 'mpi'}:/etc/mpi:ro" in volumes and "/srv/data:/data" in volumes
    assert not any(v.endswith(":/var/log/jobs") for v in volumes)  # job logs: the launcher only
    assert flag_values(args, "--device") == [f"{gpus}/nvidia3:/dev/nvidia3", f"{gpus}/nvidia5:/dev/nvidia5"]
    env = dict(e.split("=", 1) for e in flag_values(args, "--env") if "=" in e)
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1" and env["NVIDIA_VISIBLE_DEVICES"] == "3,5"
    assert env["HOME"] == "/home/alice" and "ELASTRAIN_NODE_SECRET" in flag_values(args, "--env")
    assert "s3cret" not in " ".join(args)  # named only: its value goes in podman's environment
    labels = dict(v.split("=", 1) for v in flag_values(args, "--label"))
    assert labels["elastrain.cluster"] == "c1" and labels["elastrain.role"] == "worker"
    assert labels["elastrain.server"] == backend.server_key
    launcher = backend._run_args(spec(role="launcher", name="c1-launcher"), "s")
    assert f"{base / 'jobs'}:/var/log/jobs" in flag_values(launcher, "--volume")
    dataset = backend._run_args(spec(mounts=(Mount("/srv/mnist", "/mnist", read_only=True),)), "s")
    assert "/srv/mnist:/mnist:ro" in flag_values(dataset, "--volume")  # an admin's dataset


def test_container_paths_map_to_the_cluster_files_only(tmp_path: Path) -> None:
    backend = ContainerBackend(tmp_path)
    base = backend.cluster_dir("c1")
    base.mkdir(parents=True)
    (base / "mounts.json").write_text(json.dumps({"/data": "/srv/data"}))
    assert backend.container_path("c1", "x", "/etc/mpi/hostfile") == base / "mpi" / "hostfile"
    assert backend.container_path("c1", "x", "/var/log/jobs/3.log") == base / "jobs" / "3.log"
    assert backend.container_path("c1", "x", "/data/ckpt") == Path("/srv/data/ckpt")
    assert backend.container_path("c1", "x", "/home/alice/x.py") == base / "home" / "x.py"
    with pytest.raises(ValueError, match="inside the container only"):
        backend.container_path("c1", "x", "/etc/passwd")
    assert backend.path_inside("c1", "x", "/var/log/jobs/3.log") == "/var/log/jobs/3.log"
    with pytest.raises(ValueError, match="under /etc/mpi"):
        backend.write_cluster_file("c1", "/etc/passwd", "x")


def test_host_processes_are_never_a_containers() -> None:
    assert container_pids(os.getpid()) == {}  # the host's own namespace holds no container
    assert host_pid(os.getpid(), 1) is None


def _request(port: int, message: dict[str, object]) -> list[dict[str, object]]:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall((json.dumps(message) + "\n").encode())
        return [json.loads(line) for line in sock.makefile("rb")]


def test_node_daemon_refuses_a_wrong_secret_and_runs_an_agent_for_the_right_one() -> None:
    daemon = NodeDaemon("right", host="127.0.0.1", port=0)
    threading.Thread(target=daemon.serve_forever, daemon=True).start()
    try:
        refused = _request(daemon.port, {"secret": "wrong", "agent_args": ["--help"], "env": {}})
        assert refused == [{"error": "wrong cluster secret (ELASTRAIN_NODE_SECRET)"}]
        bad = _request(daemon.port, {"secret": "right", "agent_args": "rm -rf /", "env": {}})
        assert "agent_args must be a list" in str(bad[0]["error"])
        ran = _request(daemon.port, {"secret": "right", "agent_args": ["--help"], "env": {"HOME": "/nope"}})
        assert "started" in ran[0] and ran[-1] == {"exit": 0}
        assert "coordinator" in "".join(str(m.get("out", "")) for m in ran)  # the agent's own --help
    finally:
        daemon.server.close()


def test_real_gpus_go_through_cdi_when_the_toolkit_wrote_a_spec(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import elastrain.backends.container_run as container

    cdi = tmp_path / "cdi"
    cdi.mkdir()
    monkeypatch.setattr(container, "CDI_DIRS", (cdi,))
    backend = ContainerBackend(tmp_path / "data")
    backend.gpu_device_dir = tmp_path  # no device nodes here
    real = spec(real_gpus=True)
    assert not container.cdi_gpus_available((cdi,)) and backend._gpu_args(real) == []
    (cdi / "nvidia.yaml").write_text('cdiVersion: 0.5.0\nkind: "nvidia.com/gpu"\ndevices: []\n')
    assert backend._gpu_args(real) == ["--device", "nvidia.com/gpu=3", "--device", "nvidia.com/gpu=5"]
    assert backend._gpu_args(spec()) == []  # virtual GPUs never use CDI
