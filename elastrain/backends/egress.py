"""The egress policy of a cluster network: its containers reach no service of the host (issue 29).

A service the host binds to all interfaces (a database, a metrics agent, another tenant's forwarded
port) answers on the address of every podman bridge, so a container could reach it. Each cluster's
bridge gets rules in the host's ``INPUT`` chain: a new connection from the bridge to any address of the
host is rejected, except to the TCP ports the admin opened (``--open-host-port``). The platform's own
endpoints need none: containers reach the API through the relayed Unix socket (``/run/elastrain``), and
the server's connections into a container (the JupyterLab proxy) are not new connections *from* the
bridge, so their replies pass. Traffic to other machines (forwarded, not ``INPUT``) is not filtered.
Every rule carries the comment ``elastrain-egress:<network>``: `unguard` removes exactly those.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from elastrain.errors import ElastrainError

log = logging.getLogger("elastrain.egress")
COMMENT = "elastrain-egress"


class EgressError(ElastrainError):
    """The egress policy could not be applied (no iptables, or it refused): the container does not start."""


@dataclass(frozen=True)
class HostEgress:
    """The policy: the host's TCP ports a cluster network may open connections to (none by default)."""

    open_ports: tuple[int, ...] = ()
    iptables: str = "iptables"

    def rules(self, bridge: str, network: str) -> list[list[str]]:
        """The rules of `bridge` in the order they must hold in ``INPUT`` (each without ``-A INPUT``)."""
        tag = ["-m", "comment", "--comment", f"{COMMENT}:{network}"]
        new = ["-i", bridge, "-m", "conntrack", "--ctstate", "NEW"]
        accepts = [
            [*new, "-p", "tcp", "--dport", str(port), *tag, "-j", "ACCEPT"] for port in self.open_ports
        ]
        return [*accepts, [*new, *tag, "-j", "REJECT", "--reject-with", "icmp-admin-prohibited"]]

    def guard(self, bridge: str, network: str) -> None:
        """Put `network`'s rules (bridge interface `bridge`) at the head of ``INPUT`` unless they all
        hold already (idempotent: every container start checks; a reboot drops them)."""
        wanted = self.rules(bridge, network)
        if all(self._run("-C", "INPUT", *rule, check=False) == 0 for rule in wanted):
            return
        self.unguard(network)
        for rule in reversed(wanted):  # each inserted at the head: the REJECT ends up last
            self._run("-I", "INPUT", "1", *rule)

    def unguard(self, network: str) -> None:
        """Remove every rule of `network` (the network is being removed; its bridge name is reused)."""
        tag = f"{COMMENT}:{network}"
        for line in self._output("-S", "INPUT").splitlines():
            parts = [part.strip('"') for part in line.split()]  # iptables-nft quotes the comment
            if parts[:2] == ["-A", "INPUT"] and tag in parts:
                self._run("-D", "INPUT", *parts[2:], check=False)

    def _binary(self) -> str:
        found = shutil.which(self.iptables)
        if found is None:
            raise EgressError(
                f"{self.iptables} is missing: the cluster network's egress policy (no host services) "
                "cannot be applied; install iptables (apt-get install iptables)"
            )
        return found

    def _run(self, *args: str, check: bool = True) -> int:
        done = subprocess.run([self._binary(), "-w", *args], capture_output=True, text=True, timeout=30)
        if check and done.returncode != 0:
            raise EgressError(f"iptables {' '.join(args[:2])} failed: {done.stderr.strip()[:300]}")
        return done.returncode

    def _output(self, *args: str) -> str:
        done = subprocess.run([self._binary(), "-w", *args], capture_output=True, text=True, timeout=30)
        return done.stdout if done.returncode == 0 else ""


def parse_ports(values: Sequence[str | int]) -> tuple[int, ...]:
    """``--open-host-port`` values as ports (1-65535), or a ValueError saying which is wrong."""
    ports = []
    for value in values:
        try:
            port = int(value)
        except ValueError:
            raise ValueError(f"open host port {value!r} is not a number; give a TCP port 1-65535") from None
        if not 1 <= port <= 65535:
            raise ValueError(f"open host port {port} is out of range; give a TCP port 1-65535")
        ports.append(port)
    return tuple(sorted(set(ports)))
