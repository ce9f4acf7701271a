"""The job's torch TCPStore (the process groups' bootstrap store), reachable on the cluster address only.

torch's TCPStore has no authentication, and its server listens on every interface (``[::]``)
whatever host name it is given (both the libuv and the legacy backend, torch 2.13). So the launcher
binds the listening socket itself, to the address the workers reach the coordinator on (the
``--coordinator-host``: 127.0.0.1 on one machine, the launcher's address on the cluster network
otherwise), and hands it to torch with ``master_listen_fd``. The port is ephemeral: a worker learns
``host:port`` only from the generation the coordinator sends it over the token-authenticated channel.
Workers keep their keys under a per-job prefix derived from the token (`runtime.group.store_prefix`).
See ``docs/security.md`` ("Network exposure").
"""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch.distributed as dist


def bind_listener(host: str, port: int = 0) -> socket.socket:
    """A TCP socket bound to `host` (an address or a name of this machine) and `port` (0: any free one).

    Raises OSError when `host` is not this machine's or the port is taken.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def start_store(host: str) -> tuple[dist.TCPStore, str]:
    """Start the job's store listening on `host` only, on an ephemeral port; returns it and ``host:port``.

    torch takes over (and eventually closes) a duplicate of the bound socket's descriptor; the
    duplicate is not inherited by the processes the launcher starts. Raises OSError or RuntimeError
    when `host` cannot be bound or the store does not start.
    """
    import torch.distributed as dist

    with bind_listener(host) as sock:
        port = sock.getsockname()[1]
        fd = os.dup(sock.fileno())
        store = dist.TCPStore(
            host,
            port,
            is_master=True,
            wait_for_workers=False,
            use_libuv=True,
            master_listen_fd=fd,
        )
    return store, f"{host}:{store.port}"
