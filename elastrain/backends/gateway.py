"""A relay from a Unix socket mounted into a cluster's containers to the control plane's API.

Jobs in containers report progress and incidents, and attach themselves, through the API. They do not
reach it over the network: on the machines measured, the path from a container to its network's
gateway went dark for about 27 s each time another container of the network died (podman's network
teardown), exactly when a job's reports matter. Each cluster instead gets a Unix socket, bind-mounted
at ``/run/elastrain/api.sock``, that the server splices to its own address; only the API is
reachable this way, and every call still needs a token. Each relay is bounded: `MAX_CONNECTIONS`
open connections per cluster and an `IDLE_SECONDS` idle timeout (a tenant opening thousands of
connections cannot take the server's descriptors or threads).
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import socket
import threading
from pathlib import Path

log = logging.getLogger("elastrain.gateway")


MAX_CONNECTIONS = 64
"""Open connections per cluster's relay; one more is closed at once (the tenant sees EOF)."""
IDLE_SECONDS = 300.0
"""A connection with no byte either way for this long is closed (a progress call or an attach
takes well under a second; long waits poll)."""
CHUNK = 65536


def _splice(client: socket.socket, upstream: socket.socket, idle_s: float) -> None:
    """Copy bytes both ways until both sides are done, or until neither moved a byte for `idle_s`.
    One thread, no descriptor of its own (poll); a send that waits `idle_s` ends it too."""
    peer = {client: upstream, upstream: client}
    with selectors.PollSelector() as selector:
        for sock in peer:
            sock.settimeout(idle_s)  # bounds sendall to a side that stopped reading
            selector.register(sock, selectors.EVENT_READ)
        open_sides = 2
        while open_sides:
            ready = selector.select(timeout=idle_s)
            if not ready:
                return  # idle
            for key, _events in ready:
                src = key.fileobj
                assert isinstance(src, socket.socket)
                data = src.recv(CHUNK)
                if data:
                    peer[src].sendall(data)
                    continue
                selector.unregister(src)
                open_sides -= 1
                with contextlib.suppress(OSError):
                    peer[src].shutdown(socket.SHUT_WR)


class ApiRelay:
    """Listens on the Unix socket `path` and splices each connection to the TCP address `target`.

    At most `max_connections` at a time (more are closed as soon as accepted, so a flood of
    connections costs no thread and no descriptor beyond the moment), each closed after `idle_s`
    seconds without traffic; one thread and two descriptors per open connection.
    """

    def __init__(
        self,
        path: Path,
        target: tuple[str, int],
        max_connections: int = MAX_CONNECTIONS,
        idle_s: float = IDLE_SECONDS,
    ) -> None:
        self.path, self.target = path, target
        self.max_connections, self.idle_s = max_connections, idle_s
        self._lock = threading.Lock()
        self.active = 0
        self.refused = 0
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
            with self._lock:
                full = self.active >= self.max_connections
                if full:
                    self.refused += 1
                else:
                    self.active += 1
            if full:
                if self.refused == 1 or self.refused % 1000 == 0:
                    log.warning("API relay %s: %d connections open; refused one more", self.path, self.active)
                client.close()
                continue
            threading.Thread(target=self._serve, args=(client,), name="api-relay-conn", daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            with client:
                try:
                    upstream = socket.create_connection(self.target, timeout=5)
                except OSError as exc:
                    log.warning("API relay %s: server unreachable: %s", self.path, exc)
                    return
                with upstream:
                    _splice(client, upstream, self.idle_s)
        except OSError:
            pass  # a side went away (reset, or a send timed out)
        finally:
            with self._lock:
                self.active -= 1

    def close(self) -> None:
        """Stop accepting and remove the socket (open connections end on their own or when idle)."""
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
