"""Private network hosts for chaos runs: one network namespace per host, joined by a bridge.

Layout for a run tagged ``T`` on subnet ``10.231.K.0/24``: a bridge ``etbT`` in the root namespace
holds ``10.231.K.1`` (the coordinator listens there); host ``i`` is the namespace
``elastrain-T-10.231.K.(i+2)`` with that address on its end of a veth pair whose other end
``etvT<i>`` is a bridge port.
Partitioning a host sets its bridge port down: the host keeps running but reaches no one, and the
coordinator (on the bridge) stays reachable for the other hosts. Everything is removed in `teardown`.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from dataclasses import dataclass, field

from elastrain.errors import ElastrainError


class NetnsUnavailable(ElastrainError):
    """Network namespaces cannot be used here (not root, or no `ip` with netns support)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
    if check and done.returncode != 0:
        raise NetnsUnavailable(f"`ip {' '.join(args)}` failed: {done.stderr.strip()}")
    return done


def check_available() -> None:
    """Raise `NetnsUnavailable` (saying why) unless this process can create namespaces and veth pairs."""
    if os.geteuid() != 0:
        raise NetnsUnavailable("host partitions need root (network namespaces); run as root to include them")
    if shutil.which("ip") is None:
        raise NetnsUnavailable("host partitions need the `ip` command (iproute2); install it")
    if _ip("netns", "list", check=False).returncode != 0:
        raise NetnsUnavailable("`ip netns` does not work here; host partitions need network namespaces")


def _free_subnet() -> int:
    used = _ip("-o", "-4", "addr").stdout
    for _ in range(64):
        k = secrets.randbelow(250) + 1
        if f"10.231.{k}." not in used:
            return k
    raise NetnsUnavailable("no free 10.231.K.0/24 subnet for the chaos hosts")


@dataclass
class NetHosts:
    """`count` namespaced hosts on a private bridge; use as a context manager (teardown in finally)."""

    count: int
    tag: str = field(default_factory=lambda: secrets.token_hex(3)[:5])
    subnet: int = 0
    created: list[tuple[str, str]] = field(default_factory=list)  # ("netns"|"link", name), in order

    @property
    def bridge(self) -> str:
        """The bridge's name in the root namespace."""
        return f"etb{self.tag}"

    @property
    def gateway(self) -> str:
        """The bridge's address: where the coordinator listens."""
        return f"10.231.{self.subnet}.1"

    def namespace(self, i: int) -> str:
        """Namespace of host `i`."""
        return f"elastrain-{self.tag}-{self.address(i)}"

    def address(self, i: int) -> str:
        """Address of host `i` (its name in the hostfile)."""
        return f"10.231.{self.subnet}.{i + 2}"

    def port(self, i: int) -> str:
        """Root-namespace end of host `i`'s veth pair (a bridge port)."""
        return f"etv{self.tag}{i}"

    def exec_prefix(self, i: int) -> list[str]:
        """Prefix a command with this to run it inside host `i`."""
        return ["ip", "netns", "exec", self.namespace(i)]

    @property
    def agent_wrapper(self) -> str:
        """``elastrain run --agent-wrapper`` value that starts each host's agent in its namespace."""
        return f"ip netns exec elastrain-{self.tag}-{{host}}"

    def index(self, address: str) -> int:
        """Host index of `address`."""
        return int(address.rsplit(".", 1)[1]) - 2

    def setup(self) -> NetHosts:
        """Create the bridge, the namespaces and the veth pairs; on any failure remove what was made."""
        check_available()
        self.subnet = self.subnet or _free_subnet()
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            self.created.append(("link", self.bridge))
            _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for i in range(self.count):
                ns, port, inner = self.namespace(i), self.port(i), f"eti{self.tag}{i}"
                _ip("netns", "add", ns)
                self.created.append(("netns", ns))
                _ip("link", "add", port, "type", "veth", "peer", "name", inner)
                self.created.append(("link", port))
                _ip("link", "set", inner, "netns", ns)
                _ip("link", "set", port, "master", self.bridge)
                _ip("link", "set", port, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
                _ip("-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", inner)
                _ip("-n", ns, "link", "set", inner, "up")
        except BaseException:
            self.teardown()
            raise
        return self

    def partition(self, i: int) -> None:
        """Cut host `i` off the network (its processes keep running)."""
        _ip("link", "set", self.port(i), "down")

    def heal(self, i: int) -> None:
        """Reconnect host `i`."""
        _ip("link", "set", self.port(i), "up")

    def teardown(self) -> None:
        """Delete every namespace and link this object created (idempotent)."""
        for kind, name in reversed(self.created):
            if kind == "netns":
                _ip("netns", "delete", name, check=False)  # also deletes the veth pair inside it
            else:
                _ip("link", "delete", name, check=False)
        self.created.clear()

    def __enter__(self) -> NetHosts:
        return self.setup()

    def __exit__(self, *exc: object) -> None:
        self.teardown()
