"""Issue 29 item 3: the in-container API socket relay is bounded per cluster.

The attack: a tenant opens thousands of connections to ``/run/elastrain/api.sock`` and leaves them
open (7,000 exhausted the server's descriptors, two threads and three descriptors each). The relay
now holds at most `max_connections` per cluster (more are closed as soon as accepted) and closes a
connection idle for `idle_s`; the cluster's own calls go through again once the flood is gone.
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import httpx
import pytest

from elastrain.backends.gateway import ApiRelay
from elastrain.testing.waits import wait_until
from tests.security.harness import start_server

pytestmark = pytest.mark.timeout(120)
FLOOD = 1000
CAP = 16


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def health_through(path: Path) -> int:
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(path)), timeout=10) as client:
        return client.get("http://relay/api/v1/healthz").status_code


@pytest.mark.attack("29.relay-flood")
def test_a_connection_flood_on_the_api_socket_is_capped_and_costs_nothing_beyond(tmp_path: Path) -> None:
    with start_server(tmp_path / "server") as server:
        path = tmp_path / "api.sock"
        relay = ApiRelay(path, ("127.0.0.1", server.port), max_connections=CAP, idle_s=30)
        try:
            assert health_through(path) == 200
            wait_until(lambda: relay.active == 0, 10, "the first call's connection to end")
            fds, threads = open_fds(), threading.active_count()
            flood = []
            for _ in range(FLOOD):
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.connect(str(path))
                flood.append(sock)
            wait_until(
                lambda: relay.refused >= FLOOD - CAP, 30, "the relay to refuse the flood beyond its cap"
            )
            assert relay.active == CAP
            # the relay's own cost: 2 descriptors and 1 thread per connection it holds, none for the rest
            assert open_fds() - fds - FLOOD <= 2 * CAP + 4
            assert threading.active_count() - threads <= CAP + 2
            for sock in flood:
                sock.close()
            wait_until(lambda: relay.active == 0, 30, "the flood's connections to close")
            assert health_through(path) == 200  # the cluster's own calls go through again
        finally:
            relay.close()


@pytest.mark.attack("29.relay-flood")
def test_an_idle_connection_to_the_api_socket_is_closed(tmp_path: Path) -> None:
    with start_server(tmp_path / "server") as server:
        path = tmp_path / "api.sock"
        relay = ApiRelay(path, ("127.0.0.1", server.port), max_connections=CAP, idle_s=1.0)
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as idle:
                idle.connect(str(path))
                idle.settimeout(20)
                assert idle.recv(1) == b""  # closed by the relay at its idle bound, not by us
            wait_until(lambda: relay.active == 0, 10, "the idle connection to be released")
            assert health_through(path) == 200
        finally:
            relay.close()
