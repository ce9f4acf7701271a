"""The control plane end to end: a real `elastrain server` process on a free port (SQLite, PostgreSQL).

create -> Running -> hostfile -> scale 2->4 -> exec -> scale 4->2 -> delete (no process left), auth
isolation, bad input (4xx with a message), a dead container replaced, GPU shortage, kill -9 + restart.
Every process started here is stopped by PID; every wait is a bounded poll.
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
from elastrain.client import Client, ClientError, ClusterInfo

pytestmark = pytest.mark.timeout(120)
REPO = Path(__file__).resolve().parents[2]
TIMINGS: dict[str, float] = {}


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


def init_pids(data_dir: Path) -> set[int]:
    """PIDs of the container init processes living under `data_dir`."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ours = b"elastrain.backends.container_proc" in argv and any(str(data_dir).encode() in a for a in argv)
        if ours and pid_alive(int(entry.name)):
            found.add(int(entry.name))
    return found


class Postgres:
    """A private PostgreSQL (Debian's binaries): initdb + pg_ctl on a free port and a temp socket dir."""

    def __init__(self) -> None:
        self.bindir = _pg_bindir()
        self.root = Path(tempfile.mkdtemp(prefix="elastrain-pg-"))
        self.port = free_port()
        self._dbs = 0
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
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


def _pg_bindir() -> Path:
    def find() -> Path | None:
        found = shutil.which("initdb")
        if found and shutil.which("pg_ctl"):
            return Path(found).parent
        candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
        return candidates[-1].parent if candidates else None

    bindir = find()
    if bindir is None and os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run(
            ["apt-get", "install", "-y", "-q", "postgresql"],
            capture_output=True,
            timeout=600,
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        )
        bindir = find()
    if bindir is None:
        pytest.skip("PostgreSQL (initdb, pg_ctl) is not installed")
    return bindir


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    server = Postgres()
    yield server
    server.stop()


class ControlPlane:
    """One `elastrain server` process with its own data dir (and database)."""

    def __init__(self, root: Path, db_url: str | None = None, gpus: int = 8) -> None:
        self.root = root
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
            "--gpus",
            str(self.gpus),
            "--allow-mount",
            str(self.mounts),
            "--drain-seconds",
            "0.5",
            "--reconcile-interval",
            "0.2",
        ]
        if self.db_url:
            argv += ["--db", self.db_url]
        log = open(self.root / "server.log", "ab")  # noqa: SIM115 - closed when the process ends
        t0 = time.monotonic()
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        log.close()
        probe = Client(self.url, "")
        try:
            wait_for(
                lambda: probe.health() or self.proc is None or self.proc.poll() is not None, 30, "server"
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
        if self.proc is not None and self.proc.poll() is None:
            with self.client() as admin:
                for cluster in admin.list_clusters():
                    admin.delete_cluster(cluster.name)
                for cluster in admin.list_clusters():
                    admin.wait_deleted(cluster.name, timeout=30)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        leftovers = init_pids(self.data)
        for pid in leftovers:
            os.kill(pid, signal.SIGKILL)
        assert not leftovers, f"container processes left running: {leftovers}"


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def cp(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    db_url = request.getfixturevalue("postgres").new_database() if request.param == "postgres" else None
    plane = ControlPlane(tmp_path_factory.mktemp(f"cp-{request.param}"), db_url)
    plane.start()
    yield plane
    plane.cleanup()


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
    """All containers Running and the hostfile listing exactly the Running workers."""

    def check(cluster: ClusterInfo) -> bool:
        workers = sorted(k.address for k in cluster.running("worker"))
        return all_running(cluster) and sorted(hostfile_hosts(c.hostfile(name))) == workers

    return check


def _hostfile_with(c: Client, name: str, workers: int) -> str | None:
    text = c.hostfile(name)
    return text if len(hostfile_hosts(text)) == workers else None


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
        cluster = c.wait_cluster("tthvd", settled(c, "tthvd"), timeout=20)
        TIMINGS["create -> all Running"] = time.monotonic() - t0
        got = json.loads(cp.cli("cluster", "get", "tthvd", "-o", "json").stdout)
        assert {"name", "framework", "containers", "desired_containers", "hostfile_generation"} <= set(got)
        assert [k["role"] for k in got["containers"]] == ["launcher", "worker"]
        for k in got["containers"]:
            assert {"name", "role", "address", "gpus", "state"} <= set(k)
            assert k["address"].startswith("127.") and k["gpus"] == 1 and k["state"] == "Running"
        pids = {k.pid for k in cluster.containers}
        assert all(p and pid_alive(p) for p in pids)
        worker = cluster.running("worker")[0]
        text = c.hostfile("tthvd")
        assert hostfile_hosts(text) == [worker.address] and text.startswith("# generation: ")
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
            "cat /etc/mpi/hostfile; cat /data/hello.txt; echo gpus=$ELASTRAIN_VISIBLE_GPUS; exit 3",
        )
        assert out.returncode == 3 and text in out.stdout and "hi\n" in out.stdout and "gpus=0" in out.stdout

        t0 = time.monotonic()
        assert cp.cli("cluster", "scale", "tthvd", "--containers", "4").returncode == 0
        text = wait_for(lambda: _hostfile_with(c, "tthvd", 3), 20, "3 workers in the hostfile")
        TIMINGS["scale 2->4 -> hostfile updated"] = time.monotonic() - t0
        cluster = c.wait_cluster("tthvd", settled(c, "tthvd"), timeout=20)
        TIMINGS["scale 2->4 -> all Running"] = time.monotonic() - t0
        assert sorted(hostfile_hosts(text)) == sorted(k.address for k in cluster.running("worker"))
        assert len({k.address for k in cluster.containers}) == 4
        big_pids = {k.pid for k in cluster.containers}

        assert cp.cli("cluster", "scale", "tthvd", "--containers", "2").returncode == 0
        cluster = c.wait_cluster(
            "tthvd", lambda x: len(x.containers) == 2 and settled(c, "tthvd")(x), timeout=20
        )
        assert len(hostfile_hosts(c.hostfile("tthvd"))) == 1
        wait_for(
            lambda: not any(pid_alive(p) for p in big_pids - {k.pid for k in cluster.containers}),
            10,
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
        for token in ("", "et_wrong"):
            with cp.client(token) as anon, pytest.raises(ClientError) as err:
                anon.list_clusters()
            assert err.value.status == 401
        alice.delete_cluster("alice-c")
        alice.wait_deleted("alice-c")


BAD_CREATES = [
    ({"name": "Bad_Name"}, "DNS label"),
    ({"name": "ok1", "containers": 1}, "launcher"),
    ({"name": "ok2", "framework": "tensorflow"}, "horovod, deepspeed, megatron, pytorch, slurm"),
    ({"name": "ok3", "gpus_per_container": -1}, ">= 0"),
    ({"name": "ok4", "shm": "lots"}, "512Mi"),
    ({"name": "ok5", "mounts": ["/etc:/data"]}, "outside the allowed roots"),
    ({"name": "ok6", "mounts": ["/nonexistent/x:/data"]}, "does not exist"),
    ({"name": "ok7", "containers": 3, "gpus_per_container": 4}, "this node has 8 virtual GPUs"),
    ({"name": "ok8", "containers": "many"}, "containers"),
    ({"name": "ok9", "bogus": 1}, "bogus"),
    ({}, "name"),
]


@pytest.mark.parametrize("body,message", BAD_CREATES)
def test_bad_input_is_a_4xx_with_a_message(cp: ControlPlane, body: dict[str, Any], message: str) -> None:
    import httpx

    response = httpx.post(
        f"{cp.url}/api/v1/clusters", json=body, headers={"Authorization": f"Bearer {cp.token}"}
    )
    assert 400 <= response.status_code < 500, response.text
    assert message in response.json()["error"]


def test_bad_requests_never_500(cp: ControlPlane) -> None:
    import httpx

    headers = {"Authorization": f"Bearer {cp.token}"}
    for method, path, kwargs in [
        (
            "POST",
            "/clusters",
            {"content": b"{not json", "headers": {**headers, "content-type": "application/json"}},
        ),
        ("PATCH", "/clusters/nope", {"json": {"containers": 3}, "headers": headers}),
        ("PATCH", "/clusters/nope", {"json": {"containers": "x"}, "headers": headers}),
        ("GET", "/clusters/NOT_A_NAME", {"headers": headers}),
        ("POST", "/clusters/nope/exec", {"json": {"command": []}, "headers": headers}),
        ("GET", "/no-such-route", {"headers": headers}),
        ("DELETE", "/healthz", {}),
    ]:
        response = httpx.request(method, f"{cp.url}/api/v1{path}", **kwargs)
        assert 400 <= response.status_code < 500, (method, path, response.text)
        assert response.json()["error"]


def test_cli_errors_are_one_line(cp: ControlPlane) -> None:
    sqlite_only(cp)
    result = cp.cli("cluster", "create", "x", "--containers", "1")
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and "launcher" in result.stderr
    result = cp.cli("cluster", "get", "missing", token="et_bad")
    assert result.returncode != 0 and "401" in result.stderr and "Traceback" not in result.stderr


def test_dead_container_is_replaced_and_leaves_the_hostfile(cp: ControlPlane) -> None:
    sqlite_only(cp)
    with cp.client() as c:
        cluster = c.create_cluster("crashy", containers=3)
        cluster = c.wait_cluster("crashy", settled(c, "crashy"), timeout=20)
        victim = cluster.running("worker")[0]
        generation = cluster.hostfile_generation
        assert victim.pid is not None
        os.kill(victim.pid, signal.SIGKILL)
        wait_for(
            lambda: victim.address not in c.hostfile("crashy"), 10, "the hostfile to drop the dead container"
        )
        cluster = c.wait_cluster(
            "crashy", lambda x: settled(c, "crashy")(x) and victim.pid not in {k.pid for k in x.containers}
        )
        assert len(hostfile_hosts(c.hostfile("crashy"))) == 2 and cluster.hostfile_generation > generation
        actions = [e["action"] for e in c.events("crashy")]
        assert "container.failed" in actions and actions.count("container.created") == 4
        c.delete_cluster("crashy")
        c.wait_deleted("crashy")


def test_cluster_waits_for_gpus(cp: ControlPlane) -> None:
    sqlite_only(cp)
    with cp.client() as c:
        c.create_cluster("big", containers=2, gpus_per_container=3)
        c.wait_cluster("big", all_running)
        c.create_cluster("waiting", containers=2, gpus_per_container=2)
        waiting = c.wait_cluster("waiting", lambda x: "waiting for GPUs" in x.reason)
        assert waiting.state == "Pending" and not waiting.containers
        c.delete_cluster("big")
        c.wait_cluster("waiting", all_running)
        assert c.inventory()["used"] == 4
        c.delete_cluster("waiting")
        c.wait_deleted("waiting")
        c.wait_deleted("big")


def test_restart_mid_scale_adopts_without_duplicates(
    request: pytest.FixtureRequest, cp: ControlPlane
) -> None:
    plane = ControlPlane(
        cp.root / "restart", cp.db_url and request.getfixturevalue("postgres").new_database()
    )
    plane.start()
    try:
        with plane.client() as c:
            c.create_cluster("survivor", containers=2)
            before = c.wait_cluster("survivor", all_running)
            c.scale_cluster("survivor", 4)
            plane.kill()  # kill -9 right after the scale was accepted
        TIMINGS["server restart -> answering"] = plane.start()
        t0 = time.monotonic()
        with plane.client() as c:
            after = c.wait_cluster(
                "survivor", lambda x: all_running(x) and len(hostfile_hosts(c.hostfile("survivor"))) == 3
            )
            TIMINGS["server restart -> reconciled (4 Running, hostfile 3 workers)"] = time.monotonic() - t0
            old = {k.name: k.pid for k in before.containers}
            assert all({k.name: k.pid for k in after.containers}[n] == p for n, p in old.items()), (
                "not adopted"
            )
            assert init_pids(plane.data) == {k.pid for k in after.containers}, "duplicate or orphan processes"
            assert len({k.address for k in after.containers}) == 4
    finally:
        plane.cleanup()


def test_jobs_submit_progress_logs_cancel(cp: ControlPlane) -> None:
    with cp.client() as c:
        c.create_cluster("jobs", containers=2)
        c.wait_cluster("jobs", all_running)
        script = (
            "from elastrain.client import report_progress as r; print('start', flush=True); "
            "assert r(step=5, epoch=1, loss=0.5, samples_per_s=100.0, world_size=2); print('reported')"
        )
        ok = c.submit_job("jobs", ["python", "-c", script])
        job = wait_for(lambda: (j := c.get_job(ok["id"]))["status"] != "Running" and j, 30, "the job to end")
        assert job["status"] == "Succeeded" and job["exit_code"] == 0, c.job_logs(ok["id"])[0]
        assert (job["step"], job["epoch"], job["loss"], job["samples_per_s"], job["world_size"]) == (
            5,
            1,
            0.5,
            100.0,
            2,
        )
        assert "start\nreported\n" in "".join(c.follow_job_logs(ok["id"]))

        failing = c.submit_job(
            "jobs", ["sh", "-c", "echo 'epoch 2 done: world 3, step 7, loss 0.25'; exit 7"]
        )
        job = wait_for(
            lambda: (j := c.get_job(failing["id"]))["status"] != "Running" and j, 30, "the job to end"
        )
        assert (job["status"], job["exit_code"], job["step"], job["world_size"]) == ("Failed", 7, 7, 3)
        out = cp.cli("job", "logs", "-f", str(failing["id"]))
        assert out.returncode == 7 and "epoch 2 done" in out.stdout

        sleeper = c.submit_job("jobs", ["sleep", "60"])
        assert c.cancel_job(sleeper["id"])["status"] == "Cancelled"
        wait_for(lambda: not pid_alive(sleeper["pid"]), 10, "the cancelled job to stop")

        orphan = c.submit_job("jobs", ["sleep", "60"])
        with cp.client(c.create_user("jobless")) as other, pytest.raises(ClientError) as err:
            other.get_job(orphan["id"])
        assert err.value.status == 404
        assert [j["id"] for j in c.list_jobs("jobs")] == [
            ok["id"],
            failing["id"],
            sleeper["id"],
            orphan["id"],
        ]
        c.delete_cluster("jobs")
        c.wait_deleted("jobs")
        assert not pid_alive(orphan["pid"]), "deleting the cluster must stop its jobs"


def test_fuzzed_create_bodies_never_5xx(cp: ControlPlane) -> None:
    import httpx

    sqlite_only(cp)
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    anything = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=True),
        st.text(max_size=80),
        st.lists(st.text(max_size=20), max_size=3),
    )
    body = st.fixed_dictionaries(
        {},
        optional={
            k: anything
            for k in (
                "name",
                "framework",
                "containers",
                "gpus_per_container",
                "shm",
                "image",
                "mounts",
                "restart_policy",
            )
        },
    )
    headers = {"Authorization": f"Bearer {cp.token}"}
    created: list[str] = []

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    @given(body=st.one_of(body, anything))
    def check(body: Any) -> None:
        response = httpx.post(f"{cp.url}/api/v1/clusters", json=body, headers=headers, timeout=30)
        assert response.status_code < 500, (body, response.text)
        if response.status_code == 201:
            created.append(response.json()["name"])

    check()
    with cp.client() as c:
        for name in created:
            c.delete_cluster(name)
        for name in created:
            c.wait_deleted(name)


def test_zz_report_timings() -> None:
    print("\ncontrol-plane timings (s): " + json.dumps({k: round(v, 3) for k, v in TIMINGS.items()}))
