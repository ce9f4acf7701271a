"""Finding processes by their arguments (how the process backend finds an orphaned container init)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from elastrain.backends.procs import pid_alive, pids_with_args, terminate


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
