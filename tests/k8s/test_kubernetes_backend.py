"""The Kubernetes backend against a real API server, scheduler and garbage collector, with pods that do
not run (the session's node, if any, is cordoned: `cordoned`): pods are refused by the scheduler,
watched, scaled and deleted. Running pods: test_kubernetes_pods.py."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import pytest

from elastrain.backends.api import ContainerSpec, ContainerStatus
from elastrain.backends.kubernetes_client import KubernetesError, check_ready, connect
from elastrain.backends.kubernetes_objects import GPU_RESOURCE, LABEL_CLUSTER, LABEL_SERVER
from elastrain.hostfile import Host, Hostfile, render_hostfile
from elastrain.testing.k8s import KubeControlPlane, KubeUser
from elastrain.testing.ports import free_port
from elastrain.testing.waits import wait_until
from tests.k8s.conftest import IMAGE, admin_core, make_backend, namespace_objects

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(180)]


def _spec(cluster: str, name: str, role: str = "worker", gpus: int = 0) -> ContainerSpec:
    return ContainerSpec(
        cluster=cluster,
        cluster_uid="uid-" + cluster,
        name=name,
        role=role,
        address=name,
        gpu_ids=tuple(range(gpus)),
        shm_bytes=64 << 20,
        image=IMAGE,
        framework="pytorch",
        tenant="alice",
        tenant_uid=20001,
    )


def _find(backend: Any, name: str) -> ContainerStatus | None:
    return next((s for s in backend.list_containers() if s.name == name), None)


def _hostfile(*names: str, generation: int) -> str:
    return render_hostfile(Hostfile(tuple(Host(n, 1) for n in names), generation))


def _scheduler_verdict(pods: list[dict[str, Any]], names: set[str]) -> bool:
    """Every pod of `names` carries the scheduler's PodScheduled condition."""
    seen = {
        p["metadata"]["name"]
        for p in pods
        if any(c.get("type") == "PodScheduled" for c in (p.get("status") or {}).get("conditions") or [])
    }
    return names <= seen


@pytest.mark.usefixtures("cordoned")
def test_cluster_flow_pods_hostfile_scale_failure_and_delete(
    kube_plane: KubeControlPlane, k8s_namespace: str, tmp_path: Path
) -> None:
    backend = make_backend(kube_plane, k8s_namespace, tmp_path / "data")
    core = admin_core(kube_plane)
    cluster = f"c{secrets.token_hex(3)}"
    names = [f"{cluster}-launcher", f"{cluster}-worker-0"]
    try:
        for i, name in enumerate(names):
            status = backend.create_container(_spec(cluster, name, "launcher" if i == 0 else "worker"))
            assert status.alive and not status.ready
        pods = {p.metadata.name: p for p in core.list_namespaced_pod(k8s_namespace).items}
        assert sorted(pods) == sorted(names)
        root = core.read_namespaced_config_map(f"elastrain-{cluster}-mpi", k8s_namespace)
        for pod in pods.values():
            assert pod.metadata.labels[LABEL_CLUSTER] == cluster
            assert [o.uid for o in pod.metadata.owner_references] == [root.metadata.uid]
        service = core.read_namespaced_service(f"elastrain-{cluster}", k8s_namespace)
        assert service.spec.cluster_ip == "None"

        # the scheduler's decision reaches the backend through its watch: no node takes pods, so Pending
        assert backend.pods.wait_for(lambda ps: _scheduler_verdict(ps, set(names)), 30)
        launcher = _find(backend, names[0])
        assert launcher is not None and launcher.alive and not launcher.ready
        assert launcher.waiting_reason.startswith("not scheduled: ")
        first = next(iter(backend.logs(cluster, names[0])))
        assert first.startswith(f"elastrain: pod {names[0]} is Pending: not scheduled: ")

        backend.write_cluster_file(cluster, "/etc/mpi/hostfile", _hostfile(*names, generation=1))
        assert backend.hostfile_text(cluster) == _hostfile(*names, generation=1)

        scaled = [*names, f"{cluster}-worker-1", f"{cluster}-worker-2"]
        for name in scaled[2:]:
            backend.create_container(_spec(cluster, name))
        assert sorted(p.metadata.name for p in core.list_namespaced_pod(k8s_namespace).items) == sorted(
            scaled
        )
        backend.write_cluster_file(cluster, "/etc/mpi/hostfile", _hostfile(*scaled, generation=2))
        assert backend.hostfile_text(cluster) == _hostfile(*scaled, generation=2)
        hosts = [line.split()[0] for line in backend.hostfile_text(cluster).splitlines()[1:]]
        assert hosts == scaled

        # a worker pod deleted by someone else is a failed container, reported with why
        core.delete_namespaced_pod(scaled[2], k8s_namespace, grace_period_seconds=0)
        gone = wait_until(
            lambda: (s := _find(backend, scaled[2])) is not None and not s.alive and s, 30, "the deletion"
        )
        assert "deleted outside elastrain" in gone.exit_reason
        assert all(s.alive for s in backend.list_containers() if s.name != scaled[2])
        backend.delete_container(cluster, scaled[2], "uid-" + cluster)  # the reconciler removes its row
        assert _find(backend, scaled[2]) is None

        backend.delete_cluster(cluster, "uid-" + cluster)
        assert [s for s in backend.list_containers() if s.cluster == cluster] == []
        wait_until(lambda: namespace_objects(kube_plane, k8s_namespace) == [], 60, "every object to go")
        backend.delete_cluster(cluster, "uid-" + cluster)  # again: a no-op
    finally:
        try:
            backend.delete_cluster(cluster, "uid-" + cluster)
        finally:
            backend.close()


def test_unschedulable_pod_fails_with_the_schedulers_reason(
    kube_plane: KubeControlPlane, k8s_namespace: str, tmp_path: Path
) -> None:
    backend = make_backend(kube_plane, k8s_namespace, tmp_path / "data", unschedulable_grace_s=1.0)
    cluster = f"g{secrets.token_hex(3)}"
    name = f"{cluster}-launcher"
    try:
        pod = backend.create_container(_spec(cluster, name, "launcher", gpus=2))
        assert pod.alive
        created = admin_core(kube_plane).read_namespaced_pod(name, k8s_namespace)
        assert created.spec.containers[0].resources.limits == {GPU_RESOURCE: "2"}
        failed = wait_until(
            lambda: (s := _find(backend, name)) is not None and not s.alive and s,
            60,
            "the pod to be given up",
        )
        assert failed.exit_reason.startswith("not scheduled: ") and "(for 1 s)" in failed.exit_reason
        wait_until(
            lambda: not admin_core(kube_plane).list_namespaced_pod(k8s_namespace).items, 30, "the pod to go"
        )
        assert _find(backend, name) is not None  # reported until the reconciler deletes the container
        backend.delete_container(cluster, name)
        assert _find(backend, name) is None
    finally:
        try:
            backend.delete_cluster(cluster, "uid-" + cluster)
        finally:
            backend.close()


def test_a_restarted_server_adopts_its_pods_by_label_only(
    kube_plane: KubeControlPlane, k8s_namespace: str, tmp_path: Path
) -> None:
    first = make_backend(kube_plane, k8s_namespace, tmp_path / "a")
    cluster = f"r{secrets.token_hex(3)}"
    name = f"{cluster}-launcher"
    first.create_container(_spec(cluster, name, "launcher"))
    key = first.settings.server_key
    first.close()
    from elastrain.backends.kubernetes import KubernetesBackend

    conn = connect(kube_plane.kubeconfig_for(kube_plane.admin, k8s_namespace), k8s_namespace)
    again = KubernetesBackend(tmp_path / "a", conn, key)
    stranger = make_backend(kube_plane, k8s_namespace, tmp_path / "b")
    try:
        adopted = wait_until(lambda: _find(again, name), 30, "the pod to be listed again")
        assert adopted.alive and adopted.cluster == cluster
        assert _find(stranger, name) is None  # another server's pods are not its
        pod = admin_core(kube_plane).read_namespaced_pod(name, k8s_namespace)
        assert pod.metadata.labels[LABEL_SERVER] == key
    finally:
        stranger.close()
        try:
            again.delete_cluster(cluster, "uid-" + cluster)
        finally:
            again.close()


@pytest.mark.usefixtures("cordoned")
def test_exec_in_a_pod_that_does_not_run_says_why(
    kube_plane: KubeControlPlane, k8s_namespace: str, tmp_path: Path
) -> None:
    backend = make_backend(kube_plane, k8s_namespace, tmp_path / "data")
    cluster = f"x{secrets.token_hex(3)}"
    spec = _spec(cluster, f"{cluster}-launcher", "launcher")
    try:
        backend.create_container(spec)
        proc = backend.exec(spec, ["echo", "hello"])
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 126
        assert out.decode().startswith(f"elastrain: cannot run a command in pod {spec.name}: ")
    finally:
        try:
            backend.delete_cluster(cluster, "uid-" + cluster)
        finally:
            backend.close()


def test_refusals_at_start_are_one_line_and_say_what_to_do(
    kube_plane: KubeControlPlane, k8s_namespace: str
) -> None:
    nobody = connect(kube_plane.kubeconfig_for(kube_plane.nobody, k8s_namespace), k8s_namespace)
    with pytest.raises(
        KubernetesError, match=r"may not .*create pods.* in namespace .*docs/kubernetes/rbac.yaml"
    ):
        check_ready(nobody)
    missing = connect(kube_plane.kubeconfig_for(kube_plane.admin, "no-such-ns"), "no-such-ns")
    with pytest.raises(KubernetesError, match="namespace no-such-ns does not exist; create it"):
        check_ready(missing)
    bad_token = connect(kube_plane.kubeconfig_for(KubeUser("mallory", "wrong"), k8s_namespace), k8s_namespace)
    with pytest.raises(KubernetesError, match="did not accept the credentials"):
        check_ready(bad_token)
    check_ready(connect(kube_plane.kubeconfig_for(kube_plane.admin, k8s_namespace), k8s_namespace))


def test_an_unreachable_api_server_is_one_line(tmp_path: Path) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters:\n- name: x\n  cluster:\n    server: https://127.0.0.1:{free_port()}\n"
        "users:\n- name: x\n  user:\n    token: t\n"
        "contexts:\n- name: x\n  context:\n    cluster: x\n    user: x\n"
        "current-context: x\n"
    )
    with pytest.raises(
        KubernetesError, match=r"^cannot reach the Kubernetes API server https://127\.0\.0\.1:"
    ):
        check_ready(connect(config, "default"))
