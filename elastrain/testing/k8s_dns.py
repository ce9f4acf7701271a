"""Cluster DNS for the test node: Debian's dnsmasq on the pod bridge's gateway address, answering the
names a cluster DNS (CoreDNS, whose image this offline machine cannot get) gives headless Services:
``<hostname>.<service>.<namespace>.svc.<domain>`` for each pod with ``hostname`` and ``subdomain``,
and ``<service>.<namespace>.svc.<domain>`` for all of them.

The records come from the API server's Endpoints (as CoreDNS's kubernetes plugin reads them),
re-read every `REFRESH_S` and written to a hosts file in dnsmasq's ``--hostsdir`` (re-read by dnsmasq
on change). Names under the cluster domain that do not exist get NXDOMAIN (``--local``), so a
resolver goes on to the next search domain; nothing is forwarded upstream.
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

REFRESH_S = 0.5
CLUSTER_DOMAIN = "cluster.local"


def records(endpoints: Iterable[Mapping[str, Any]], domain: str = CLUSTER_DOMAIN) -> list[tuple[str, str]]:
    """(address, name) pairs of the headless Services' Endpoints objects (the API's JSON)."""
    found: list[tuple[str, str]] = []
    for item in endpoints:
        meta = item.get("metadata") or {}
        service = f"{meta.get('name')}.{meta.get('namespace')}.svc.{domain}"
        for subset in item.get("subsets") or []:
            for address in [*(subset.get("addresses") or []), *(subset.get("notReadyAddresses") or [])]:
                ip = address.get("ip")
                if not ip:
                    continue
                found.append((ip, service))
                if address.get("hostname"):
                    found.append((ip, f"{address['hostname']}.{service}"))
    return sorted(set(found))


def hosts_text(pairs: Iterable[tuple[str, str]]) -> str:
    """A hosts file of `pairs`."""
    return "".join(f"{ip} {name}\n" for ip, name in pairs)


class ClusterDns:
    """dnsmasq on `address` port 53 and the thread that keeps its records; `stop()` ends both."""

    def __init__(self, root: Path, address: str, list_endpoints: Any, dnsmasq: str) -> None:
        """`list_endpoints()` returns every Endpoints object (the API's JSON items)."""
        self.root = root
        self.hosts_dir = root / "hosts.d"
        self.hosts_dir.mkdir(parents=True, exist_ok=True)
        self.address = address
        self._list = list_endpoints
        self._stop = threading.Event()
        self._written = ""
        self.error = ""
        self._refresh()
        with open(root / "dnsmasq.log", "ab") as log:
            self.proc = subprocess.Popen(
                [
                    dnsmasq, "--keep-in-foreground", "--no-resolv", "--no-hosts", "--no-poll",
                    "--no-negcache", "--bind-interfaces", f"--listen-address={address}", "--port=53",
                    f"--hostsdir={self.hosts_dir}", f"--local=/{CLUSTER_DOMAIN}/", "--local-ttl=1",
                    "--user=root", "--group=root", f"--pid-file={root / 'dnsmasq.pid'}",
                    "--log-facility=-",
                ],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        self._thread = threading.Thread(target=self._run, name="k8s-dns", daemon=True)
        self._thread.start()

    def _refresh(self) -> None:
        try:
            text = hosts_text(records(self._list()))
            self.error = ""
        except Exception as exc:  # the API may be gone while the harness stops
            self.error = str(exc)
            return
        if text != self._written:
            part = self.root / "cluster.tmp"  # outside the watched directory
            part.write_text(text)
            os.replace(part, self.hosts_dir / "cluster")
            self._written = text

    def _run(self) -> None:
        while not self._stop.wait(REFRESH_S):
            self._refresh()

    def alive(self) -> str | None:
        """None while dnsmasq runs, else why it stopped."""
        if self.proc.poll() is None:
            return None
        log = (self.root / "dnsmasq.log").read_text(errors="replace").strip().splitlines()[-3:]
        return f"dnsmasq exited with code {self.proc.returncode}: {' | '.join(log)}"

    def stop(self) -> None:
        """Stop the thread and dnsmasq (by PID)."""
        self._stop.set()
        self._thread.join(timeout=5)
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
