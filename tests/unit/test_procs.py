"""Finding processes by their arguments (how the process backend finds an orphaned container init)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from elastrain.backends.procs import (
    TENANT_NICE,
    cmdline,
    niced,
    pid_alive,
    pids_with_args,
    start_in_session,
    terminate,
)


def test_pids_with_args_finds_consecutive_arguments_only(tmp_path: Path) -> None:
    root = str(tmp_path / "c0")
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "--root", root])
    try:
        deadline = time.monotonic() + 10  # until the child has exec'd (its argv is the parent's before)
        while proc.pid not in pids_with_args("--root", root) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert proc.pid in pids_with_args("--root", root)
        assert proc.pid not in pids_with_args("--root", root + "x")
        assert proc.pid not in pids_with_args(root, "--root")  # order matters
        terminate([proc.pid], timeout_s=5)
        proc.wait(timeout=10)
        assert not pid_alive(proc.pid)
    finally:
        proc.kill()
        proc.wait()


def _nice_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])


def test_a_tenants_command_runs_below_the_server_and_keeps_its_pid(tmp_path: Path) -> None:
    """`start_in_session` (the process backend's exec: jobs, `elastrain exec`) runs the command
    `TENANT_NICE` levels below the server, and the pid it returns is the command's own."""
    proc = start_in_session(["sleep", "30"], tmp_path, dict(os.environ))
    try:
        deadline = time.monotonic() + 10  # until `nice` has exec'd the command in place
        while cmdline(proc.pid)[:1] != ["sleep"] and time.monotonic() < deadline:
            time.sleep(0.02)
        assert cmdline(proc.pid) == ["sleep", "30"]
        assert _nice_of(proc.pid) == min(19, os.getpriority(os.PRIO_PROCESS, 0) + TENANT_NICE)
    finally:
        terminate([proc.pid], timeout_s=5)
        proc.wait(timeout=10)
    assert niced(["true"])[-1] == "true"
