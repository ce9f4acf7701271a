"""The Kubernetes backend's pure parts: manifests from a cluster spec, what a pod's status means, the
exec helper's argv, and how the pod cache applies watch events (no API server needed)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from elastrain.backends.api import ContainerSpec, Mount
from elastrain.backends.kubernetes_exec import in_pod_argv, parse_env, signal_argv
from elastrain.backends.kubernetes_objects import (
    GPU_RESOURCE,
    HOSTFILE_KEY,
    LABEL_CLUSTER,
    LABEL_CONTAINER,
    LABEL_SERVER,
    KubeSettings,
    Owner,
    cluster_secret,
    headless_service,
    hostfile_configmap,
    image_reference,
    pod_manifest,
    service_name,
)
from elastrain.backends.kubernetes_status import pod_state
from elastrain.backends.kubernetes_watch import PodCache

SETTINGS = KubeSettings(namespace="ml", server_key="abc123", image_registry="reg.example:5000")
OWNER = Owner("elastrain-demo-mpi", "uid-1")


def _spec(**overrides: Any) -> ContainerSpec:
    values: dict[str, Any] = {
        "cluster": "demo",
        "cluster_uid": "c0ffee",
        "name": "demo-worker-1",
        "role": "worker",
        "address": "demo-worker-1",
        "gpu_ids": (2, 3),
        "shm_bytes": 1 << 30,
        "image": "localhost/elastrain-pytorch:latest",
        "mounts": (Mount("/data/sets", "/data"),),
        "env": {"EXTRA": "1", "ELASTRAIN_JOB_TOKEN": "secret-value"},
        "framework": "pytorch",
        "tenant": "alice",
        "tenant_uid": 20001,
        "memory_bytes": 4 << 30,
        "cpus": 1.5,
    }
    values.update(overrides)
    return ContainerSpec(**values)


def _container(pod: dict[str, Any]) -> dict[str, Any]:
    containers = pod["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def test_pod_runs_the_node_daemon_from_the_registry_image_as_the_tenant() -> None:
    pod = pod_manifest(_spec(), SETTINGS, OWNER)
    node = _container(pod)
    assert node["image"] == "reg.example:5000/elastrain-pytorch:latest"
    assert node["command"] == ["python", "-m", "elastrain.agent.noded"]
    assert pod["spec"]["securityContext"]["runAsUser"] == 20001
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert node["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["automountServiceAccountToken"] is False


def test_pod_requests_gpus_memory_and_cpus() -> None:
    limits = _container(pod_manifest(_spec(), SETTINGS, OWNER))["resources"]["limits"]
    assert limits == {GPU_RESOURCE: "2", "memory": str(4 << 30), "cpu": "1.5"}
    assert "resources" not in _container(
        pod_manifest(_spec(gpu_ids=(), memory_bytes=0, cpus=0), SETTINGS, None)
    )


def test_pod_mounts_hostfile_shm_storage_and_the_launcher_job_logs() -> None:
    pod = pod_manifest(_spec(), SETTINGS, OWNER)
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    mounts = {m["mountPath"]: m for m in _container(pod)["volumeMounts"]}
    assert volumes[mounts["/etc/mpi"]["name"]]["configMap"]["name"] == "elastrain-demo-mpi"
    assert mounts["/etc/mpi"]["readOnly"] is True
    assert volumes[mounts["/dev/shm"]["name"]]["emptyDir"] == {"medium": "Memory", "sizeLimit": str(1 << 30)}
    assert volumes[mounts["/data"]["name"]]["hostPath"] == {"path": "/data/sets"}
    assert "/var/log/jobs" not in mounts
    launcher = pod_manifest(_spec(name="demo-launcher", role="launcher"), SETTINGS, OWNER)
    assert "/var/log/jobs" in {m["mountPath"] for m in _container(launcher)["volumeMounts"]}
    assert "readOnly" not in mounts["/data"]
    dataset = pod_manifest(_spec(mounts=(Mount("/srv/mnist", "/mnist", read_only=True),)), SETTINGS, OWNER)
    assert {m["mountPath"]: m for m in _container(dataset)["volumeMounts"]}["/mnist"]["readOnly"] is True


def test_pod_environment_keeps_secrets_in_the_secret_object() -> None:
    env = {e["name"]: e for e in _container(pod_manifest(_spec(), SETTINGS, OWNER))["env"]}
    assert env["ELASTRAIN_NODE_SECRET"]["valueFrom"]["secretKeyRef"]["name"] == "elastrain-demo-secret"
    assert "ELASTRAIN_JOB_TOKEN" not in env  # an exec call's token never becomes part of the pod
    assert env["EXTRA"]["value"] == "1"
    assert env["CUDA_VISIBLE_DEVICES"]["value"] == "0,1"
    assert "NVIDIA_VISIBLE_DEVICES" not in env  # the device plugin sets it


def test_pod_names_resolve_through_the_headless_service() -> None:
    pod = pod_manifest(_spec(), SETTINGS, OWNER)
    service = headless_service(SETTINGS, "demo", "c0ffee", OWNER)
    assert pod["spec"]["hostname"] == "demo-worker-1"
    assert pod["spec"]["subdomain"] == service["metadata"]["name"] == service_name("demo")
    assert pod["spec"]["dnsConfig"]["searches"] == ["elastrain-demo.ml.svc.cluster.local"]
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"] == {LABEL_SERVER: "abc123", LABEL_CLUSTER: "demo"}


def test_every_object_is_labelled_and_owned_by_the_hostfile_configmap() -> None:
    root = hostfile_configmap(SETTINGS, "demo", "c0ffee", "# generation: 1\nhost slots=1\n")
    assert root["data"] == {HOSTFILE_KEY: "# generation: 1\nhost slots=1\n"}
    assert "ownerReferences" not in root["metadata"]
    owned = [
        pod_manifest(_spec(), SETTINGS, OWNER),
        headless_service(SETTINGS, "demo", "c0ffee", OWNER),
        cluster_secret(SETTINGS, "demo", "c0ffee", OWNER, "node-secret-value", {"id_ed25519": b"KEY"}),
    ]
    for manifest in [root, *owned]:
        assert manifest["metadata"]["labels"][LABEL_SERVER] == "abc123"
        assert manifest["metadata"]["labels"][LABEL_CLUSTER] == "demo"
    for manifest in owned:
        assert manifest["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "elastrain-demo-mpi", "uid": "uid-1"}
        ]
    assert owned[0]["metadata"]["labels"][LABEL_CONTAINER] == "demo-worker-1"
    assert base64.b64decode(owned[2]["data"]["id_ed25519"]) == b"KEY"


def test_names_that_kubernetes_would_refuse() -> None:
    long_cluster = "c" * 60
    assert len(service_name(long_cluster)) <= 63 and service_name(long_cluster)[0].isalpha()
    assert service_name(long_cluster) != service_name("c" * 59 + "d")
    with pytest.raises(ValueError, match="longer than 63 characters"):
        pod_manifest(_spec(cluster=long_cluster, name=f"{long_cluster}-worker-1"), SETTINGS, OWNER)


@pytest.mark.parametrize(
    ("image", "registry", "expected"),
    [
        ("localhost/elastrain-pytorch:latest", "", "localhost/elastrain-pytorch:latest"),
        ("localhost/elastrain-pytorch:latest", "reg:5000/", "reg:5000/elastrain-pytorch:latest"),
        ("elastrain-pytorch:v1", "reg.example", "reg.example/elastrain-pytorch:v1"),
        ("other.example/team/img:1", "reg.example", "other.example/team/img:1"),
    ],
)
def test_image_reference(image: str, registry: str, expected: str) -> None:
    assert image_reference(image, registry) == expected


def _pod(phase: str, conditions: list[dict[str, str]] | None = None, **status: Any) -> dict[str, Any]:
    labels = {LABEL_CLUSTER: "demo", LABEL_CONTAINER: "demo-launcher"}
    return {
        "metadata": {"name": "demo-launcher", "uid": "u1", "resourceVersion": "5", "labels": labels},
        "status": {"phase": phase, "conditions": conditions or [], **status},
    }


def test_pod_state_pending_unschedulable_keeps_the_schedulers_reason() -> None:
    message = "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."
    pod = _pod(
        "Pending",
        [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}],
    )
    state = pod_state(pod)
    assert (state.cluster, state.name, state.alive, state.ready) == ("demo", "demo-launcher", True, False)
    assert state.unschedulable and state.waiting_reason == f"not scheduled: {message}"


def test_pod_state_running_ready_and_ended() -> None:
    assert pod_state(_pod("Running", [{"type": "Ready", "status": "True"}])).ready
    assert not pod_state(_pod("Running", [{"type": "Ready", "status": "False"}])).ready
    pulling = _pod(
        "Pending", containerStatuses=[{"state": {"waiting": {"reason": "ErrImagePull", "message": "nope"}}}]
    )
    assert pod_state(pulling).waiting_reason == "ErrImagePull: nope"
    evicted = pod_state(_pod("Failed", reason="Evicted", message="The node was low on resource: memory."))
    assert (
        not evicted.alive
        and evicted.ended_reason == "the pod was evicted: The node was low on resource: memory."
    )
    crashed = _pod(
        "Failed", containerStatuses=[{"state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]
    )
    assert pod_state(crashed).ended_reason == "the container exited with code 137 (OOMKilled)"
    deleting = _pod("Running", [{"type": "Ready", "status": "True"}])
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert not pod_state(deleting).alive and "being deleted" in pod_state(deleting).ended_reason


def test_exec_argv_runs_in_home_with_the_environment() -> None:
    argv = in_pod_argv({"B": "2", "A": "1"}, ["echo", "hi"])
    assert argv == [
        "env",
        "A=1",
        "B=2",
        "sh",
        "-c",
        'cd "$HOME" 2>/dev/null; exec "$@"',
        "elastrain-exec",
        "echo",
        "hi",
    ]
    assert signal_argv("ELASTRAIN_JOB_ID", "7", 15)[-3:] == ["ELASTRAIN_JOB_ID", "7", "15"]
    assert parse_env(["A=1", "TOKEN"], {"TOKEN": "t0k"}) == {"A": "1", "TOKEN": "t0k"}


def test_pod_cache_applies_watch_events_and_reports_pods_deleted_by_others() -> None:
    gone: list[str] = []
    cache = PodCache(
        core=None, namespace="ml", selector="x", on_gone=lambda p: gone.append(p["metadata"]["name"])
    )
    first = _pod("Pending")
    assert cache._apply({"type": "ADDED", "object": first}) == "5"
    newer = _pod("Running", [{"type": "Ready", "status": "True"}])
    newer["metadata"]["resourceVersion"] = "7"
    cache._apply({"type": "MODIFIED", "object": newer})
    cache._apply({"type": "MODIFIED", "object": first})  # a stale event does not win
    assert [p["status"]["phase"] for p in cache.pods()] == ["Running"]
    cache._apply({"type": "DELETED", "object": newer})
    assert cache.pods() == [] and gone == ["demo-launcher"]
    mine = _pod("Pending")
    mine["metadata"]["uid"] = "u2"
    cache.put(mine)
    cache.forget(mine)  # deleted by the backend itself: no later event brings it back or reports it
    cache._apply({"type": "MODIFIED", "object": mine})
    cache._apply({"type": "DELETED", "object": mine})
    assert cache.pods() == [] and gone == ["demo-launcher"]


def test_exec_helper_writes_a_jobs_exit_code_atomically(tmp_path: Path) -> None:
    from elastrain.backends.kubernetes_exec import write_exit_file

    target = tmp_path / "1.exit"
    write_exit_file(target, 3)
    write_exit_file(None, 4)  # no exit file asked for: nothing
    assert target.read_text() == "3\n" and oct(target.stat().st_mode & 0o777) == "0o600"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1.exit"]
