"""Resource figures: cgroup v1/v2 and /proc readers, NVML's "no GPUs", the usage route, gpu_type.

Fast: no containers. The cgroup trees of the v1/v2 tests are written out as the kernel lays them out
(a ``/proc/PID/cgroup``, a ``mountinfo`` and the controller files); the hybrid test reads this
machine's own cgroup (or, in a container, the container's).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from elastrain.backends.usage import (
    NO_GPUS,
    Nvml,
    UsageSource,
    cgroup_mounts,
    cgroup_paths,
    cgroup_usage,
    processes_usage,
)
from elastrain.server.create_checks import check_gpu_type
from elastrain.server.errors import Conflict
from elastrain.testing.app import AppUnderTest, make_app

V1_MOUNTINFO = """\
25 24 0:22 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
30 25 0:26 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime - cgroup cgroup rw,cpu,cpuacct
31 25 0:27 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:13 - cgroup cgroup rw,memory
32 25 0:28 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw
"""
V2_MOUNTINFO = "29 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw\n"


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v1_figures_come_from_cpuacct_and_memory(tmp_path: Path) -> None:
    proc, sys_root = tmp_path / "proc", tmp_path / "sys"
    group = "/libpod_parent/libpod-abc"
    write(proc / "42" / "cgroup", f"5:memory:{group}\n3:cpu,cpuacct:{group}\n0::/\n")
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(V1_MOUNTINFO.replace("/sys/fs/cgroup", str(sys_root)))
    cpu = sys_root / "cpu,cpuacct" / group.lstrip("/")
    memory = sys_root / "memory" / group.lstrip("/")
    write(cpu / "cpuacct.usage", "2500000000\n")
    write(memory / "memory.usage_in_bytes", str(300 << 20))
    write(memory / "memory.stat", f"cache 1\ntotal_inactive_file {100 << 20}\n")
    write(memory / "memory.limit_in_bytes", str(1 << 30))

    usage = cgroup_usage(42, proc, mountinfo)

    assert usage.source == UsageSource.cgroup
    assert usage.cpu_seconds == pytest.approx(2.5)
    assert (usage.memory_bytes, usage.memory_limit_bytes) == (200 << 20, 1 << 30)
    write(memory / "memory.limit_in_bytes", "9223372036854771712")  # v1's "no limit"
    assert cgroup_usage(42, proc, mountinfo).memory_limit_bytes is None


def test_a_container_reads_its_own_cgroup_mounted_at_the_controllers_mountpoint(tmp_path: Path) -> None:
    """podman on cgroup v1 mounts the container's own group as each controller's root (no cgroup ns)."""
    proc, sys_root = tmp_path / "proc", tmp_path / "sys"
    group = "/libpod_parent/libpod-abc"
    write(proc / "9" / "cgroup", f"4:memory:{group}\n2:cpuacct:{group}\n1:cpu:{group}\n0::{group}\n")
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        f"558 550 0:69 / {sys_root} rw,nosuid - tmpfs tmpfs rw,mode=755\n"
        f"560 558 0:30 {group} {sys_root}/cpuacct ro,nosuid,relatime - cgroup cgroup rw,cpuacct\n"
        f"562 558 0:32 {group} {sys_root}/memory ro,nosuid,relatime - cgroup cgroup rw,memory\n"
    )
    write(sys_root / "cpuacct" / "cpuacct.usage", "750000000\n")
    write(sys_root / "memory" / "memory.usage_in_bytes", str(80 << 20))

    usage = cgroup_usage(9, proc, mountinfo)

    assert (usage.source, usage.cpu_seconds, usage.memory_bytes) == (
        UsageSource.cgroup,
        pytest.approx(0.75),
        80 << 20,
    )


def test_cgroup_v2_figures_come_from_cpu_stat_and_memory_current(tmp_path: Path) -> None:
    proc, sys_root = tmp_path / "proc", tmp_path / "sys"
    write(proc / "7" / "cgroup", "0::/machine.slice/libpod-abc.scope/container\n")
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(V2_MOUNTINFO.replace("/sys/fs/cgroup", str(sys_root)))
    base = sys_root / "machine.slice" / "libpod-abc.scope" / "container"
    write(base / "cpu.stat", "usage_usec 1250000\nuser_usec 1000000\nsystem_usec 250000\n")
    write(base / "memory.current", str(64 << 20))
    write(base / "memory.stat", f"anon 1\ninactive_file {16 << 20}\n")
    write(base / "memory.max", "max\n")

    usage = cgroup_usage(7, proc, mountinfo)

    assert (usage.source, usage.cpu_seconds) == (UsageSource.cgroup, pytest.approx(1.25))
    assert (usage.memory_bytes, usage.memory_limit_bytes) == (48 << 20, None)
    write(base / "memory.max", str(512 << 20))
    assert cgroup_usage(7, proc, mountinfo).memory_limit_bytes == 512 << 20


def test_an_ended_process_has_no_figures_not_zeroes(tmp_path: Path) -> None:
    usage = cgroup_usage(123456, tmp_path, tmp_path / "mountinfo")
    assert (
        usage.source == UsageSource.unavailable and usage.cpu_seconds is None and usage.memory_bytes is None
    )
    assert "ended" in usage.note


def test_this_machines_own_cgroup_is_read() -> None:
    """Whatever the layout here (v1, v2 or hybrid), this process's cgroup has CPU and memory figures."""
    paths, mounts = cgroup_paths(os.getpid()), cgroup_mounts()
    if not paths or not mounts:
        pytest.skip("no cgroup file system mounted here")
    usage = cgroup_usage(os.getpid())
    assert usage.source == UsageSource.cgroup, usage.note
    assert usage.cpu_seconds is not None and usage.cpu_seconds > 0
    assert usage.memory_bytes is None or usage.memory_bytes > 0


def test_processes_are_summed_from_proc() -> None:
    usage = processes_usage([os.getpid(), 2**22 + 1])  # the second never exists (pid_max is at most 2**22)
    assert usage.source == UsageSource.processes and "1 live process" in usage.note
    assert usage.cpu_seconds is not None and usage.cpu_seconds > 0
    assert usage.memory_bytes is not None and usage.memory_bytes > 1 << 20
    assert processes_usage([]).source == UsageSource.unavailable


def test_a_node_without_nvml_says_no_gpus() -> None:
    snapshot = Nvml().snapshot()
    if snapshot.available:
        pytest.skip(f"NVML works here: {[g.name for g in snapshot.gpus]}")
    assert snapshot.gpus == () and snapshot.note.startswith(NO_GPUS)


def test_gpu_type_is_one_of_the_nodes_models() -> None:
    models = ("NVIDIA H200",)
    assert check_gpu_type(None, models) is None and check_gpu_type(" ", models) is None
    assert check_gpu_type("nvidia h200", models) == "NVIDIA H200"
    with pytest.raises(Conflict, match=r"'NVIDIA A100' is not a GPU model of this node.*'NVIDIA H200'"):
        check_gpu_type("NVIDIA A100", models)
    with pytest.raises(Conflict, match="none"):
        check_gpu_type("NVIDIA H200", ())


@pytest.fixture
def app(tmp_path: Path) -> Iterator[tuple[TestClient, AppUnderTest]]:
    under_test = make_app(tmp_path)
    with TestClient(under_test.app) as client:
        yield client, under_test


def test_create_refuses_an_unknown_gpu_type_after_the_bad_fields(
    app: tuple[TestClient, AppUnderTest],
) -> None:
    client, under_test = app
    auth = {"Authorization": f"Bearer {under_test.token}"}
    body = {"name": "gpus", "containers": 2, "min_containers": 3, "gpu_type": "NVIDIA H200"}
    refused = client.post("/api/v1/clusters", json=body, headers=auth)
    assert refused.status_code == 422, refused.text  # the request's own values first
    locs = [e["loc"] for e in refused.json()["errors"]]
    assert "body.containers" in locs, locs
    body["min_containers"] = 2  # well-formed now: what this node lacks is a 409, like too many GPUs
    refused = client.post("/api/v1/clusters", json=body, headers=auth)
    assert refused.status_code == 409 and "is not a GPU model of this node" in refused.text, refused.text
    assert client.get("/api/v1/clusters/gpus", headers=auth).status_code == 404  # nothing created
    made = client.post("/api/v1/clusters", json={"name": "any", "gpu_type": None}, headers=auth)
    assert made.status_code == 201, made.text


def test_usage_route_is_the_owners_and_reports_honestly(app: tuple[TestClient, AppUnderTest]) -> None:
    client, under_test = app
    auth = {"Authorization": f"Bearer {under_test.token}"}
    assert client.post("/api/v1/clusters", json={"name": "mine"}, headers=auth).status_code == 201
    other = client.post("/api/v1/users", json={"name": "bob"}, headers=auth).json()["token"]
    assert (
        client.get("/api/v1/clusters/mine/usage", headers={"Authorization": f"Bearer {other}"}).status_code
        == 404
    )
    assert client.get("/api/v1/clusters/mine/usage").status_code == 401

    usage = client.get("/api/v1/clusters/mine/usage", headers=auth)

    assert usage.status_code == 200, usage.text
    figures = usage.json()
    assert figures["cluster"] == "mine" and figures["gpu_model"] == ""  # declared (virtual) GPUs: no model
    if not Nvml().snapshot().available:
        assert figures["gpu_note"].startswith(NO_GPUS)
    assert figures["containers"] == []  # no reconciler runs here: no container yet, so no figures either
