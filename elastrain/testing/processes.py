"""Starting, tracking and reliably ending process trees, by PID.

Three ways to find what a test, a demo or a benchmark started, all ending in `kill_all` (SIGKILL by
PID, then wait until none is alive):

- the PIDs a job recorded itself (its ledger's events; `elastrain.testing.jobs`);
- a marker in the process's command line (`pids_with_arg`: a server's container inits name its data dir);
- a tag in the environment (`Tagged`: every process a launcher starts inherits ``TAG_VAR=<tag>``, so
  processes that moved to sessions of their own are still found).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from elastrain.backends.procs import pid_alive

_PROC = Path("/proc")


def kill_pids(pids: Iterable[int], sig: int = signal.SIGKILL) -> None:
    """Send `sig` to each PID; the ones already gone (or not ours) are skipped."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(int(pid), sig)


def wait_gone(pids: Iterable[int], timeout: float, interval: float = 0.05) -> bool:
    """Wait until none of `pids` is alive (zombies count as gone); False at the timeout."""
    remaining = set(pids)
    deadline = time.monotonic() + timeout
    while any(pid_alive(p) for p in remaining):
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True


def kill_all(pids: Iterable[int], timeout: float = 10.0) -> None:
    """SIGKILL every PID and wait (up to `timeout`) until they are gone."""
    pids = set(pids)
    kill_pids(pids)
    wait_gone(pids, timeout)


def terminate(proc: subprocess.Popen[bytes], timeout: float = 15.0, group: bool = False) -> None:
    """SIGTERM `proc` (its process group with `group`), SIGKILL it after `timeout`; reaps it."""
    if proc.poll() is not None:
        return
    if group:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    else:
        proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def stop_tree(proc: subprocess.Popen[bytes], pids: Iterable[int], grace: float = 15.0) -> None:
    """End a job started in a session of its own: SIGTERM its process group (SIGKILL after `grace`),
    then SIGKILL every PID it recorded (its agents and workers live in sessions of their own)."""
    pids = set(pids)
    terminate(proc, timeout=grace, group=True)
    kill_all(pids, timeout=10)


def scan_pids(match: Callable[[Path], bool]) -> list[int]:
    """PIDs of live processes whose /proc/<pid> directory `match`es (this process excluded)."""
    me, found = os.getpid(), []
    for entry in _PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        with contextlib.suppress(OSError):
            if match(entry):
                found.append(int(entry.name))
    return found


def pids_with_arg(*needles: bytes) -> set[int]:
    """Live PIDs whose command line has, for each needle, an argument that contains it."""

    def match(entry: Path) -> bool:
        argv = (entry / "cmdline").read_bytes().split(b"\0")
        return all(any(n in a for a in argv) for n in needles) and pid_alive(int(entry.name))

    return set(scan_pids(match))


def pids_with_env(name: str, prefix: str) -> list[int]:
    """Live PIDs whose environment sets `name` to a value starting with `prefix`."""
    needle = f"{name}={prefix}".encode()

    def match(entry: Path) -> bool:
        return any(v.startswith(needle) for v in (entry / "environ").read_bytes().split(b"\0"))

    return scan_pids(match)


def kill_env_tagged(name: str, prefix: str, rounds: int = 5) -> int:
    """SIGKILL every process tagged `name=prefix...`, repeating while a parent may still spawn;
    returns how many there were."""
    total = 0
    for _ in range(rounds):
        pids = pids_with_env(name, prefix)
        if not pids:
            break
        total += len(pids)
        kill_pids(pids)
        time.sleep(0.1)
    return total


class Tagged:
    """The processes of one tagged group: each started in a new session with ``<var>=<tag>`` in its
    environment (inherited by everything it starts) and its output in ``<workdir>/<role>.out``."""

    def __init__(self, var: str, tag: str, workdir: Path) -> None:
        self.var = var
        self.tag = tag
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(
        self, role: str, argv: list[str], env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> subprocess.Popen[bytes]:
        """Start `argv` as `role` (e.g. "launcher", "agent-n1"); output goes to <workdir>/<role>.out."""
        full_env = dict(os.environ)
        full_env.update(env or {})
        full_env[self.var] = self.tag
        full_env.setdefault("PYTHONUNBUFFERED", "1")
        out = open(self.workdir / f"{role}.out", "ab")  # noqa: SIM115 (handed to the child)
        try:
            proc = subprocess.Popen(
                argv,
                env=full_env,
                cwd=cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            out.close()
        self.procs[role] = proc
        return proc

    def alive(self, role: str | None = None) -> bool:
        """True while `role` (or, without one, any started process) is still running."""
        procs = [self.procs[role]] if role else list(self.procs.values())
        return any(p.poll() is None for p in procs)

    def signal(self, role: str, sig: int) -> None:
        """Send `sig` to the started process `role` (only that process, not its group)."""
        proc = self.procs[role]
        if proc.poll() is None:
            kill_pids([proc.pid], sig)

    def wait_exit(self, timeout_s: float) -> bool:
        """Wait for every started process to exit; False on timeout (nothing is killed)."""
        deadline = time.monotonic() + timeout_s
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.01, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                return False
        return True

    def leftovers(self) -> list[int]:
        """PIDs still carrying this group's tag."""
        return pids_with_env(self.var, self.tag)

    def kill(self, grace_s: float = 0.0) -> int:
        """SIGTERM the started processes, wait up to `grace_s`, then SIGKILL everything tagged.

        Returns the number of processes that had to be SIGKILLed.
        """
        if grace_s > 0:
            for role in self.procs:
                self.signal(role, signal.SIGTERM)
            self.wait_exit(grace_s)
        killed = kill_env_tagged(self.var, self.tag)
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        return killed
