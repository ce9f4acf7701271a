"""An admin's host-path mount cannot expose the server's own state (issue: mount roots; since issue 29
only admins mount host paths, tenants mount storage areas: test_storage_areas).

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
    """Who may ask for a host path at all: an admin (a tenant's host path is refused before any of
    these checks, see test_storage_areas), here a second admin, not the server's own."""
    return server.http(token=new_user(server, "mount-mallory", admin=True))


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


RESERVED = [
    "/var/log/jobs",
    "/var/log/jobs/1.log",
    "/etc/mpi/hostfile",
    "//etc/mpi/./x/",
    "/etc/elastrain/keys",
]


@pytest.mark.attack
@pytest.mark.parametrize("target", RESERVED, ids=[t.strip("/").replace("/", "-") for t in RESERVED])
def test_a_mount_at_or_under_a_platform_directory_is_refused(
    server: Server,  # noqa: F811
    tenant: httpx.Client,
    target: str,
) -> None:
    """On the process and Slurm backends a mount is a link in the container's directory: one at
    /var/log/jobs would have the server write job logs (or read the hostfile) in the tenant's chosen
    directory. At or under a platform directory, the mount is refused (403, one line) and nothing is
    created: no cluster, no container directory, nothing in the source."""
    source = server.root / "chosen"
    source.mkdir(exist_ok=True)
    before = sorted(source.iterdir())
    name = "r-" + target.strip("/").replace("/", "-").replace(".", "x").strip("-")[:40]
    message = refused(_create(tenant, name, f"{source}:{target}"), 403, "reserved by the platform", "/data")
    assert "mount target" in message  # names the field
    assert tenant.get(f"/clusters/{name}").status_code == 404
    assert not (server.data / "clusters" / name).exists()
    assert sorted(source.iterdir()) == before


@pytest.mark.attack
def test_a_stored_mount_under_a_platform_directory_is_refused_at_start(tmp_path: Path) -> None:
    """A mount an older server accepted (/var/log/jobs) is refused when a container starts, before the
    backend links anything there (the reconciler fails that container with the message)."""
    from elastrain.backends.api import Mount
    from elastrain.server.validation import check_mount_unchanged

    source = tmp_path / "chosen"
    source.mkdir()
    for target in ("/var/log/jobs", "/etc/mpi/hostfile", "/var/log"):
        with pytest.raises(Forbidden, match="reserved by the platform"):
            check_mount_unchanged(Mount(str(source.resolve()), target))
    check_mount_unchanged(Mount(str(source.resolve()), "/data"))
    # and the process/Slurm backends' layout never replaces its own paths by a link either
    from elastrain.backends.local import LocalBackend
    from elastrain.errors import ConfigError

    root = tmp_path / "container-root"
    (root / "var" / "log" / "jobs").mkdir(parents=True)
    for target in ("/var/log/jobs", "/etc/mpi/hostfile", "/container.json", "/"):
        with pytest.raises(ConfigError, match="would replace the container's own"):
            LocalBackend(tmp_path / "data")._mount(root, Mount(str(source), target))
    assert (root / "var" / "log" / "jobs").is_dir() and not (root / "var" / "log" / "jobs").is_symlink()
    assert not (root / "etc" / "mpi").exists() and list(source.iterdir()) == []


def test_ordinary_targets_still_mount(tmp_path: Path) -> None:
    """Targets next to the platform's, or deeper in the tenant's own tree, are accepted."""
    (tmp_path / "d").mkdir()
    for target in (
        "/data",
        "/mnt/x",
        "/workspace",
        "/var/lib/x",
        "/etc/myapp",
        "/var/logs",
        "/etc/mpix",
        "/home/me",
    ):
        assert parse_mount(f"{tmp_path / 'd'}:{target}", [tmp_path]).target == target
