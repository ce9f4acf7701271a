"""Mounts are tenant storage, not host paths (issue 29 item 2).

Replayed attacks: bob mounted alice's storage directory and overwrote her checkpoint; a mount read a
file under the server user's 0700 home; the mount's re-check at container start was raced with a
symbolic-link swap. Now bob names only his own areas (alice's name is a 404 to him), a host path is
for admins only (403, one line saying to use ``storage:NAME``), and an area cannot be swapped: every
directory above it is the server's, so a swapper running as the tenant's uid on the host gets nowhere
while the cluster starts, and the container sees the area. The owner's area is writable by the tenant's
uid inside the container and outlives the cluster.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from elastrain.server.reconciler import TENANT_UID_BASE
from elastrain.testing.containers import ContainerPlane, container_plane, framework_image, need_podman
from elastrain.testing.waits import wait_until
from tests.security.harness import Server, new_user, refused, start_server
from tests.security.test_tenant_files import running_cluster

pytestmark = pytest.mark.timeout(900)

HOST_PYTHON = "/usr/bin/python3"  # the tenant's uid may not reach the test's own interpreter
SWAPPER = r"""
import os, signal, sys
area, decoy = sys.argv[1:3]
tries = swapped = 0
def done(*_):
    print(tries, swapped, flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, done)
while True:
    tries += 1
    try:
        os.rename(area, area + ".gone")
        os.symlink(decoy, area)
        swapped += 1
    except OSError:
        pass
"""


@contextmanager
def swapping(area: Path, decoy: Path, uid: int) -> Iterator[list[int]]:
    """A process running as `uid` on the host that tries, over and over, to replace `area` by a link to
    `decoy` (the race of the report); on exit the list holds [tries, successful swaps]."""
    counts: list[int] = []
    python = HOST_PYTHON if Path(HOST_PYTHON).exists() else pytest.skip(f"{HOST_PYTHON} is missing")
    proc = subprocess.Popen(
        [python, "-I", "-c", SWAPPER, str(area), str(decoy)],
        user=uid,
        group=uid,
        cwd="/",
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        yield counts
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        counts.extend(int(n) for n in out.split())


def _need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("the swapper runs as a tenant's uid: needs root to switch to it")


def _area(server: Server, name: str) -> Path:
    (found,) = (server.root / "data" / "storage").glob(f"u*/{name}")
    return found


def _exec(api: httpx.Client, cluster: str, script: str) -> str:
    """`script` run by sh in the cluster's launcher as its tenant: its output (it must exit 0)."""
    answer = api.post(f"/clusters/{cluster}/exec", json={"command": ["sh", "-c", script]}, timeout=120)
    assert answer.status_code == 200, answer.text
    lines = [json.loads(line) for line in answer.text.splitlines() if line.strip()]
    assert lines[-1].get("exit") == 0, lines
    return "".join(str(line.get("out", "")) for line in lines)


def _deleted(api: httpx.Client, name: str) -> None:
    api.delete(f"/clusters/{name}")
    wait_until(lambda: api.get(f"/clusters/{name}").status_code == 404, 180, f"cluster {name} deleted")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with start_server(tmp_path_factory.mktemp("storage")) as running:
        yield running


@pytest.mark.attack("29.storage")
def test_bob_cannot_mount_read_or_delete_alices_area(server: Server) -> None:
    alice, bob = server.http(new_user(server, "alice")), server.http(new_user(server, "bob"))
    assert alice.post("/storage", json={"name": "ckpt"}).status_code == 201
    body = {"name": "steal", "containers": 2, "mounts": ["storage:ckpt:/data"]}
    refused(bob.post("/clusters", json=body), 404, "storage area 'ckpt' not found")
    refused(bob.get("/storage/ckpt"), 404)
    refused(bob.delete("/storage/ckpt"), 404)
    assert bob.get("/storage").json() == []
    assert bob.get("/clusters/steal").status_code == 404
    assert alice.get("/storage/ckpt").status_code == 200  # still hers


@pytest.mark.attack("29.storage")
@pytest.mark.parametrize("where", ["another tenant's directory", "a file under a 0700 home"])
def test_a_tenant_cannot_mount_a_host_path(server: Server, where: str) -> None:
    mallory = server.http(new_user(server, f"host-{len(where)}"))
    home = server.root / "home"
    (home / ".ssh").mkdir(parents=True, exist_ok=True)
    os.chmod(home, 0o700)
    (home / ".ssh" / "notes").write_text("the server user's\n")
    os.chmod(home / ".ssh" / "notes", 0o644)
    (server.root / "alice-data").mkdir(mode=0o777, exist_ok=True)
    source = server.root / "alice-data" if where.startswith("another") else home / ".ssh" / "notes"
    body = {"name": "peek", "containers": 2, "mounts": [f"{source}:/data"]}
    message = refused(mallory.post("/clusters", json=body), 403, "admins only", "storage:NAME:/data")
    assert str(source) not in message
    assert mallory.get("/clusters").json() == []


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ContainerPlane, str]]:
    need_podman()
    _need_root()
    image = framework_image("pytorch")
    with container_plane(tmp_path_factory.mktemp("storage-containers")) as running:
        yield running, image


@pytest.mark.attack("29.mount-race")
def test_a_link_swap_race_cannot_change_what_is_mounted(plane: tuple[ContainerPlane, str]) -> None:
    """While alice's cluster starts, a process with her uid on the host swaps her area for a link to the
    server's data directory as fast as it can: it never succeeds (every directory above the area is
    the server's), and the container's /data is her area."""
    server, image = plane
    alice = server.http(new_user(server, "alice"))
    assert alice.post("/storage", json={"name": "ckpt"}).status_code == 201
    area = _area(server, "ckpt")
    uid = area.stat().st_uid
    assert uid > TENANT_UID_BASE and oct(area.stat().st_mode & 0o777) == "0o700"
    (area / "marker").write_text("alice's area\n")
    with swapping(area, server.root / "data", uid) as counts:
        running_cluster(alice, "race", framework="pytorch", image=image, mounts=["storage:ckpt:/data"])
        out = _exec(alice, "race", "cat /data/marker; ls /data")
    tries, swapped = counts
    print(f"storage race: {tries} swap attempts as uid {uid} while the cluster started, {swapped} succeeded")
    assert tries > 0 and swapped == 0
    assert "alice's area" in out and "admin-token" not in out, out
    assert area.is_dir() and not area.is_symlink()
    _deleted(alice, "race")


@pytest.mark.attack
def test_the_owners_area_is_writable_by_her_uid_and_survives_the_cluster(
    plane: tuple[ContainerPlane, str],
) -> None:
    server, image = plane
    carol = server.http(new_user(server, "carol"))
    assert carol.post("/storage", json={"name": "work"}).status_code == 201
    area = _area(server, "work")
    running_cluster(carol, "writer", framework="pytorch", image=image, mounts=["storage:work:/data"])
    out = _exec(carol, "writer", "id -u; echo step-100 > /data/checkpoint; ln -s / /data/escape")
    assert out.split()[0] == str(area.stat().st_uid)
    assert (area / "checkpoint").read_text() == "step-100\n"
    assert (area / "checkpoint").stat().st_uid == area.stat().st_uid  # written as her uid
    assert carol.delete("/storage/work").status_code == 409  # mounted: not deleted under the cluster
    _deleted(carol, "writer")
    assert (area / "checkpoint").read_text() == "step-100\n"  # the area outlives its cluster
    running_cluster(carol, "reader", framework="pytorch", image=image, mounts=["storage:work:/data"])
    assert _exec(carol, "reader", "cat /data/checkpoint") == "step-100\n"
    _deleted(carol, "reader")
    assert carol.delete("/storage/work").status_code == 204
    assert not area.exists() and carol.get("/storage").json() == []


@pytest.mark.attack("29.mount-race")
def test_a_link_swap_race_on_the_process_backend(server: Server) -> None:
    """The race of `test_a_link_swap_race_cannot_change_what_is_mounted` where there is no podman: the
    process backend's container links /data to the area, and the swapper (a tenant's uid) never
    redirects it."""
    _need_root()
    dave = server.http(new_user(server, "dave"))
    assert dave.post("/storage", json={"name": "dave-ckpt"}).status_code == 201
    area = _area(server, "dave-ckpt")
    (area / "marker").write_text("dave's area\n")
    with swapping(area, server.root / "data", TENANT_UID_BASE + 99) as counts:
        running_cluster(dave, "prace", mounts=["storage:dave-ckpt:/data"])
    tries, swapped = counts
    assert tries > 0 and swapped == 0
    link = server.root / "data" / "clusters" / "prace" / "prace-launcher" / "data"
    assert link.resolve() == area and (link / "marker").read_text() == "dave's area\n"
    _deleted(dave, "prace")
    assert (area / "marker").exists()


def test_an_admins_dataset_is_mounted_read_only_by_name(tmp_path: Path) -> None:
    mnist = tmp_path / "mnist"
    mnist.mkdir()
    with start_server(tmp_path / "server", ("--dataset", f"mnist={mnist}")) as running:
        erin = running.http(new_user(running, "erin"))
        body = {"name": "ds", "containers": 2, "mounts": ["dataset:mnist:/mnist"]}
        made = erin.post("/clusters", json=body)
        assert made.status_code == 201, made.text
        assert made.json()["mounts"] == ["dataset:mnist:/mnist"]  # its name, not the host path
        refused(erin.post("/clusters", json={**body, "name": "ds2", "mounts": ["dataset:nope:/x"]}), 404)
        _deleted(erin, "ds")


def test_the_cli_creates_lists_and_deletes_areas(server: Server) -> None:
    token = new_user(server, "frank")
    made = server.cli("storage", "create", "runs", token=token)
    assert made.returncode == 0 and "mount it with --mount storage:runs:/data" in made.stdout, made.stderr
    again = server.cli("storage", "create", "runs", token=token)
    assert again.returncode != 0 and again.stderr.count("\n") == 1 and "exists already" in again.stderr
    listed = server.cli("storage", "list", token=token)
    assert listed.returncode == 0 and "storage:runs:/data" in listed.stdout, listed.stderr
    host = server.cli("cluster", "create", "h", "--mount", "./x:/data", token=token)
    assert host.returncode != 0 and "storage:NAME:/data" in host.stderr, host.stderr
    gone = server.cli("storage", "delete", "runs", token=token)
    assert gone.returncode == 0 and "deleted" in gone.stdout, gone.stderr
    assert json.loads(server.cli("storage", "list", "-o", "json", token=token).stdout) == []
