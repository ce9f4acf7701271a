"""`elastrain server --backend kubernetes` against the private API server: a cluster's pods are created,
scaled and deleted through the REST API; a pod deleted behind the server's back is reported; start-up
refusals are one line. The node, if any, is cordoned (see conftest): pods stay Pending with the
scheduler's reason. Running pods through the server: test_kubernetes_pods.py."""

from __future__ import annotations

import secrets
import subprocess
from pathlib import Path

import pytest

from elastrain.testing.k8s import KubeControlPlane, elastrain_server
from elastrain.testing.server import ControlPlane
from elastrain.testing.waits import wait_until
from tests.k8s.conftest import admin_core, namespace_objects

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(240)]


def _pods(plane: KubeControlPlane, namespace: str) -> list[str]:
    return sorted(p.metadata.name for p in admin_core(plane).list_namespaced_pod(namespace).items)


@pytest.mark.usefixtures("cordoned")
def test_cluster_lifecycle_through_the_server(
    kube_plane: KubeControlPlane, k8s_namespace: str, tmp_path: Path
) -> None:
    server = elastrain_server(kube_plane, k8s_namespace, tmp_path)
    server.start()
    name = f"k{secrets.token_hex(3)}"
    try:
        with server.client() as c:
            c.create_cluster(name, framework="pytorch", containers=2)
            two = [f"{name}-launcher", f"{name}-worker-0"]
            wait_until(lambda: _pods(kube_plane, k8s_namespace) == two, 60, "two pods")
            cluster = c.get_cluster(name)
            assert cluster.state == "Pending" and {k.state for k in cluster.containers} == {"Pending"}
            # the cluster's reason is the scheduler's (the pods wait; none is failed meanwhile)
            pending = c.wait_cluster(name, lambda k: "not scheduled: " in (k.reason or ""), timeout=30)
            assert pending.state == "Pending" and pending.reason.startswith(
                f"{name}-launcher: not scheduled: "
            )
            logs = wait_until(
                lambda: (text := c.container_logs(name)) and "not scheduled" in text and text,
                30,
                "the reason",
            )
            assert logs.startswith(f"elastrain: pod {name}-launcher is Pending: not scheduled: ")

            c.scale_cluster(name, 4)
            four = sorted([*two, f"{name}-worker-1", f"{name}-worker-2"])
            wait_until(lambda: _pods(kube_plane, k8s_namespace) == four, 60, "four pods")

            admin_core(kube_plane).delete_namespaced_pod(
                f"{name}-worker-1", k8s_namespace, grace_period_seconds=0
            )
            failed = c.wait_cluster(
                name,
                lambda k: (
                    any(x.name == f"{name}-worker-1" and x.state == "Failed" for x in k.containers)
                    or any(x.name == f"{name}-worker-3" for x in k.containers)
                ),
                timeout=60,
            )
            events = [e for e in c.events(name) if e.get("action") == "container.failed"]
            assert any("deleted outside elastrain" in str(e) for e in events), (failed, events)

            c.delete_cluster(name)
            c.wait_deleted(name, timeout=60)
        wait_until(lambda: namespace_objects(kube_plane, k8s_namespace) == [], 60, "no object left")
    finally:
        server.cleanup()


@pytest.mark.parametrize("who", ["nobody", "unknown-namespace"])
def test_server_refuses_to_start_with_one_line(
    kube_plane: KubeControlPlane, k8s_namespace: str, tmp_path: Path, who: str
) -> None:
    if who == "nobody":
        kubeconfig, namespace = kube_plane.kubeconfig_for(kube_plane.nobody, k8s_namespace), k8s_namespace
        expected = "may not get pods, list pods, watch pods, create pods"
    else:
        kubeconfig, namespace = kube_plane.kubeconfig_for(kube_plane.admin, "absent"), "absent"
        expected = "namespace absent does not exist; create it (kubectl create namespace absent)"
    server = ControlPlane(
        tmp_path,
        extra_args=("--backend", "kubernetes", "--kubeconfig", str(kubeconfig), "--namespace", namespace),
    )
    done = subprocess.run(server.argv(), capture_output=True, text=True, timeout=120, env=server.server_env())
    assert done.returncode != 0
    assert expected in done.stderr and "Traceback" not in done.stderr, done.stderr
