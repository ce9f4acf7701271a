"""Conditions on clusters and jobs of a control plane, for `wait_until` and `Client.wait_cluster`."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from elastrain.client import Client, ClusterInfo


def all_running(cluster: ClusterInfo) -> bool:
    """The cluster and each of its desired containers are Running."""
    return (
        cluster.state == "Running"
        and len(cluster.containers) == cluster.desired_containers
        and all(c.state == "Running" for c in cluster.containers)
    )


def hostfile_hosts(text: str) -> list[str]:
    """The host column of a hostfile's entries."""
    return [line.split()[0] for line in text.splitlines() if line and not line.startswith("#")]


def hostfile_with(c: Client, name: str, hosts: int) -> str | None:
    """Cluster `name`'s hostfile once it lists `hosts` hosts (None before)."""
    text = c.hostfile(name)
    return text if len(hostfile_hosts(text)) == hosts else None


def settled(c: Client, name: str) -> Callable[[ClusterInfo], bool]:
    """All containers Running and the hostfile listing exactly the Running containers (launcher too)."""

    def check(cluster: ClusterInfo) -> bool:
        hosts = sorted(k.address for k in cluster.containers if k.state == "Running")
        return all_running(cluster) and sorted(hostfile_hosts(c.hostfile(name))) == hosts

    return check


def job_world(c: Client, job_id: int) -> Callable[[int], Callable[[], bool]]:
    """``world(n)``: a `wait_until` check that the job reports n workers (it must still be Running)."""

    def world(size: int) -> Callable[[], bool]:
        def check() -> bool:
            current = c.get_job(job_id)
            assert current["status"] == "Running", c.job_logs(job_id)[0][-3000:]
            return bool(current["world_size"] == size)

        return check

    return world


def run_in(c: Client, cluster: str, *command: str, container: str | None = None) -> tuple[int, str]:
    """`command` in the launcher container (or `container`) through the exec API: (exit code, output)."""
    out, code = [], -1
    for item in c.exec(cluster, list(command), container=container):
        if isinstance(item, int):
            code = item
        else:
            out.append(item)
    return code, "".join(out)
