"""A TCP relay from a cluster network's gateway address to the control plane's API.

Containers on a per-cluster bridge network reach the host only at that network's gateway
(``host.containers.internal``), while the server listens on loopback by default. Jobs in the
containers report progress, incidents and attach themselves through the API, so the container backend
relays ``GATEWAY:PORT`` to the server's own address, one relay per cluster network. Only the API is
reachable this way (every call still needs a token); nothing else of the host is relayed.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading

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
    """Listens on (`host`, `port`) and splices each connection to `target`."""

    def __init__(self, host: str, port: int, target: tuple[str, int]) -> None:
        self.target = target
        self.server = socket.create_server((host, port), backlog=128)
        self.address = f"{host}:{self.server.getsockname()[1]}"
        self._thread = threading.Thread(target=self._accept, name=f"api-relay-{host}", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _peer = self.server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError as exc:
                log.warning("API relay %s: server unreachable: %s", self.address, exc)
                client.close()
                continue
            upstream.settimeout(None)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pipe, args=(a, b), daemon=True).start()

    def close(self) -> None:
        """Stop accepting (open connections finish on their own)."""
        with contextlib.suppress(OSError):
            self.server.close()


class RelaySet:
    """One relay per gateway address, created on first use."""

    def __init__(self) -> None:
        self.target: tuple[str, int] | None = None
        self._relays: dict[str, ApiRelay] = {}
        self._lock = threading.Lock()

    def url_for(self, gateway: str) -> str | None:
        """``http://host.containers.internal:PORT`` for containers behind `gateway` (None: no server set)."""
        if self.target is None:
            return None
        host, port = self.target
        if host in ("0.0.0.0", "::", ""):
            return f"http://host.containers.internal:{port}"  # the server listens there already
        with self._lock:
            relay = self._relays.get(gateway)
            if relay is None:
                try:
                    relay = ApiRelay(gateway, port, (host, port))
                except OSError as exc:
                    log.warning("cannot relay the API to %s:%d: %s", gateway, port, exc)
                    return None
                self._relays[gateway] = relay
        return f"http://host.containers.internal:{relay.server.getsockname()[1]}"

    def close(self) -> None:
        """Close every relay."""
        with self._lock:
            for relay in self._relays.values():
                relay.close()
            self._relays.clear()
