"""The container backend's files of a cluster on this machine (see `elastrain.backends.container`).

Under ``<data-dir>/clusters/<cluster>/``: ``mpi/hostfile``, ``home/``, ``jobs/``, ``keys/``,
``mounts.json``, ``hosts``, ``nsswitch.conf``, ``secret`` and ``lab-token``; this module lays them out
(idempotent) and renders the cluster's ``/etc/hosts``.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from elastrain.backends.api import ContainerSpec
from elastrain.backends.cluster_keys import ensure_cluster_keys
from elastrain.backends.container_run import HOSTS_HEAD, NSSWITCH, network_address
from elastrain.backends.filemodes import private_dir, private_file, tenant_dir
from elastrain.hostfile import atomic_write_text


def prepare_cluster_files(base: Path, spec: ContainerSpec) -> Path:
    """The cluster's directories (0700; mounted ones the tenant's only), keys, hostfile, mount table,
    /etc/hosts and nsswitch.conf (idempotent); `base`."""
    base = private_dir(base)
    for sub in ("mpi", "home", "jobs"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    ensure_cluster_keys(base / "keys", spec.cluster, spec.tenant_uid)
    hostfile = base / "mpi" / "hostfile"
    if not hostfile.exists():
        atomic_write_text(hostfile, "# generation: 0\n")
    tenant_dir(base / "mpi", spec.tenant_uid)
    for sub in ("home", "jobs"):
        try:
            os.chown(base / sub, spec.tenant_uid, spec.tenant_uid)
        except PermissionError:
            pass
        os.chmod(base / sub, 0o700)
    atomic_write_text(base / "mounts.json", json.dumps({m.target: m.source for m in spec.mounts}))
    private_file(base / "mounts.json")
    if not (base / "hosts").exists():
        atomic_write_text(base / "hosts", HOSTS_HEAD)
    atomic_write_text(base / "nsswitch.conf", NSSWITCH)
    return base


def _kept_secret(path: Path) -> str:
    """A random secret kept in `path` (made once, 0600)."""
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(24))
    return path.read_text().strip()


def cluster_secret(base: Path) -> str:
    """The cluster's node secret (made once, 0600)."""
    return _kept_secret(base / "secret")


def cluster_lab_token(base: Path) -> str:
    """The token of the cluster's JupyterLab (made once, 0600): its launcher gets it, the portal's
    proxy adds it to every request; no browser and no other tenant ever sees it."""
    return _kept_secret(base / "lab-token")


def hosts_text(infos: Iterable[Mapping[str, Any]], network: str) -> str:
    """/etc/hosts naming every container of `infos` (``podman inspect`` rows) by its address on `network`."""
    lines = [HOSTS_HEAD]
    for info in infos:
        address = network_address(info, network)
        hostname = (info.get("Config") or {}).get("Hostname")
        if address and hostname:
            lines.append(f"{address}\t{hostname} {info.get('Name', '').lstrip('/')}\n")
    return "".join(lines)
