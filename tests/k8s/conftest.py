"""A private Kubernetes control plane for the session (`elastrain.testing.k8s.KubeControlPlane`: etcd,
kube-apiserver, kube-scheduler, kube-controller-manager on free ports), a fresh namespace per test and
the Kubernetes backend on it. Everything skips, with the reason, when ``make k8s-deps`` has not built
the binaries or etcd-server is missing; the plane is stopped by PID at the end of the session.

No kubelet runs: pods are created, scheduled (or not) and deleted by the real API server, scheduler
and garbage collector, but none starts, so every pod stays Pending with the scheduler's reason. Tests
that need a running pod skip with `NO_KUBELET`.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from elastrain.testing.k8s import KubeControlPlane
from elastrain.testing.postgres import ToolMissing
from elastrain.testing.waits import wait_until

NO_KUBELET = (
    "needs a running pod: no kubelet runs pods on this machine (see README, Kubernetes: what is tested)"
)


@pytest.fixture(scope="session")
def kube_plane() -> Iterator[KubeControlPlane]:
    """The session's control plane (skips when it cannot be started here)."""
    try:
        plane = KubeControlPlane()
    except ToolMissing as exc:
        pytest.skip(f"private Kubernetes control plane unavailable: {exc}")
    try:
        yield plane
    finally:
        plane.stop()


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
