"""The kill-server scenario: `elastrain server` is kill -9'd while a job it started trains.

The job runs in a 3-container cluster of a private server (its own data dir and port). While the
server is down a worker is killed too, so the generation change it causes has to reach the server
after the restart. Checked: the job kept training without the server, the restarted server adopted
the containers and shows the job's progress again and the incident among the job's events, and the
job finished with the usual exactly-once and parameter checks.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from elastrain.backends.procs import pid_alive
from elastrain.chaos.job import REPO, JobWatcher, LedgerRecords
from elastrain.errors import ConfigError

if TYPE_CHECKING:
    from elastrain.chaos.runner import ChaosRunner
    from elastrain.chaos.scenarios import Scenario
    from elastrain.client import Client

T = TypeVar("T")


def wait_until(what: str, check: Callable[[], T | None], timeout: float = 120.0) -> T:
    """Poll `check` every 0.1 s until it returns something truthy; ConfigError after `timeout`."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise ConfigError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.1)
    return value


def container_inits(data_dir: Path) -> set[int]:
    """PIDs of the live container init processes of the server with `data_dir`."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                ours = any(str(data_dir).encode() in a for a in argv)
                if ours and b"elastrain.backends.container_proc" in argv and pid_alive(int(entry.name)):
                    found.add(int(entry.name))
    return found


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
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class ServerProcess:
    """One `elastrain server` on a private data dir; `kill()` is kill -9, `start()` again adopts."""

    def __init__(
        self, root: Path, port: int, extra_args: tuple[str, ...] = (), backend: str = "process"
    ) -> None:
        self.root = root
        self.extra_args = extra_args  # e.g. ("--allow-mount", DIR)
        self.backend = backend
        self.data = root / "data"
        self.url = f"http://127.0.0.1:{port}"
        self.port = port
        self.proc: subprocess.Popen[bytes] | None = None
        self.token = ""

    def start(self) -> float:
        """Start (or restart) the server; returns the seconds until it answered."""
        from elastrain.client import Client

        self.root.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "elastrain", "server", "--port", str(self.port)]
        argv += ["--data-dir", str(self.data), "--gpus", "8", "--reconcile-interval", "0.2"]
        argv += ["--backend", self.backend, *self.extra_args]
        if self.backend in ("process", "local"):  # the scenarios exec and submit jobs on one's own machine
            argv.append("--insecure-process-backend")
        t0 = time.monotonic()
        with open(self.root / "server.log", "ab") as log:
            proc = self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        with Client(self.url, "") as probe:
            wait_until("the server to answer", lambda: probe.health() or proc.poll() is not None, 60)
        if proc.poll() is not None:
            raise ConfigError(f"the server did not start; see {self.root / 'server.log'}")
        self.token = (self.data / "admin-token").read_text().strip()
        return time.monotonic() - t0

    def client(self) -> Client:
        """An admin client."""
        from elastrain.client import Client

        return Client(self.url, self.token)

    def kill(self) -> None:
        """kill -9 (the containers and the job keep running)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        """Delete every cluster, stop the server, then kill leftover container inits by PID."""
        if self.proc is not None:
            with contextlib.suppress(Exception):  # a broken server: its inits are killed below
                stop_server(self.proc, self.client)
        for pid in container_inits(self.data):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def free_port() -> int:
    """A port free on 127.0.0.1 right now (for a private server)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_kill_server(
    runner: ChaosRunner, scenario: Scenario, work: Path, reference: dict[str, Any]
) -> dict[str, Any]:
    """Run the kill-server scenario in `work`; returns the runner's figures plus the server's."""
    server = ServerProcess(work / "server", free_port())
    records = LedgerRecords(work / "ledger")
    try:
        server.start()
        return _scenario(runner, scenario, server, records, work, reference)
    finally:
        server.stop()
        for pid in records.known_pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while any(pid_alive(p) for p in records.known_pids()) and time.monotonic() < deadline:
            time.sleep(0.05)


def _scenario(
    runner: ChaosRunner,
    scenario: Scenario,
    server: ServerProcess,
    records: LedgerRecords,
    work: Path,
    reference: dict[str, Any],
) -> dict[str, Any]:
    from elastrain.chaos.runner import example_command

    slow = work / "slow"
    slow.touch()
    params = work / "params.pt"
    command = [
        sys.executable,
        "-m",
        "elastrain",
        "run",
        *scenario.run_args,
        "--hostfile",
        "/etc/mpi/hostfile",
    ]
    command += ["--ledger", str(records.ledger), *example_command(params, slow_while=slow)]
    with server.client() as c:
        c.create_cluster("chaos", containers=scenario.hosts)
        c.wait_cluster(
            "chaos", lambda k: k.state == "Running" and all(x.state == "Running" for x in k.containers)
        )
        job = c.submit_job("chaos", command)
        runner.say(f"{scenario.name}: job {job['id']} submitted: {' '.join(command[3:])}")
        watcher = JobWatcher(records.ledger, None)
        wait_until("40 committed steps", lambda: watcher.committed() >= 40)
        wait_until("a progress report", lambda: (c.get_job(job["id"])["step"] or 0) > 0, 30)
    server.kill()
    killed_at = time.time()
    runner.say(f"kill -9 the server (pid {server.proc.pid if server.proc else '?'}); the job goes on")
    members = watcher.generations()[-1]["members"]
    if len(members) > 1:  # a generation change the server must learn about once it is back
        runner.say(f"kill -9 worker {members[-1]['worker_id']} while the server is down")
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(members[-1]["pid"]), signal.SIGKILL)
    steps = watcher.committed()
    wait_until("20 more steps without the server", lambda: watcher.committed() >= steps + 20)
    restart_s = server.start()
    restarted_at, at_restart = time.monotonic(), watcher.committed()
    runner.say(f"server restarted ({restart_s:.2f}s to answer)")
    with server.client() as c:
        wait_until("progress after the restart", lambda: (c.get_job(job["id"])["step"] or 0) > at_restart, 60)
        resumed_s = time.monotonic() - restarted_at
        slow.unlink()
        done = wait_until(
            "the job to end", lambda: (j := c.get_job(job["id"]))["status"] != "Running" and j, 600
        )
        incidents = [e["detail"] for e in c.job_events(job["id"]) if e["action"] == "job.incident"]
        containers = {k.name: k.pid for k in c.get_cluster("chaos").containers}
    code = -1 if done["exit_code"] is None else int(done["exit_code"])
    result = runner.judge(scenario, records, code, killed_at, reference, params)
    expected = 1 + (len(members) > 1)  # the start, and the worker lost while the server was down
    result.update(
        server_restart_s=round(restart_s, 3),
        progress_resumed_s=round(resumed_s, 3),
        incidents_in_api=[(i["generation"], i["cause"]) for i in incidents],
        containers_adopted=len(containers) == scenario.hosts and all(containers.values()),
    )
    result["passed"] = bool(result["passed"] and len(incidents) >= expected and result["containers_adopted"])
    runner.say(f"{scenario.name}: server figures {result['incidents_in_api']} resumed {resumed_s:.2f}s")
    return result
