"""Process helpers for the host-process backends (local, fake): liveness (zombies count as dead),
finding by environment or argv, starting commands in a session of their own, stopping."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from elastrain.backends.filemodes import open_private_append

_PROC = Path("/proc")
TENANT_NICE = 10
"""How many nice levels below the server a tenant's processes run (their init, exec'd commands, jobs,
terminal shells): on one machine the control plane must keep answering while a tenant's work saturates
the CPUs, as the kubelet reserves CPU for the system. With CPUs idle the tenant gets them all anyway."""


def niced(argv: list[str]) -> list[str]:
    """`argv` run `TENANT_NICE` levels below this process (coreutils ``nice`` execs in place, so the
    PID Popen returns is the command's); unchanged where there is no ``nice``."""
    nice = shutil.which("nice")
    return [nice, "-n", str(TENANT_NICE), *argv] if nice else argv


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


def environ(pid: int) -> list[bytes]:
    """The ``KEY=value`` entries of `pid`'s environment ([] when unreadable)."""
    try:
        return (_PROC / str(pid) / "environ").read_bytes().split(b"\0")
    except OSError:
        return []


def has_env(pid: int, key: str, value: str) -> bool:
    """True if `pid` is alive and its environment has ``key=value``."""
    return f"{key}={value}".encode() in environ(pid) and pid_alive(pid)


def has_env_settled(pid: int, key: str, value: str, attempts: int = 4, pause_s: float = 0.01) -> bool:
    """`has_env` for one named process, read again (up to `attempts` times) before saying no: a process
    in the middle of an execve shows an empty or partly copied environment for a moment."""
    for attempt in range(attempts):
        if has_env(pid, key, value):
            return True
        if attempt + 1 < attempts and pid_alive(pid):
            time.sleep(pause_s)
        else:
            return False
    return False


def pids_with_env(key: str, value: str) -> list[int]:
    """Every live process whose environment has ``key=value`` (needs a readable /proc)."""
    me = os.getpid()
    return [
        int(entry.name)
        for entry in _PROC.iterdir()
        if entry.name.isdigit() and int(entry.name) != me and has_env(int(entry.name), key, value)
    ]


def server_first_path(path: str) -> str:
    """`path` (a PATH value) with the server's own bin directory first: its `python` and `elastrain`
    are the ones a command finds."""
    bin_dir = str(Path(sys.executable).parent)
    return os.pathsep.join([bin_dir, *(p for p in path.split(os.pathsep) if p and p != bin_dir)])


def host_env(extra: Mapping[str, str]) -> dict[str, str]:
    """The server's environment plus `extra`, with the server's own bin directory first on PATH."""
    env = {**os.environ, **extra}
    env["PATH"] = server_first_path(env.get("PATH", ""))
    return env


def start_in_session(
    command: list[str], cwd: Path, env: Mapping[str, str], log_path: Path | None = None
) -> subprocess.Popen[bytes]:
    """Start `command` in a new session at the tenants' priority (`niced`), stdin closed; output
    (stderr too) to a pipe, or appended to `log_path` (created private)."""
    command = niced(command)
    if log_path is None:
        return subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open_private_append(log_path) as log:
        return subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


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
