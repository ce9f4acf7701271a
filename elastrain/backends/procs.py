"""Process helpers for the local backend: liveness (zombies count as dead), finding, stopping."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path

_PROC = Path("/proc")


def pid_alive(pid: int) -> bool:
    """True if `pid` exists and is not a zombie."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    except OSError:
        return False
    state = stat.rsplit(")", 1)[-1].split()[0] if ")" in stat else "?"
    return state not in ("Z", "X")


def cmdline(pid: int) -> list[str]:
    """The argv of `pid` ([] when unreadable)."""
    try:
        raw = (_PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def pids_with_env(key: str, value: str) -> list[int]:
    """Every live process whose environment has ``key=value`` (needs a readable /proc)."""
    needle = f"{key}={value}".encode()
    found = []
    me = os.getpid()
    for entry in _PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0") and pid_alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def pids_with_args(*args: str) -> list[int]:
    """Every live process whose argv holds `args` as consecutive arguments (e.g. ``--root``, path)."""
    found = []
    me = os.getpid()
    for entry in _PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        argv = cmdline(int(entry.name))
        n = len(args)
        if any(argv[i : i + n] == list(args) for i in range(len(argv) - n + 1)) and pid_alive(
            int(entry.name)
        ):
            found.append(int(entry.name))
    return found


def terminate(pids: Iterable[int], timeout_s: float = 5.0) -> None:
    """SIGTERM each pid, wait up to `timeout_s` for them to exit (zombies count), then SIGKILL the rest."""
    pending = [p for p in set(pids) if p > 1 and p != os.getpid()]
    for pid in pending:
        try:
            os.kill(pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + timeout_s
    while pending and time.monotonic() < deadline:
        pending = [p for p in pending if pid_alive(p)]
        if pending:
            time.sleep(0.05)
    for pid in pending:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
