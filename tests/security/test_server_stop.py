"""Issue 29 item 4: SIGTERM stops the server within 10 s even with terminals open.

The report: after a portal-terminal session in a since-deleted cluster, the server ignored SIGTERM
for over 4 minutes and left the container's conmon, init and network behind. Replayed on the process
backend and on the container backend (skipped without podman): a terminal whose cluster is then
deleted stays open while the server gets SIGTERM; it must be gone within 10 s, and (container
backend) no container or network of it may be left (`ContainerPlane.cleanup` asserts that).
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
from websockets.sync.client import connect

from elastrain.testing.clusters import all_running
from elastrain.testing.containers import container_plane
from elastrain.testing.server import ControlPlane
from elastrain.testing.waits import wait_until
from tests.security.harness import start_server

pytestmark = pytest.mark.timeout(600)
STOP_BOUND_S = 10.0


def stop_with_a_terminal_open(server: ControlPlane, figures: list[str], framework: str | None) -> None:
    """Open a terminal in a new cluster, delete the cluster, then SIGTERM the server (tab still open)."""
    with server.client() as c:
        c.create_cluster("stop", containers=2, **({"framework": framework} if framework else {}))
        c.wait_cluster("stop", all_running, timeout=180)
    url = server.url.replace("http://", "ws://") + "/api/v1/clusters/stop/terminal"
    with connect(url, ping_interval=None) as tab:
        tab.send(json.dumps({"token": server.token}))
        tab.send(json.dumps({"input": "echo up-$((6*7)); sleep 1000\n"}))
        wait_until(lambda: "up-42" in str(tab.recv(timeout=30)), 60, "the terminal to answer")
        with server.client() as c:
            c.delete_cluster("stop")
            c.wait_deleted("stop", timeout=120)
        assert server.proc is not None
        started = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        try:
            server.proc.wait(STOP_BOUND_S + 20)
        finally:
            took = time.monotonic() - started
            figures.append(
                f"SIGTERM with a terminal open ({'container' if framework else 'process'} backend): "
                f"stopped in {took:.2f} s"
            )
        assert took < STOP_BOUND_S, f"the server took {took:.1f} s to stop"


@pytest.mark.attack("29.sigterm")
def test_sigterm_stops_the_process_backend_server_with_a_terminal_open(
    tmp_path: Path, security_figures: list[str]
) -> None:
    with start_server(tmp_path, ("--insecure-host-commands",)) as server:
        stop_with_a_terminal_open(server, security_figures, None)


@pytest.mark.attack("29.sigterm")
def test_sigterm_stops_the_container_backend_server_with_a_terminal_open(
    image: str, tmp_path: Path, security_figures: list[str]
) -> None:
    with container_plane(tmp_path) as plane:  # its cleanup asserts no container or network is left
        stop_with_a_terminal_open(plane, security_figures, "pytorch")
