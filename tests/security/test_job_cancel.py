"""`DELETE /jobs/{id}` signals only processes proven to be in the job's container (issue 14, item 3).

A real `elastrain server` (process backend, the fixture of test_api_limits): a job's stored pid is
pointed at a decoy (a `sleep` whose argv names elastrain, leading its own process group, as the
attack used), the job is cancelled, and the decoy lives. Attaching the decoy's pid is refused too.
"""

from __future__ import annotations

import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from elastrain.backends.api import ContainerSpec
from elastrain.backends.local import LocalBackend
from elastrain.backends.procs import pid_alive
from tests.security.test_api_limits import Server, server  # noqa: F401 - the module's server fixture

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def decoy() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["elastrain-decoy", "300"], executable="sleep", start_new_session=True)
    deadline = time.monotonic() + 10
    while "elastrain-decoy" not in Path(f"/proc/{proc.pid}/cmdline").read_text():  # exec'd yet?
        assert time.monotonic() < deadline
        time.sleep(0.02)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _running_cluster(api: httpx.Client, name: str) -> None:
    created = api.post("/clusters", json={"name": name, "containers": 2, "gpus_per_container": 0})
    assert created.status_code == 201, created.text
    deadline = time.monotonic() + 60
    while api.get(f"/clusters/{name}").json()["state"] != "Running":
        assert time.monotonic() < deadline, api.get(f"/clusters/{name}").text
        time.sleep(0.2)


@pytest.mark.attack
def test_cancel_never_signals_a_decoy(server: Server, decoy: subprocess.Popen[bytes]) -> None:  # noqa: F811
    assert "elastrain" in Path(f"/proc/{decoy.pid}/cmdline").read_text()
    with server.http() as api:
        _running_cluster(api, "cancel-decoy")
        job = api.post("/clusters/cancel-decoy/jobs", json={"command": ["sleep", "300"]})
        assert job.status_code in (200, 201), job.text
        job_id = job.json()["id"]
        # the stored pid now names the decoy (what `POST /jobs/attach` stored before the fix; a reused pid)
        with sqlite3.connect(server.root / "data" / "elastrain.db") as db:
            db.execute("UPDATE jobs SET pid = ? WHERE id = ?", (decoy.pid, job_id))
        cancelled = api.delete(f"/jobs/{job_id}")
        assert cancelled.status_code == 200, cancelled.text
        time.sleep(1.0)
        assert decoy.poll() is None and pid_alive(decoy.pid), "the server signalled a process outside the job"
        api.delete("/clusters/cancel-decoy")


@pytest.mark.attack
def test_a_pid_outside_the_container_is_not_its_own(tmp_path: Path, decoy: subprocess.Popen[bytes]) -> None:
    """What `POST /jobs/attach` asks the backend: the decoy is no process of the container; a process
    started in the container is. Stopping the decoy's pid is refused."""
    backend = LocalBackend(tmp_path)
    spec = ContainerSpec("c", "uid1", "c-launcher", "launcher", "127.0.0.1")
    assert backend.own_pid(spec, decoy.pid) is None
    backend.stop_processes(spec, "ELASTRAIN_JOB_ID", "1", decoy.pid, 15)
    time.sleep(0.3)
    assert decoy.poll() is None
    (tmp_path / "clusters" / "c" / "c-launcher").mkdir(parents=True)
    inside = backend.exec(spec, ["sleep", "300"])
    try:
        deadline = time.monotonic() + 10  # until the child has exec'd (its environment is the marker)
        while backend.own_pid(spec, inside.pid) is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert backend.own_pid(spec, inside.pid) == inside.pid
        other = ContainerSpec("c", "uid2", "c-launcher", "launcher", "127.0.0.1")  # another cluster's
        assert backend.own_pid(other, inside.pid) is None
        backend.stop_processes(spec, "ELASTRAIN_JOB_ID", "1", inside.pid, 15)
        assert inside.wait(timeout=10) == -15
    finally:
        inside.kill()
        inside.wait()
