"""Processes of one container seen from the host: same PID namespace as its init, read from /proc.

The server never trusts a PID a container reports: it maps it through the container's own PID
namespace (``NSpid`` in /proc/PID/status) to a host PID, so it can only ever signal processes that
belong to that container.
"""

from __future__ import annotations

import os
from pathlib import Path

from elastrain.backends.procs import pid_alive

_PROC = Path("/proc")


def _pid_ns(pid: int) -> str | None:
    try:
        return os.readlink(_PROC / str(pid) / "ns" / "pid")
    except OSError:
        return None


def _ns_pid(pid: int) -> int | None:
    """The innermost PID of host `pid` (its PID inside its own namespace)."""
    try:
        for line in (_PROC / str(pid) / "status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    except (OSError, ValueError):
        return None
    return None


def container_pids(init_pid: int) -> dict[int, int]:
    """Host PID -> PID inside the container, for every live process in `init_pid`'s PID namespace."""
    ns = _pid_ns(init_pid) if init_pid > 0 else None
    if ns is None or ns == _pid_ns(os.getpid()):
        return {}  # unknown, or the host's own namespace: nothing there belongs to a container
    found = {}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        if _pid_ns(pid) == ns and pid_alive(pid):
            inner = _ns_pid(pid)
            if inner is not None:
                found[pid] = inner
    return found


def host_pid(init_pid: int, inner_pid: int) -> int | None:
    """The host PID of the container's process `inner_pid` (None when the container has no such PID)."""
    return next((host for host, inner in container_pids(init_pid).items() if inner == inner_pid), None)


def pids_with_env_in(init_pid: int, key: str, value: str) -> list[int]:
    """Host PIDs of the container's processes whose environment holds ``key=value``."""
    needle = f"{key}={value}".encode()
    found = []
    for pid in container_pids(init_pid):
        try:
            environ = (_PROC / str(pid) / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            found.append(pid)
    return found
