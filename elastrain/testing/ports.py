"""Free TCP ports on the loopback interface, for private servers, coordinators and rendezvous stores."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on `host` a moment ago (the caller binds it soon after)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def free_port_pair(host: str = "127.0.0.1", tries: int = 50) -> int:
    """A free port whose successor is free too (a coordinator's port and its store's port after it)."""
    for _ in range(tries):
        with socket.socket() as a, socket.socket() as b:
            a.bind((host, 0))
            port = int(a.getsockname()[1])
            try:
                b.bind((host, port + 1))
            except OSError:
                continue
            return port
    raise RuntimeError("no two free adjacent ports")
