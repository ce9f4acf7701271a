"""The whole flow on real pods: `elastrain server --backend kubernetes` on the private control plane and
its kubelet node (see conftest; skips without one). A 2-container cluster's pods run on the node; the
hostfile ConfigMap lists 2 hosts; an elastic job typed in the launcher pod grows to 4 exactly once when
the cluster is scaled to 4; a worker pod deleted behind the server's back is a node failure the job
survives (its worker leaves or fails, the others go on); deleting the cluster leaves no object in the
namespace."""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import Any

import pytest

from elastrain.backends.kubernetes_objects import hostfile_configmap_name
from elastrain.report import build_report
from elastrain.testing.clusters import all_running, hostfile_hosts, job_world, run_in
from elastrain.testing.containers import shared_storage
from elastrain.testing.k8s import KubeControlPlane, elastrain_server
from elastrain.testing.k8s_node import KubeNode
from elastrain.testing.waits import wait_until
from tests.k8s.conftest import IMAGE, admin_core, namespace_objects

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(900)]
SAMPLES = 10000
EPOCHS = 10  # long enough (0.1 s a step) that the job is still training after the scale and the failure


def _configmap_hosts(plane: KubeControlPlane, namespace: str, cluster: str) -> list[str]:
    config = admin_core(plane).read_namespaced_config_map(hostfile_configmap_name(cluster), namespace)
    return hostfile_hosts((config.data or {}).get("hostfile", ""))


def _pods(plane: KubeControlPlane, namespace: str) -> dict[str, Any]:
    return {p.metadata.name: p for p in admin_core(plane).list_namespaced_pod(namespace).items}


def _timing(what: str, seconds: float) -> None:
    print(f"\n{what}: {seconds:.1f} s")  # shown with -s / -rP


# A deleted pod's container gets SIGTERM (then SIGKILL after the grace period): its worker leaves
# (scale_in) or, killed first, fails (worker_failure); either way the others go on.
LEFT = ("scale_in", "worker_failure")


def test_the_whole_flow_on_real_pods(
    kube_plane: KubeControlPlane, kube_node: KubeNode, k8s_namespace: str, tmp_path: Path
) -> None:
    server = elastrain_server(kube_plane, k8s_namespace, tmp_path)
    server.start()
    data = shared_storage(server, "k8s-data")
    name = f"p{secrets.token_hex(3)}"
    try:
        with server.client() as c:
            t0 = time.monotonic()
            # cpus: a CPU request (BestEffort pods get cpu.shares 2, starved on a busy machine)
            c.create_cluster(
                name, framework="pytorch", containers=2, image=IMAGE, mounts=[f"{data}:/data"], cpus=0.4
            )
            c.wait_cluster(name, all_running, timeout=240)
            _timing("k8s: create 2 -> Running (real pods)", time.monotonic() - t0)
            pods = _pods(kube_plane, k8s_namespace)
            assert sorted(pods) == [f"{name}-launcher", f"{name}-worker-0"]
            assert {p.spec.node_name for p in pods.values()} == {kube_node.name}
            assert {p.status.phase for p in pods.values()} == {"Running"}
            wait_until(lambda: len(_configmap_hosts(kube_plane, k8s_namespace, name)) == 2, 60, "2 hosts")

            # in the launcher pod: the hostfile (the kubelet projects the ConfigMap at its next sync of the
            # pod), /data, the tenant's uid, the workers by their DNS names
            two = f"{name}-launcher slots=1\n{name}-worker-0 slots=1\n"
            hostfile = lambda: run_in(c, name, "cat", "/etc/mpi/hostfile")[1]  # noqa: E731
            wait_until(lambda: two in hostfile(), 60, "the pod's hostfile", interval=0.5)
            code, out = run_in(c, name, "sh", "-c", f"ls /data; id -u; getent hosts {name}-worker-0")
            assert code == 0, out
            assert "mnist_elastic.py" in out and int(out.splitlines()[-2]) >= 20000, out
            worker_ip = pods[f"{name}-worker-0"].status.pod_ip
            assert out.splitlines()[-1].split()[0] == worker_ip, out

            elastic = "elastrain run -v --min-np 2 --max-np 4 --hostfile /etc/mpi/hostfile --ledger /data/el"
            train = f"python /data/mnist_elastic.py --epochs {EPOCHS} --batch-size 200 --step-sleep 0.1"
            job = c.submit_job(name, f"{elastic} {train}".split())["id"]
            world = job_world(c, job)
            wait_until(world(2), 240, "the job to train with 2 workers")

            t0 = time.monotonic()
            c.scale_cluster(name, 4)
            c.wait_cluster(name, all_running, timeout=240)
            _timing("k8s: scale 2 -> 4 Running (real pods)", time.monotonic() - t0)
            wait_until(lambda: len(_configmap_hosts(kube_plane, k8s_namespace, name)) == 4, 60, "4 hosts")
            wait_until(world(4), 240, "the job to grow to 4 workers")
            _timing("k8s: scale 2 -> 4 -> training at 4", time.monotonic() - t0)

            admin_core(kube_plane).delete_namespaced_pod(
                f"{name}-worker-1", k8s_namespace, grace_period_seconds=0
            )
            wait_until(world(3), 120, "the job to go on with the 3 others")
            failed = wait_until(
                lambda: [e for e in c.events(name) if e["action"] == "container.failed"] or None,
                60,
                "the deleted pod to be reported",
            )
            assert "deleted outside elastrain" in str(failed[0]["detail"]), failed
            done = wait_until(
                lambda: (j := c.get_job(job))["status"] != "Running" and j, 600, "the job to finish"
            )
            assert (done["status"], done["exit_code"]) == ("Succeeded", 0), c.job_logs(job)[0][-3000:]
            report = build_report(data / "el", SAMPLES)
            assert [(e["samples"], e["duplicates"], e["missing"]) for e in report["epochs"]] == [
                (SAMPLES, 0, 0)
            ] * EPOCHS
            causes = [(g["world_size"], g["cause"]) for g in report["generations"]]
            assert causes[:2] == [(2, "start"), (4, "scale_out")], causes  # grown to 4 exactly once
            assert causes[2][0] == 3 and causes[2][1] in LEFT, causes  # then on with the 3 others

            c.delete_cluster(name)
            c.wait_deleted(name, timeout=120)
        wait_until(lambda: namespace_objects(kube_plane, k8s_namespace) == [], 120, "no object left")
    finally:
        server.cleanup()
