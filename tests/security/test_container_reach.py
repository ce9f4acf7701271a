"""Issue 29's attacks on what a tenant's container may take from, or see of, the host (container backend).

* ``29.memory``: a cluster created without ``--memory`` had no memory limit (a tenant took 3 GiB).
* ``29.disk``: /tmp, the home directory and /var/log/jobs wrote to the host's root filesystem with no
  bound (3.5 GB written).
* ``29.egress``: a service the host binds to all interfaces answered a tenant's container.
* ``29.data-dir``: the server's data-directory path was visible inside the container.

Each replays the probe from inside a tenant's launcher (the exec API, as the tenant). Those the platform
does not refuse yet are marked ``xfail(strict=True)`` with the issue's item: the attack still works,
and the mark fails the run the day it stops working, so that the mark goes. Skipped without podman.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from elastrain.backends import podmanctl
from elastrain.client import Client
from elastrain.testing.clusters import all_running, run_in
from elastrain.testing.containers import ContainerPlane, server_containers
from tests.security.harness import new_user

pytestmark = pytest.mark.timeout(300)
CLUSTER = "reach"
OPEN_ITEM_3 = "issue 29 item 3 (per-tenant bounds): not enforced yet"
OPEN_ITEM_4 = "issue 29 item 4 (low items): not enforced yet"
WRITABLE = ("/tmp", "$HOME", "/var/log/jobs")  # where the report wrote 3.5 GB


@dataclass
class Tenant:
    """The plane and a tenant's client with one Running 2-container cluster."""

    plane: ContainerPlane
    client: Client

    def run(self, command: str) -> str:
        """`command` (a shell line) in the tenant's launcher; its output (exit code 0 asserted)."""
        code, out = run_in(self.client, CLUSTER, "sh", "-c", command)
        assert code == 0, (command, out)
        return out


@pytest.fixture(scope="module")
def tenant(ccp: ContainerPlane) -> Iterator[Tenant]:
    with ccp.client(new_user(ccp, "reach-bob")) as bob:
        bob.create_cluster(CLUSTER, framework="pytorch", containers=2)
        try:
            bob.wait_cluster(CLUSTER, all_running, timeout=180)
            yield Tenant(ccp, bob)
        finally:
            bob.delete_cluster(CLUSTER)
            bob.wait_deleted(CLUSTER, timeout=90)


def _inspect(plane: ContainerPlane) -> dict[str, Any]:
    names = sorted(n for n in server_containers(plane.key) if CLUSTER in n)
    name = next((n for n in names if "launcher" in n), names[0])
    return json.loads(podmanctl.podman("inspect", name, "--format", "json").stdout)[0]


@pytest.mark.attack("29.memory")
def test_a_cluster_created_without_a_memory_limit_gets_one(tenant: Tenant) -> None:
    limit = int(_inspect(tenant.plane)["HostConfig"].get("Memory") or 0)
    # cgroup v2's file, else v1's (this machine's hybrid hierarchy keeps memory on v1)
    cgroup = tenant.run(
        "cat /sys/fs/cgroup/memory.max 2>/dev/null | grep -v '^max$' "
        "|| cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || echo max"
    ).strip()
    assert limit > 0 and cgroup.isdigit() and int(cgroup) <= limit, (limit, cgroup)


@pytest.mark.attack("29.disk")
@pytest.mark.xfail(strict=True, reason=OPEN_ITEM_3)
def test_the_writable_places_are_bounded_below_the_hosts_disk(tenant: Tenant) -> None:
    host = os.statvfs(tenant.plane.data)
    host_bytes = host.f_blocks * host.f_frsize
    sizes = {}
    for place in WRITABLE:
        out = tenant.run(f"df -B1 --output=size {place} | tail -1")
        sizes[place] = int(out.split()[-1])
    assert all(size < host_bytes for size in sizes.values()), (sizes, host_bytes)


@pytest.fixture
def host_service() -> Iterator[int]:
    """A TCP service of the host on all interfaces (it accepts and closes); its port."""
    server = socket.create_server(("0.0.0.0", 0))
    server.settimeout(0.5)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            conn.close()

    thread = threading.Thread(target=serve, name="host-service", daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(timeout=5)
        server.close()


@pytest.mark.attack("29.egress")
def test_a_host_service_on_all_interfaces_is_not_reachable(tenant: Tenant, host_service: int) -> None:
    gateway = tenant.run("ip route 2>/dev/null | awk '/^default/ {print $3}' || true").strip()
    if not gateway:  # no iproute2 in the image: the default route from /proc
        gateway = tenant.run(
            "python3 -c \"import socket,struct;r=[l.split() for l in open('/proc/net/route')][1:];"
            "print(next(socket.inet_ntoa(struct.pack('<L',int(g,16))) for i,d,g,*_ in r if d=='00000000'))\""
        ).strip()
    probe = (
        "import socket,sys\ntry:\n    socket.create_connection((sys.argv[1], int(sys.argv[2])), 3).close()\n"
        "    print('reached')\nexcept OSError as e:\n    print('refused', e)\n"
    )
    out = tenant.run(f"python3 -c {shlex.quote(probe)} {gateway} {host_service}")
    assert "reached" not in out, f"the host's service at {gateway}:{host_service} answered the container"


@pytest.mark.attack("29.data-dir")
@pytest.mark.xfail(strict=True, reason=OPEN_ITEM_4)
def test_the_data_directory_is_not_visible_in_a_container(tenant: Tenant) -> None:
    data = str(tenant.plane.data.resolve())
    seen = tenant.run("cat /proc/self/mountinfo; env; cat /etc/hosts /proc/1/cmdline 2>/dev/null || true")
    assert data not in seen, [line for line in seen.splitlines() if data in line][:3]
