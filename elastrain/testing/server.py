"""The server driver: one `elastrain server` process on a private data dir, port and admin token.

`ControlPlane` starts it (and starts it again after `kill()`: the new server adopts what the old one
left running), hands out clients and runs the CLI against it, and stops it: every cluster deleted
through the API, the server terminated, leftover container inits killed by PID.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from elastrain.backends.procs import pid_alive
from elastrain.testing.jobs import REPO
from elastrain.testing.ports import free_port
from elastrain.testing.processes import kill_pids, scan_pids, terminate
from elastrain.testing.waits import WaitTimeout, wait_until

if TYPE_CHECKING:
    import httpx

    from elastrain.client import Client

_INIT_MODULE = b"elastrain.backends.container_proc"


def container_inits(data_dir: Path) -> set[int]:
    """PIDs of the live container init processes of the server with `data_dir`."""
    needle = str(data_dir).encode()

    def match(entry: Path) -> bool:
        argv = (entry / "cmdline").read_bytes().split(b"\0")
        ours = any(needle in a for a in argv)
        return ours and _INIT_MODULE in argv and pid_alive(int(entry.name))

    return set(scan_pids(match))


def stop_server(proc: subprocess.Popen[bytes], client: Callable[[], Client]) -> None:
    """Delete every cluster through the API (that stops their processes), then stop the server."""
    from elastrain.client import ClientError

    if proc.poll() is not None:
        return
    try:
        with client() as admin:
            for cluster in admin.list_clusters():
                try:
                    admin.delete_cluster(cluster.name)
                except ClientError as exc:  # one already being deleted may be gone by now
                    if exc.status != 404:
                        raise
            for cluster in admin.list_clusters():
                admin.wait_deleted(cluster.name, timeout=60)
    finally:
        terminate(proc, timeout=15)


class ControlPlane:
    """One `elastrain server` process with its own data dir (and database), on a free port.

    The defaults are the tests': 8 virtual GPUs, mounts allowed below ``root/mounts``, the process
    backend's host commands allowed on purpose (``--insecure-host-commands``: the tests exec and submit
    jobs on this machine; `insecure_host_commands=False` leaves it out), a 0.2 s reconcile
    interval and a 20 s drain bound. `extra_args` may name another ``--backend``.
    """

    def __init__(
        self,
        root: Path,
        db_url: str | None = None,
        gpus: int | str | None = 8,
        extra_args: tuple[str, ...] = (),
        *,
        port: int | None = None,
        backend: str = "process",
        insecure_host_commands: bool = True,
        mounts: bool = True,
        drain_seconds: float | None = 20,
        reconcile_interval: float | None = 0.2,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """`gpus`: virtual GPUs to declare, a count or ``MODEL:N,...`` (None: the server detects the
        real ones); `db_url`: the
        database (None: SQLite in the data dir); `env`: the server's environment (default: this one
        less ELASTRAIN_DB)."""
        self.root = root
        self.extra_args = extra_args
        self.data = root / "data"
        self.mounts = root / "mounts"
        self.allow_mounts = mounts
        if mounts:
            self.mounts.mkdir(parents=True, exist_ok=True)
        self.db_url = db_url
        self.gpus = gpus
        self.backend = backend
        self.insecure_host_commands = insecure_host_commands
        self.drain_seconds = drain_seconds
        self.reconcile_interval = reconcile_interval
        self.env = env
        self.port = free_port() if port is None else port
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.token = ""

    def argv(self) -> list[str]:
        """The server's command line."""
        argv = [sys.executable, "-m", "elastrain", "server", "--port", str(self.port)]
        argv += ["--data-dir", str(self.data)]
        if self.gpus is not None:
            argv += ["--gpus", str(self.gpus)]
        if self.allow_mounts:
            argv += ["--allow-mount", str(self.mounts)]
        if self.drain_seconds is not None:  # the bound; scale-in waits for the jobs' reports
            argv += ["--drain-seconds", f"{self.drain_seconds:g}"]
        if self.reconcile_interval is not None:
            argv += ["--reconcile-interval", f"{self.reconcile_interval:g}"]
        if "--backend" not in self.extra_args:
            argv += ["--backend", self.backend]
            if self.insecure_host_commands and self.backend in ("process", "local", "slurm"):
                argv.append("--insecure-host-commands")
        return [*argv, *self.extra_args]

    def server_env(self) -> dict[str, str]:
        """The server's environment; the database URL goes here, never in argv (`ps` shows argv)."""
        if self.env is not None:
            env = dict(self.env)
        else:
            env = {k: v for k, v in os.environ.items() if k.upper() != "ELASTRAIN_DB"}
        if self.db_url:
            env["ELASTRAIN_DB"] = self.db_url
        return env

    def start(self) -> float:
        """Start (or, after `kill()`, restart) the server; returns the seconds until it answered."""
        from elastrain.client import Client

        self.root.mkdir(parents=True, exist_ok=True)
        log_path = self.root / "server.log"
        t0 = time.monotonic()
        with open(log_path, "ab") as log:
            proc = self.proc = subprocess.Popen(
                self.argv(), stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=self.server_env()
            )
        with Client(self.url, "") as probe:
            wait_until(lambda: probe.health() or proc.poll() is not None, 60, "the server to answer")
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-3000:]
            raise WaitTimeout(f"the server did not start (see {log_path}):\n{tail}")
        self.token = (self.data / "admin-token").read_text().strip()
        return time.monotonic() - t0

    def client(self, token: str | None = None) -> Client:
        """A client (the admin's without `token`)."""
        from elastrain.client import Client

        return Client(self.url, self.token if token is None else token)

    def http(self, token: str | None = None) -> httpx.Client:
        """A raw HTTP client on ``/api/v1`` (the admin's without `token`; "" for no credentials)."""
        import httpx

        auth = self.token if token is None else token
        headers = {"Authorization": f"Bearer {auth}"} if auth else {}
        return httpx.Client(base_url=self.url + "/api/v1", headers=headers, timeout=10)

    def cli(self, *args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``elastrain <args>`` against this server (in `root`); returns the finished process."""
        env = {
            **os.environ,
            "ELASTRAIN_URL": self.url,
            "ELASTRAIN_TOKEN": self.token if token is None else token,
        }
        argv = [sys.executable, "-m", "elastrain", *args]
        return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=self.root, timeout=60)

    def rss_kib(self) -> int:
        """The server process's resident memory (KiB)."""
        assert self.proc is not None, "the server was not started"
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")

    def kill(self) -> None:
        """kill -9 the server (its containers and their jobs keep running)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def terminate(self, timeout: float = 15.0) -> None:
        """SIGTERM the server (SIGKILL after `timeout`); clusters are left as they are."""
        if self.proc is not None:
            terminate(self.proc, timeout)

    def stop(self) -> None:
        """Best effort: delete every cluster, stop the server, then kill leftover container inits."""
        if self.proc is not None:
            with contextlib.suppress(Exception):  # a broken server: its inits are killed below
                stop_server(self.proc, self.client)
        kill_pids(container_inits(self.data))

    def cleanup(self) -> None:
        """`stop`, strictly: a failed delete raises, and a container init left running fails."""
        if self.proc is not None:
            stop_server(self.proc, self.client)
        leftovers = container_inits(self.data)
        for pid in leftovers:
            os.kill(pid, signal.SIGKILL)
        assert not leftovers, f"container processes left running: {leftovers}"


def sqlite_only(cp: ControlPlane) -> None:
    """Backend-only behaviour (no database difference): run once, on SQLite, to keep the suite short."""
    if cp.db_url:
        import pytest

        pytest.skip("backend behaviour, tested once on SQLite")
