"""What the server writes is not readable by other users of the machine (issue: files created 0600/0700).

A real server on the process backend, started on a data directory and a database that already exist
with loose modes (0755, 0644): after a user, a cluster, an exec and a job, the data directory is 0700,
the database (and its -wal/-shm), the admin token, the job's log and exit files and the container logs
carry no group or other bits, nor do the per-cluster directories.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from elastrain.db.session import Database
from elastrain.testing.clusters import all_running
from elastrain.testing.server import ControlPlane

pytestmark = pytest.mark.timeout(180)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def _private(path: Path) -> bool:
    """No group or other bits."""
    return _mode(path) & 0o077 == 0


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    plane = ControlPlane(tmp_path_factory.mktemp("modes"))  # process backend, exec and jobs allowed
    plane.data.mkdir(mode=0o755)
    os.chmod(plane.data, 0o755)  # an older server's data directory
    db = plane.data / "elastrain.db"
    db.touch()
    os.chmod(db, 0o644)  # an empty file is an empty SQLite database: the server migrates it
    try:
        plane.start()
        yield plane
    finally:
        plane.cleanup()


def _job_done(plane: ControlPlane, token: str, job_id: int) -> dict[str, object]:
    with plane.client(token) as c:
        deadline = time.monotonic() + 60
        while (job := c.get_job(job_id))["status"] == "Running":
            assert time.monotonic() < deadline, job
            time.sleep(0.2)
    return job


def test_server_files_are_private(plane: ControlPlane) -> None:
    with plane.client() as admin:
        token = admin.create_user("modes-alice")
    with plane.client(token) as c:
        c.create_cluster("fm", containers=2, gpus_per_container=0)
        c.wait_cluster("fm", all_running)
        out = "".join(str(item) for item in c.exec("fm", ["sh", "-c", "echo hi"]))
        assert "hi" in out
        job = c.submit_job("fm", ["sh", "-c", "echo job-output"])
    assert _job_done(plane, token, int(job["id"]))["status"] == "Succeeded"
    data = plane.data
    assert _mode(data) == 0o700
    for name in ("elastrain.db", "elastrain.db-wal", "elastrain.db-shm", "admin-token"):
        path = data / name
        if name.endswith(("-wal", "-shm")) and not path.exists():
            continue  # SQLite removed it (checkpointed): nothing to read
        assert _private(path), f"{name} is {oct(_mode(path))}"
    clusters = data / "clusters"
    cluster = clusters / "fm"
    assert _private(clusters) and _private(cluster), (oct(_mode(clusters)), oct(_mode(cluster)))
    containers = [p for p in cluster.iterdir() if (p / "container.json").exists()]
    assert len(containers) == 2 and all(_private(p) for p in containers)
    logs = sorted(cluster.glob("*/var/log/jobs/*"))
    assert {p.suffix for p in logs} >= {".log", ".exit"}, logs
    logs += sorted(cluster.glob("*/var/log/container.log"))
    loose = {str(p.relative_to(data)): oct(_mode(p)) for p in logs if not _private(p)}
    assert not loose, f"logs readable by others: {loose}"
    assert b"job-output" in next(p for p in logs if p.suffix == ".log").read_bytes()
    for top in data.iterdir():  # nothing at the top of the data directory is open to others either
        assert _private(top) or top.name == "clusters", f"{top.name} is {oct(_mode(top))}"
    with plane.client(token) as c:
        c.delete_cluster("fm")
        c.wait_deleted("fm")


def test_a_new_sqlite_database_and_its_wal_are_0600(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        db = Database(f"sqlite:///{tmp_path / 'x.db'}")
        db.migrate()
        with db.engine.connect() as connection:  # keep a connection: -wal and -shm exist while it lives
            connection.execute(text("CREATE TABLE IF NOT EXISTS probe (x INTEGER)"))
            connection.commit()
            made = sorted(p.name for p in tmp_path.iterdir())
            assert {"x.db", "x.db-wal", "x.db-shm"} <= set(made), made
            assert {p.name: oct(_mode(p)) for p in tmp_path.iterdir() if not _private(p)} == {}
        db.dispose()
    finally:
        os.umask(old)
