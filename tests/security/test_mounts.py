"""A tenant cannot mount the server's own state into a cluster (issue: mount roots).

The default mount roots (cwd and home) hold the data directory. A mount whose source (links resolved)
is the data directory, is inside it (the admin token, the next job's log) or holds it (a parent) is
refused with one line (403), as is the database file of an SQLite database kept elsewhere, or a
directory holding it. A plain directory still mounts.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from elastrain.server.errors import Forbidden
from elastrain.server.validation import parse_mount, server_state
from tests.security.harness import new_user, refused
from tests.security.test_api_limits import Server, server  # noqa: F401 - the module's server fixture

pytestmark = pytest.mark.timeout(120)


def _create(api: httpx.Client, name: str, mount: str) -> httpx.Response:
    body = {"name": name, "containers": 2, "gpus_per_container": 0, "mounts": [mount]}
    return api.post("/clusters", json=body)


@pytest.fixture(scope="module")
def tenant(server: Server) -> httpx.Client:  # noqa: F811
    return server.http(token=new_user(server, "mount-mallory"))


@pytest.mark.attack
@pytest.mark.parametrize(
    ("name", "below_root", "why"),
    [("m1", "data", "is the server's data directory"), ("m2", "", "holds the server's data directory")],
    ids=["the data directory", "a parent of the data directory"],
)
def test_mounting_the_data_directory_or_a_parent_is_refused(
    server: Server,  # noqa: F811
    tenant: httpx.Client,
    name: str,
    below_root: str,
    why: str,
) -> None:
    refused(_create(tenant, name, f"{server.root / below_root}:/data"), 403, why)


@pytest.mark.attack
def test_mounting_a_link_to_the_data_directory_is_refused(
    server: Server,  # noqa: F811
    tenant: httpx.Client,
) -> None:
    link = server.root / "innocent"
    link.symlink_to(server.root / "data")
    try:
        refused(_create(tenant, "m3", f"{link}:/data"), 403, "is the server's data directory")
        refused(_create(tenant, "m4", f"{link}/clusters:/data"), 403, "is inside the server's data directory")
    finally:
        link.unlink()


@pytest.mark.attack
def test_mounting_the_admin_token_is_refused(server: Server, tenant: httpx.Client) -> None:  # noqa: F811
    token = server.root / "data" / "admin-token"
    refused(_create(tenant, "m5", f"{token}:/token"), 403, "is inside the server's data directory")
    assert tenant.get("/clusters").json() == []  # nothing was created by any refused request


def test_a_plain_directory_still_mounts(server: Server, tenant: httpx.Client) -> None:  # noqa: F811
    data = server.root / "datasets"
    data.mkdir(exist_ok=True)
    made = _create(tenant, "ok", f"{data}:/data")
    assert made.status_code == 201, made.text
    assert made.json()["mounts"] == [f"{data.resolve()}:/data"]
    assert tenant.delete("/clusters/ok").status_code in (200, 202)
    deadline = time.monotonic() + 60  # its processes are gone before the server stops
    while tenant.get("/clusters/ok").status_code != 404:
        assert time.monotonic() < deadline, "cluster ok was not deleted"
        time.sleep(0.2)


@pytest.mark.attack
def test_an_sqlite_database_elsewhere_is_protected(tmp_path: Path) -> None:
    """The database outside the data directory: its file, its -wal, its directory and parents refused."""
    state = tmp_path / "state"
    state.mkdir()
    for name in ("elastrain.db", "elastrain.db-wal"):
        (state / name).touch()
    (tmp_path / "datasets").mkdir()
    protected = server_state(Path("/nonexistent/data-dir"), f"sqlite:///{state / 'elastrain.db'}")
    for source, where in ((state, "holds"), (tmp_path, "holds"), (state / "elastrain.db-wal", "is")):
        with pytest.raises(Forbidden, match=f"{where} the server's database;"):
            parse_mount(f"{source}:/data", [tmp_path], *protected)
    assert parse_mount(f"{tmp_path / 'datasets'}:/data", [tmp_path], *protected).target == "/data"
