"""The control plane end to end: a real `elastrain server` process on a free port (SQLite, PostgreSQL).

This module holds the shared harness (`ControlPlane`, the `cp` and `postgres` fixtures, polling
helpers) and the main flow: create -> Running -> hostfile -> exec -> scale 2->4 -> scale 4->2 ->
delete (no process left), and auth isolation. The sibling modules test_control_plane_{inputs,faults,
jobs} import the harness. Every process started here is stopped by PID; every wait is a bounded poll.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from elastrain.backends.procs import pid_alive
from elastrain.backends.shm import shm_limit_supported
from elastrain.chaos.control_plane import container_inits as init_pids
from elastrain.chaos.control_plane import stop_server
from elastrain.client import Client, ClientError, ClusterInfo

pytestmark = pytest.mark.timeout(120)
REPO = Path(__file__).resolve().parents[2]
TIMINGS_FILE = REPO / "artifacts" / "control_plane_timings.json"


def record_timing(cp: ControlPlane, what: str, seconds: float) -> None:
    """Keep a measured latency in artifacts/control_plane_timings.json (and print it with -s)."""
    key = f"{what} [{'postgres' if cp.db_url else 'sqlite'}]"
    print(f"\ntiming: {key}: {seconds:.3f}s")
    TIMINGS_FILE.parent.mkdir(exist_ok=True)
    try:
        timings = json.loads(TIMINGS_FILE.read_text())
    except (OSError, ValueError):
        timings = {}
    timings[key] = round(seconds, 3)
    TIMINGS_FILE.write_text(json.dumps(timings, indent=1, sort_keys=True) + "\n")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(condition: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    """Poll `condition` every 50 ms until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


class Postgres:
    """A private PostgreSQL (Debian's binaries): initdb + pg_ctl on a free port and a temp socket dir."""

    def __init__(self) -> None:
        self.bindir = _pg_bindir()
        self.root = Path(tempfile.mkdtemp(prefix="elastrain-pg-"))
        self.port = free_port()
        self._dbs = 0
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.as_user and not _has_user("postgres"):
            pytest.skip("running as root and there is no 'postgres' user for initdb")
        if self.as_user:
            shutil.chown(self.root, "postgres")
        data = self.root / "data"
        self._run("initdb", "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8")
        opts = f"-k {self.root} -p {self.port} -c listen_addresses=127.0.0.1 -F"
        self._run(
            "pg_ctl", "-D", str(data), "-o", opts, "-l", str(self.root / "log"), "-w", "-t", "60", "start"
        )

    def _run(self, tool: str, *args: str) -> None:
        subprocess.run(
            [*self.as_user, str(self.bindir / tool), *args], check=True, capture_output=True, timeout=120
        )

    def new_database(self) -> str:
        import psycopg

        self._dbs += 1
        name = f"elastrain_{self._dbs}"
        with psycopg.connect(
            f"postgresql://postgres@127.0.0.1:{self.port}/postgres", autocommit=True
        ) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.root / "data"), "-m", "immediate", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


def _has_user(name: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def _pg_bindir() -> Path:
    def find() -> Path | None:
        found = shutil.which("initdb")
        if found and shutil.which("pg_ctl"):
            return Path(found).parent
        candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
        return candidates[-1].parent if candidates else None

    bindir = find()
    if bindir is None and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for step in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "postgresql"]):
            subprocess.run(step, capture_output=True, timeout=600, env=env, check=False)
        bindir = find()
    if bindir is None:
        pytest.skip("PostgreSQL (initdb, pg_ctl) is not installed")
    return bindir


class ControlPlane:
    """One `elastrain server` process with its own data dir (and database)."""

    def __init__(
        self, root: Path, db_url: str | None = None, gpus: int | None = 8, extra_args: tuple[str, ...] = ()
    ) -> None:
        """`gpus`: virtual GPUs to declare (None: the server detects the real ones)."""
        self.root = root
        self.extra_args = extra_args
        self.data = root / "data"
        self.mounts = root / "mounts"
        self.mounts.mkdir(parents=True, exist_ok=True)
        self.db_url = db_url
        self.gpus = gpus
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.token = ""

    def start(self) -> float:
        """Start the server; returns the seconds until it answered."""
        argv = [
            sys.executable,
            "-m",
            "elastrain",
            "server",
            "--port",
            str(self.port),
            "--data-dir",
            str(self.data),
            *(["--gpus", str(self.gpus)] if self.gpus is not None else []),
            "--allow-mount",
            str(self.mounts),
            "--drain-seconds",
            "20",  # the bound; scale-in waits for the jobs' reports that the workers have left
            "--reconcile-interval",
            "0.2",
        ]
        # the database URL goes in the environment, never in argv (`ps` shows argv to every user)
        env = {k: v for k, v in os.environ.items() if k.upper() != "ELASTRAIN_DB"}
        if self.db_url:
            env["ELASTRAIN_DB"] = self.db_url
        if "--backend" not in self.extra_args:  # the tests exec and submit jobs: allow it on purpose
            argv += ["--backend", "process", "--insecure-process-backend"]
        argv += self.extra_args
        log = open(self.root / "server.log", "ab")  # noqa: SIM115 - closed when the process ends
        t0 = time.monotonic()
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env)
        log.close()
        probe = Client(self.url, "")
        try:
            wait_for(
                lambda: probe.health() or self.proc is None or self.proc.poll() is not None, 60, "server"
            )
        finally:
            probe.close()
        assert self.proc.poll() is None, (self.root / "server.log").read_text()[-3000:]
        self.token = (self.data / "admin-token").read_text().strip()
        return time.monotonic() - t0

    def client(self, token: str | None = None) -> Client:
        return Client(self.url, self.token if token is None else token)

    def cli(self, *args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            "ELASTRAIN_URL": self.url,
            "ELASTRAIN_TOKEN": self.token if token is None else token,
        }
        argv = [sys.executable, "-m", "elastrain", *args]
        return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=self.root, timeout=60)

    def kill(self) -> None:
        """kill -9 the server (its containers keep running)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def cleanup(self) -> None:
        """Delete every cluster through the API, stop the server, then stop leftover inits by PID."""
        if self.proc is not None:
            stop_server(self.proc, self.client)
        leftovers = init_pids(self.data)
        for pid in leftovers:
            os.kill(pid, signal.SIGKILL)
        assert not leftovers, f"container processes left running: {leftovers}"


# The sibling modules import these fixtures, which makes one fixture definition per module; the
# registry below lets them share one PostgreSQL and one server per database kind (reference-counted).
_SHARED: dict[str, tuple[Any, int]] = {}


def _acquire(key: str, make: Callable[[], Any]) -> Any:
    value, count = _SHARED.get(key, (None, 0))
    if count == 0:
        value = make()
    _SHARED[key] = (value, count + 1)
    return value


def _release(key: str, close: Callable[[Any], None]) -> None:
    value, count = _SHARED[key]
    if count == 1:
        del _SHARED[key]
        close(value)
    else:
        _SHARED[key] = (value, count - 1)


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    yield _acquire("postgres", Postgres)
    _release("postgres", Postgres.stop)


@pytest.fixture(scope="session", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def cp(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    def make() -> ControlPlane:
        db_url = request.getfixturevalue("postgres").new_database() if request.param == "postgres" else None
        plane = ControlPlane(tmp_path_factory.mktemp(f"cp-{request.param}"), db_url)
        plane.start()
        return plane

    yield _acquire(f"cp-{request.param}", make)
    _release(f"cp-{request.param}", ControlPlane.cleanup)


def sqlite_only(cp: ControlPlane) -> None:
    """Backend-only behaviour (no database difference): run once, on SQLite, to keep the suite short."""
    if cp.db_url:
        pytest.skip("backend behaviour, tested once on SQLite")


def all_running(cluster: ClusterInfo) -> bool:
    return (
        cluster.state == "Running"
        and len(cluster.containers) == cluster.desired_containers
        and all(c.state == "Running" for c in cluster.containers)
    )


def hostfile_hosts(text: str) -> list[str]:
    return [line.split()[0] for line in text.splitlines() if line and not line.startswith("#")]


def settled(c: Client, name: str) -> Callable[[ClusterInfo], bool]:
    """All containers Running and the hostfile listing exactly the Running containers (launcher too)."""

    def check(cluster: ClusterInfo) -> bool:
        hosts = sorted(k.address for k in cluster.containers if k.state == "Running")
        return all_running(cluster) and sorted(hostfile_hosts(c.hostfile(name))) == hosts

    return check


def job_world(c: Client, job_id: int) -> Callable[[int], Callable[[], bool]]:
    """``world(n)``: a `wait_for` check that the job reports n workers (it must still be Running)."""

    def world(size: int) -> Callable[[], bool]:
        def check() -> bool:
            current = c.get_job(job_id)
            assert current["status"] == "Running", c.job_logs(job_id)[0][-3000:]
            return bool(current["world_size"] == size)

        return check

    return world


def _hostfile_with(c: Client, name: str, hosts: int) -> str | None:
    text = c.hostfile(name)
    return text if len(hostfile_hosts(text)) == hosts else None


def test_cluster_lifecycle(cp: ControlPlane) -> None:
    (cp.mounts / "data").mkdir(exist_ok=True)
    (cp.mounts / "data" / "hello.txt").write_text("hi\n")
    t0 = time.monotonic()
    created = cp.cli(
        "cluster",
        "create",
        "tthvd",
        "--framework",
        "horovod",
        "--containers",
        "2",
        "--gpus-per-container",
        "1",
        "--shm",
        "1Gi",
        "--mount",
        "./mounts/data:/data",
        "--image",
        "local",
    )
    assert created.returncode == 0, created.stderr
    with cp.client() as c:
        cluster = c.wait_cluster("tthvd", settled(c, "tthvd"), timeout=60)
        record_timing(cp, "create -> all Running", time.monotonic() - t0)
        got = json.loads(cp.cli("cluster", "get", "tthvd", "-o", "json").stdout)
        assert {"name", "framework", "containers", "desired_containers", "hostfile_generation"} <= set(got)
        assert [k["role"] for k in got["containers"]] == ["launcher", "worker"]
        for k in got["containers"]:
            assert {"name", "role", "address", "gpus", "state"} <= set(k)
            assert k["address"].startswith("127.") and k["gpus"] == 1 and k["state"] == "Running"
        pids = {k.pid for k in cluster.containers}
        assert all(p and pid_alive(p) for p in pids)
        launcher, worker = cluster.running("launcher")[0], cluster.running("worker")[0]
        text = c.hostfile("tthvd")  # the launcher runs a worker too: 2 containers, -np 2
        assert hostfile_hosts(text) == [launcher.address, worker.address] and text.startswith(
            "# generation: "
        )
        assert cp.cli("cluster", "hostfile", "tthvd").stdout == text
        assert f"up at {cluster.containers[0].address}" in cp.cli("cluster", "logs", "tthvd").stdout
        for k in cluster.containers:  # every container reads the same file at its etc/mpi/hostfile
            assert (cp.data / "clusters" / "tthvd" / k.name / "etc" / "mpi" / "hostfile").read_text() == text

        out = cp.cli(
            "cluster",
            "exec",
            "tthvd",
            "--",
            "sh",
            "-c",
            "cat /etc/mpi/hostfile; cat /data/hello.txt; echo gpus=$ELASTRAIN_VISIBLE_GPUS; "
            "echo shm=$(df -k /dev/shm | tail -1 | awk '{print $2}'); exit 3",
        )
        assert out.returncode == 3 and text in out.stdout and "hi\n" in out.stdout and "gpus=0" in out.stdout
        if shm_limit_supported():  # root: the container's /dev/shm is a tmpfs of --shm 1Gi, as in docker
            assert "shm=1048576\n" in out.stdout, out.stdout

        t0 = time.monotonic()
        assert cp.cli("cluster", "scale", "tthvd", "--containers", "4").returncode == 0
        text = wait_for(lambda: _hostfile_with(c, "tthvd", 4), 60, "4 hosts in the hostfile")
        record_timing(cp, "scale 2->4 -> hostfile updated", time.monotonic() - t0)
        cluster = c.wait_cluster("tthvd", settled(c, "tthvd"), timeout=60)
        record_timing(cp, "scale 2->4 -> all Running", time.monotonic() - t0)
        assert sorted(hostfile_hosts(text)) == sorted(k.address for k in cluster.containers)
        assert len({k.address for k in cluster.containers}) == 4
        big_pids = {k.pid for k in cluster.containers}

        assert cp.cli("cluster", "scale", "tthvd", "--containers", "2").returncode == 0
        cluster = c.wait_cluster(
            "tthvd", lambda x: len(x.containers) == 2 and settled(c, "tthvd")(x), timeout=60
        )
        assert len(hostfile_hosts(c.hostfile("tthvd"))) == 2
        wait_for(
            lambda: not any(pid_alive(p) for p in big_pids - {k.pid for k in cluster.containers}),
            60,
            "scaled-down containers to stop",
        )
        assert {"cluster.scaled", "hostfile.written", "container.removed"} <= {
            e["action"] for e in c.events("tthvd")
        }

        deleted = cp.cli("cluster", "delete", "tthvd")
        assert deleted.returncode == 0, deleted.stderr
        with pytest.raises(ClientError) as err:
            c.get_cluster("tthvd")
        assert err.value.status == 404
        assert not any(pid_alive(p) for p in big_pids | pids)
        assert not init_pids(cp.data) and not (cp.data / "clusters" / "tthvd").exists()


def test_auth_isolation(cp: ControlPlane) -> None:
    assert (cp.data / "admin-token").stat().st_mode & 0o777 == 0o600
    with cp.client() as admin:
        alice = cp.client(admin.create_user("alice"))
        bob = cp.client(admin.create_user("bob"))
    with alice, bob:
        alice.create_cluster("alice-c", containers=2)
        assert [c.name for c in alice.list_clusters()] == ["alice-c"]
        assert bob.list_clusters() == []
        calls = [
            lambda: bob.get_cluster("alice-c"),
            lambda: bob.scale_cluster("alice-c", 3),
            lambda: bob.delete_cluster("alice-c"),
            lambda: bob.hostfile("alice-c"),
            lambda: list(bob.exec("alice-c", ["true"])),
            lambda: bob.events("alice-c"),
        ]
        for call in calls:
            with pytest.raises(ClientError) as err:
                call()
            assert err.value.status == 404 and "not found" in str(err.value)
        with pytest.raises(ClientError) as err:
            bob.create_user("mallory")
        assert err.value.status == 403
        with cp.client() as admin:  # an admin sees every cluster but runs commands only in their own
            assert admin.get_cluster("alice-c").owner == "alice"
            for call in (
                lambda: list(admin.exec("alice-c", ["true"])),
                lambda: admin.submit_job("alice-c", ["true"]),
            ):
                with pytest.raises(ClientError) as err:
                    call()
                assert err.value.status == 403 and "owner" in str(err.value)
        for token in ("", "et_wrong"):
            with cp.client(token) as anon, pytest.raises(ClientError) as err:
                anon.list_clusters()
            assert err.value.status == 401
        alice.delete_cluster("alice-c")
        alice.wait_deleted("alice-c")
