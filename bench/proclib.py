"""Starting and, above all, reliably ending the benchmark's process trees.

Every process a job starts gets ``BENCH_VS_TORCHRUN_TAG=<run id>/<job>`` in its environment, and
both launchers pass their environment down to agents and workers. elastrain starts agents and
workers in sessions of their own, so killing the launcher's process group is not enough: `Job.kill`
finds every process carrying the job's tag in /proc and SIGKILLs it by pid. `kill_run` does the
same for everything of this benchmark run (used at exit, on Ctrl-C and on SIGTERM).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

TAG_ENV = "BENCH_VS_TORCHRUN_TAG"


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tagged_pids(prefix: str) -> list[int]:
    """Pids of live processes whose tag starts with `prefix` (this process excluded)."""
    needle = f"{TAG_ENV}={prefix}".encode()
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if any(var.startswith(needle) for var in environ.split(b"\0")):
            found.append(int(entry))
    return found


def kill_pids(pids: list[int], sig: int = signal.SIGKILL) -> None:
    """Send `sig` to each pid; ignore the ones already gone."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def kill_run(run_id: str) -> int:
    """SIGKILL every process of benchmark run `run_id`; returns how many there were."""
    total = 0
    for _ in range(5):  # a parent may spawn between the scan and the kill: repeat until clean
        pids = tagged_pids(run_id + "/")
        if not pids:
            break
        total += len(pids)
        kill_pids(pids)
        time.sleep(0.1)
    return total


class Job:
    """The processes of one launcher invocation (one job): started in new sessions, output to files."""

    def __init__(self, run_id: str, name: str, workdir: Path) -> None:
        self.tag = f"{run_id}/{name}"
        self.name = name
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(
        self, role: str, argv: list[str], env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> subprocess.Popen[bytes]:
        """Start `argv` as `role` (e.g. "launcher", "agent-n1"); output goes to <workdir>/<role>.out."""
        full_env = dict(os.environ)
        full_env.update(env or {})
        full_env[TAG_ENV] = self.tag
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
        """Pids still carrying this job's tag."""
        return tagged_pids(self.tag)

    def kill(self, grace_s: float = 0.0) -> int:
        """SIGTERM the started processes, wait up to `grace_s`, then SIGKILL everything tagged.

        Returns the number of processes that had to be SIGKILLed.
        """
        if grace_s > 0:
            for role in self.procs:
                self.signal(role, signal.SIGTERM)
            self.wait_exit(grace_s)
        killed = 0
        for _ in range(5):
            pids = self.leftovers()
            if not pids:
                break
            killed += len(pids)
            kill_pids(pids)
            time.sleep(0.1)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        return killed


def wait_for(
    predicate: Callable[[], bool],
    timeout_s: float,
    interval_s: float = 0.1,
    abort: Callable[[], bool] | None = None,
) -> bool:
    """Poll `predicate` until true (True), `abort` true or the timeout (False)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return True
        if abort is not None and abort():
            return predicate()
        if time.monotonic() > deadline:
            return False
        time.sleep(interval_s)
