"""A private Kubernetes control plane for the session (`elastrain.testing.k8s.KubeControlPlane`: etcd,
kube-apiserver, kube-scheduler, kube-controller-manager on free ports), a fresh namespace per test and
the Kubernetes backend on it. Everything skips, with the reason, when ``make k8s-deps`` has not built
the binaries or etcd-server is missing; the plane is stopped by PID at the end of the session.

Where this machine can (root, containerd, runc, the CNI plugins, dnsmasq: `make k8s-deps` installs
them), the session also starts a real node (`elastrain.testing.k8s_node.KubeNode`: the kubelet with
containerd, a pod bridge and cluster DNS) with the pytorch image imported from podman, so pods run.
Tests that need running pods take `kube_node` (skipping with `NO_KUBELET` and the reason without
one); tests about pods that never run take `cordoned` (the node, if any, accepts no pod meanwhile).
"""

from __future__ import annotations

import contextlib
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from elastrain.testing.k8s import KubeControlPlane
from elastrain.testing.k8s_node import KubeNode
from elastrain.testing.postgres import ToolMissing
from elastrain.testing.waits import wait_until

NO_KUBELET = "needs a running pod: no kubelet runs pods on this machine"
IMAGE = "localhost/elastrain-pytorch:latest"


@dataclass
class _Node:
    """The session's node, or why there is none."""

    node: KubeNode | None = None
    missing: str = ""


# The fixtures below are also imported by tests/contract (a second definition, so a second session
# instance): both share one plane and one node, started by the first user and stopped by the last.
_SHARED: dict[str, Any] = {}
_USERS: dict[str, int] = {"plane": 0, "node": 0}


def _start_node(plane: KubeControlPlane) -> _Node:
    try:
        node = KubeNode(plane)
    except (ToolMissing, AssertionError, OSError, RuntimeError, subprocess.SubprocessError) as exc:
        return _Node(missing=f"{NO_KUBELET}: {exc}")
    try:
        node.load_image(IMAGE)
    except (ToolMissing, RuntimeError, subprocess.SubprocessError) as exc:
        node.stop()
        return _Node(missing=f"{NO_KUBELET}: {exc}")
    return _Node(node)


@contextlib.contextmanager
def _shared(key: str, start: Any, stop: Any) -> Iterator[Any]:
    if _USERS[key] == 0:
        _SHARED[key] = start()
    _USERS[key] += 1
    try:
        yield _SHARED[key]
    finally:
        _USERS[key] -= 1
        if _USERS[key] == 0:
            stop(_SHARED.pop(key))


def _stop_node(found: _Node) -> None:
    if found.node is not None:
        found.node.stop()


@pytest.fixture(scope="session")
def kube_plane() -> Iterator[KubeControlPlane]:
    """The session's control plane (skips when it cannot be started here)."""
    try:
        with _shared("plane", KubeControlPlane, KubeControlPlane.stop) as plane:
            yield plane
    except ToolMissing as exc:
        pytest.skip(f"private Kubernetes control plane unavailable: {exc}")


@pytest.fixture(scope="session")
def _session_node(kube_plane: KubeControlPlane) -> Iterator[_Node]:
    """A kubelet node with `IMAGE` where one can run here, else the reason (see the docstring)."""
    with _shared("node", lambda: _start_node(kube_plane), _stop_node) as found:
        yield found


@pytest.fixture
def kube_node(_session_node: _Node) -> KubeNode:
    """The node running pods (skips, with the reason, without one)."""
    if _session_node.node is None:
        pytest.skip(_session_node.missing)
    return _session_node.node


def node_runs_pods(request: pytest.FixtureRequest) -> bool:
    """Whether pods run here (the session's node started; for the backend contract's parameter)."""
    return request.getfixturevalue("_session_node").node is not None


@pytest.fixture
def cordoned(kube_plane: KubeControlPlane, _session_node: _Node) -> Iterator[None]:
    """No node accepts pods during the test (the node, if any, is cordoned): pods stay Pending."""
    node = _session_node.node
    if node is None:
        yield
        return
    core = admin_core(kube_plane)
    core.patch_node(node.name, {"spec": {"unschedulable": True}})
    try:
        yield
    finally:
        core.patch_node(node.name, {"spec": {"unschedulable": False}})


def admin_core(plane: KubeControlPlane) -> Any:
    """A CoreV1Api as the plane's admin."""
    from kubernetes import client, config

    return client.CoreV1Api(config.new_client_from_config(config_file=str(plane.kubeconfig)))


@pytest.fixture
def k8s_namespace(kube_plane: KubeControlPlane) -> Iterator[str]:
    """A fresh namespace (with its default service account); deleted after the test."""
    core = admin_core(kube_plane)
    name = f"t-{secrets.token_hex(4)}"
    core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    kube_plane.wait_namespace_ready(name)
    try:
        yield name
    finally:
        core.delete_namespace(name)


def make_backend(plane: KubeControlPlane, namespace: str, data_dir: Path, **options: Any) -> Any:
    """The Kubernetes backend on `namespace` as the plane's admin, with its own server key."""
    from elastrain.backends.kubernetes import KubernetesBackend
    from elastrain.backends.kubernetes_client import connect

    conn = connect(plane.kubeconfig_for(plane.admin, namespace), namespace)
    backend = KubernetesBackend(data_dir, conn, f"test-{secrets.token_hex(3)}", stop_timeout_s=2, **options)
    wait_until(lambda: backend.pods.wait_synced(0.1), 30, "the pod watch's first list")
    return backend


def namespace_objects(plane: KubeControlPlane, namespace: str) -> list[str]:
    """``kind/name`` of every pod, service, configmap and secret in `namespace` except the ones
    Kubernetes itself keeps there (the service account's token, the root CA ConfigMap)."""
    core = admin_core(plane)
    found = [f"pod/{p.metadata.name}" for p in core.list_namespaced_pod(namespace).items]
    found += [f"service/{s.metadata.name}" for s in core.list_namespaced_service(namespace).items]
    found += [
        f"configmap/{c.metadata.name}"
        for c in core.list_namespaced_config_map(namespace).items
        if c.metadata.name != "kube-root-ca.crt"
    ]
    found += [
        f"secret/{s.metadata.name}"
        for s in core.list_namespaced_secret(namespace).items
        if s.type != "kubernetes.io/service-account-token"
    ]
    return sorted(found)
