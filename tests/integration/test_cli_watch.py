"""The CLI's feedback on a live server (`elastrain server` on the process backend, the `cp` fixture):
`cluster create --wait` prints its status line and exits 0, `describe` shows the containers, `get -w`
prints rows, and on a terminal (a pty) `scale --wait` redraws its line in place.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from elastrain.testing.server import ControlPlane, sqlite_only

pytestmark = pytest.mark.timeout(180)
NAME = "clifeedback"


def cli_on_a_tty(cp: ControlPlane, *args: str) -> tuple[int, str, str]:
    """Run ``elastrain ARGS`` with stderr on a pseudo-terminal; (exit code, stdout, the tty's bytes)."""
    master, slave = os.openpty()
    env = {**os.environ, "ELASTRAIN_URL": cp.url, "ELASTRAIN_TOKEN": cp.token, "COLUMNS": "160"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "elastrain", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=slave,
        env=env,
        cwd=cp.root,
        text=True,
    )
    os.close(slave)
    chunks: list[bytes] = []

    def drain() -> None:  # read as it comes: a full pty buffer would block the CLI
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:  # EIO: every writer closed
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        stdout, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(timeout=10)
        os.close(master)
    return proc.returncode, stdout, b"".join(chunks).decode(errors="replace")


def test_create_wait_status_describe_and_watch(cp: ControlPlane) -> None:
    sqlite_only(cp)
    try:
        t0 = time.monotonic()
        created = cp.cli("cluster", "create", NAME, "--containers", "2", "--wait", "--timeout", "50")
        assert created.returncode == 0, created.stderr
        assert f"cluster {NAME} created: 1 launcher + 1 worker(s), state Running" in created.stdout
        status = [line for line in created.stderr.splitlines() if line.startswith(f"cluster {NAME}: ")]
        assert status, created.stderr
        assert status[-1].startswith(f"cluster {NAME}: Running, Running 2/2  "), status
        # not a TTY: one plain line per state change, never a redraw, never one per 0.5 s poll
        assert "\r" not in created.stderr and "\x1b" not in created.stderr
        assert len(status) <= 2 + 4 * 2 and len(status) < (time.monotonic() - t0) / 0.5 + 2, status

        with cp.client() as client:
            cluster = client.get_cluster(NAME)
        described = cp.cli("cluster", "describe", NAME)
        assert described.returncode == 0, described.stderr
        text = described.stdout
        assert text.splitlines()[0].split() == ["Name:", NAME]
        containers = text.split("Containers:\n", 1)[1].split("\n\n", 1)[0].splitlines()
        assert containers[0].split()[:5] == ["NAME", "ROLE", "STATE", "ADDRESS", "GPUS"]
        for c in cluster.containers:
            (row,) = [line for line in containers if line.split()[0] == c.name]
            assert row.split()[1:4] == [c.role, "Running", c.address], row
        hostfile = text.split("Hostfile (generation", 1)[1].split("\n\n", 1)[0]
        assert all(c.address in hostfile for c in cluster.containers)
        assert "Created with 2 containers" in text.split("Events (last", 1)[1]  # events as sentences

        watched = cp.cli("cluster", "get", NAME, "-w", "--timeout", "1.5")
        assert watched.returncode == 0, watched.stderr
        rows = watched.stdout.splitlines()
        assert rows[0].split() == ["NAME", "FRAMEWORK", "STATE", "CONTAINERS", "GENERATION"]
        assert rows[1].split()[:4] == [NAME, "horovod", "Running", "2/2"] and len(rows) == 2

        code, stdout, tty = cli_on_a_tty(cp, "cluster", "scale", NAME, "--containers", "3", "--wait")
        assert code == 0, tty
        assert f"cluster {NAME}: 3 containers desired, state Running" in stdout
        assert f"\rcluster {NAME}: " in tty and "\x1b[K" in tty  # redrawn in place
        assert "Running 3/3" in tty and tty.endswith("\n")
    finally:
        deleted = cp.cli("cluster", "delete", NAME)
        assert deleted.returncode == 0 or "not found" in deleted.stderr, deleted.stderr
