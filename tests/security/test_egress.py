"""Issue 29 item 4: a cluster network reaches no service of the host unless the admin opened its port.

The report: host services bound to all interfaces were reachable from tenant containers (no egress
policy). Replayed: two TCP services on the host, bound to 0.0.0.0; bob's launcher connects to each at
the host's address on his cluster's bridge (its gateway) and at the host's own address. Only the port
the server was started with ``--open-host-port`` answers; the other is refused at once. The platform's
own endpoints still work (the API through /run/elastrain/api.sock: an `elastrain` call from inside), and
once the cluster is deleted no rule of its network is left in the host's INPUT chain.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from elastrain.backends.egress import COMMENT
from elastrain.testing.containers import ContainerPlane, fake_gpus, framework_image, need_podman
from elastrain.testing.ports import free_port
from elastrain.testing.waits import wait_until
from tests.security.harness import new_user
from tests.security.test_tenant_files import running_cluster

pytestmark = pytest.mark.timeout(600)
PROBE = r"""
import socket, sys
gateway = next(
    socket.inet_ntoa(bytes.fromhex(f[2])[::-1])
    for f in (line.split() for line in open("/proc/net/route").readlines()[1:]) if f[1] == "00000000"
)
for host in (gateway, *sys.argv[1:2]):
    for port in sys.argv[2:]:
        s = socket.socket()
        s.settimeout(3)
        try:
            s.connect((host, int(port)))
            print(host, port, "reached", s.recv(16).decode())
        except OSError as exc:
            print(host, port, "refused", type(exc).__name__)
        finally:
            s.close()
"""
HEALTHZ = (
    "import socket; s = socket.socket(socket.AF_UNIX); s.connect('/run/elastrain/api.sock'); "
    "s.sendall(b'GET /api/v1/healthz HTTP/1.0\\r\\n\\r\\n'); print(s.recv(64).decode())"
)


@contextmanager
def host_service(port: int) -> Iterator[None]:
    """A TCP service of the host on 0.0.0.0:`port` that greets every connection with ``hello``."""
    server = socket.create_server(("0.0.0.0", port), reuse_port=False)
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                conn.sendall(b"hello")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)
        server.close()


def _host_address() -> str:
    """A non-loopback address of this host outside podman's bridges."""
    out = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        fields = line.split()
        if fields[1] != "lo" and not fields[1].startswith(("podman", "cni", "veth")):
            return fields[3].split("/")[0]
    pytest.skip("this host has no address outside loopback and podman's bridges")


def _exec(api: httpx.Client, cluster: str, command: list[str]) -> str:
    answer = api.post(f"/clusters/{cluster}/exec", json={"command": command}, timeout=120)
    assert answer.status_code == 200, answer.text
    lines = [json.loads(line) for line in answer.text.splitlines() if line.strip()]
    assert lines[-1].get("exit") == 0, lines
    return "".join(str(line.get("out", "")) for line in lines)


def _rules() -> str:
    return subprocess.run(["iptables", "-S", "INPUT"], capture_output=True, text=True, check=True).stdout


@pytest.mark.attack
def test_a_container_reaches_only_the_host_ports_opened_to_it(tmp_path: Path) -> None:
    need_podman()
    if os.geteuid() != 0:
        pytest.skip("the egress rules are the host's firewall: root only")
    image = framework_image("pytorch")
    closed, opened = free_port("0.0.0.0"), free_port("0.0.0.0")
    plane = ContainerPlane(tmp_path, fake_gpus(tmp_path / "gpus", 8))
    plane.extra_args = (*plane.extra_args, "--open-host-port", str(opened))
    with host_service(closed), host_service(opened):
        plane.start()
        try:
            bob = plane.http(new_user(plane, "bob"))
            running_cluster(bob, "egress", framework="pytorch", image=image)
            out = _exec(bob, "egress", ["python", "-c", PROBE, _host_address(), str(closed), str(opened)])
            results = [line.split() for line in out.splitlines()]
            assert len(results) == 4, out
            for _host, port, verdict, *_ in results:
                assert verdict == ("reached" if port == str(opened) else "refused"), out
            assert " 200 " in _exec(bob, "egress", ["python", "-c", HEALTHZ])  # the API, through its socket
            network = f"elastrain-{plane.key}-egress"
            assert f"{COMMENT}:{network}" in _rules()
            bob.delete("/clusters/egress")
            wait_until(lambda: bob.get("/clusters/egress").status_code == 404, 180, "deleted")
            assert f"{COMMENT}:{network}" not in _rules()
        finally:
            plane.cleanup()
