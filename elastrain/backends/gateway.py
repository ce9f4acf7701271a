"""A relay from a Unix socket mounted into a cluster's containers to the control plane's API.

Jobs in containers report progress and incidents, and attach themselves, through the API. They do not
reach it over the network: on the machines measured, the path from a container to its network's
gateway went dark for about 27 s each time another container of the network died (podman's network
teardown), exactly when a job's reports matter. Each cluster instead gets a Unix socket, bind-mounted
at ``/run/elastrain/api.sock``, that the server splices to its own address; only the API is
reachable this way, and every call still needs a token.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from pathlib import Path

log = logging.getLogger("elastrain.gateway")


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while chunk := src.recv(65536):
            dst.sendall(chunk)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


class ApiRelay:
    """Listens on the Unix socket `path` and splices each connection to the TCP address `target`."""

    def __init__(self, path: Path, target: tuple[str, int]) -> None:
        self.path, self.target = path, target
        path.unlink(missing_ok=True)
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        os.chmod(path, 0o666)  # the tenant's uid connects from inside the containers
        self.server.listen(128)
        threading.Thread(target=self._accept, name=f"api-relay-{path.parent.name}", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _peer = self.server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError as exc:
                log.warning("API relay %s: server unreachable: %s", self.path, exc)
                client.close()
                continue
            upstream.settimeout(None)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pipe, args=(a, b), daemon=True).start()

    def close(self) -> None:
        """Stop accepting (open connections finish on their own) and remove the socket."""
        with contextlib.suppress(OSError):
            self.server.close()
        self.path.unlink(missing_ok=True)


class RelaySet:
    """One relay per cluster, keyed by its socket path."""

    def __init__(self) -> None:
        self.target: tuple[str, int] | None = None
        self._relays: dict[Path, ApiRelay] = {}
        self._lock = threading.Lock()

    def ensure(self, path: Path) -> bool:
        """A relay listens on `path` (False: the server's address is not known yet, or binding failed)."""
        if self.target is None:
            return False
        host, port = self.target
        target = ("127.0.0.1" if host in ("0.0.0.0", "", "localhost") else host, port)
        with self._lock:
            if path in self._relays:
                return True
            try:
                self._relays[path] = ApiRelay(path, target)
            except OSError as exc:
                log.warning("cannot open the API socket %s: %s", path, exc)
                return False
        return True

    def drop(self, path: Path) -> None:
        """Close the relay on `path`, if any."""
        with self._lock:
            relay = self._relays.pop(path, None)
        if relay is not None:
            relay.close()

    def close(self) -> None:
        """Close every relay."""
        with self._lock:
            relays, self._relays = list(self._relays.values()), {}
        for relay in relays:
            relay.close()
