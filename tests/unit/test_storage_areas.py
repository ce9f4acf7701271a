"""Storage areas (``/api/v1/storage``, ``storage:NAME:/data``): owner-scoped, counted, server-owned above
the area, and the only mounts a non-admin may ask for (host paths: admins only)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from elastrain.backends.api import Mount
from elastrain.db.models import User
from elastrain.server.errors import Conflict, Forbidden
from elastrain.server.mount_sources import (
    MountSources,
    check_stored_mounts,
    parse_datasets,
    shown_mount,
    stored_mounts,
)
from elastrain.server.storage import StorageAreas, verify_area_path
from elastrain.testing.app import AppUnderTest, make_app

Api = tuple[TestClient, dict[str, str], AppUnderTest]


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    under_test = make_app(tmp_path)
    with TestClient(under_test.app) as client:
        yield client, {"Authorization": f"Bearer {under_test.token}"}, under_test


def _user(api: Api, name: str) -> dict[str, str]:
    client, admin, _ = api
    made = client.post("/api/v1/users", json={"name": name}, headers=admin)
    assert made.status_code == 201, made.text
    return {"Authorization": f"Bearer {made.json()['token']}"}


def _cluster(client: TestClient, auth: dict[str, str], name: str, *mounts: str) -> tuple[int, dict]:
    made = client.post(
        "/api/v1/clusters", json={"name": name, "containers": 2, "mounts": list(mounts)}, headers=auth
    )
    return made.status_code, made.json()


def test_areas_are_per_user_and_a_cluster_mounts_only_its_owners(api: Api) -> None:
    client, _admin, _ = api
    alice, bob = _user(api, "alice"), _user(api, "bob")
    made = client.post("/api/v1/storage", json={"name": "ckpt"}, headers=alice)
    assert made.status_code == 201, made.text
    assert made.headers["Location"] == "/api/v1/storage/ckpt"
    assert made.json() == {"name": "ckpt", "mount": "storage:ckpt:/data", "mounted_by": []}
    assert client.post("/api/v1/storage", json={"name": "ckpt"}, headers=alice).status_code == 409
    assert [a["name"] for a in client.get("/api/v1/storage", headers=alice).json()] == ["ckpt"]
    assert client.get("/api/v1/storage", headers=bob).json() == []
    assert client.get("/api/v1/storage/ckpt", headers=bob).status_code == 404
    assert client.delete("/api/v1/storage/ckpt", headers=bob).status_code == 404
    code, body = _cluster(client, bob, "steal", "storage:ckpt:/data")  # alice's name: unknown to bob
    assert code == 404 and "storage area 'ckpt' not found" in body["detail"], body
    code, body = _cluster(client, alice, "mine", "storage:ckpt:/data")
    assert code == 201, body
    assert body["mounts"] == ["storage:ckpt:/data"]  # the name, never the server's path
    assert client.get("/api/v1/storage/ckpt", headers=alice).json()["mounted_by"] == ["mine"]
    gone = client.delete("/api/v1/storage/ckpt", headers=alice)
    assert gone.status_code == 409 and "mounted by cluster(s) mine" in gone.json()["detail"]
    assert client.post("/api/v1/storage", json={"name": "ckpt"}, headers=bob).status_code == 201  # his own


def test_a_host_path_is_for_admins_only(api: Api, tmp_path: Path) -> None:
    client, admin, _ = api
    bob = _user(api, "bob")
    source = tmp_path / "datasets"
    source.mkdir()
    code, body = _cluster(client, bob, "host", f"{source}:/data")
    assert code == 403 and "storage:NAME:/data" in body["detail"] and "\n" not in body["detail"]
    code, body = _cluster(client, admin, "host", f"{source}:/data")
    assert code == 201 and body["mounts"] == [f"{source.resolve()}:/data"], body


def test_bad_names_unknown_datasets_and_the_count(tmp_path: Path) -> None:
    under_test = make_app(tmp_path)
    with TestClient(under_test.app) as client:
        bob = _user((client, {"Authorization": f"Bearer {under_test.token}"}, under_test), "bob")
        assert client.post("/api/v1/storage", json={"name": "../x"}, headers=bob).status_code == 422
        code, body = _cluster(client, bob, "c", "storage:Bad_Name:/data")
        assert code == 422, body
        code, body = _cluster(client, bob, "c", "dataset:mnist:/data")
        assert code == 404 and "dataset 'mnist' not found" in body["detail"], body
    areas = StorageAreas(tmp_path / "counted", max_per_user=2)
    areas.create(7, "a", None)
    areas.create(7, "b", None)
    with pytest.raises(Forbidden, match="2 storage areas, the most allowed"):
        areas.create(7, "c", None)
    areas.create(8, "c", None)  # another user's count
    areas.delete(7, "a")
    assert [a.name for a in areas.areas(7)] == ["b"]
    with pytest.raises(Conflict):
        areas.create(7, "b", None)


def test_an_area_is_mounted_only_while_no_link_or_other_user_can_redirect_it(tmp_path: Path) -> None:
    areas = StorageAreas(tmp_path / "storage")
    areas.prepare()
    area = areas.create(1, "data", None).path
    assert oct(area.stat().st_mode & 0o777) == "0o700"
    assert verify_area_path(area, None) == str(area)
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    os.rename(area, tmp_path / "moved")
    area.symlink_to(decoy)  # what a swap would leave behind: refused, never followed
    with pytest.raises(Forbidden, match="not a plain directory"):
        verify_area_path(area, None)
    area.unlink()
    os.rename(tmp_path / "moved", area)
    os.chmod(area.parent, 0o777)  # a parent others may write to: they could swap the area
    with pytest.raises(Forbidden, match="could be replaced by another user"):
        verify_area_path(area, None)
    os.chmod(area.parent, 0o700)
    outer = tmp_path / "outer"
    outer.mkdir()
    (outer / "storage").symlink_to(tmp_path / "storage")  # a link above the area
    with pytest.raises(Forbidden, match="not a plain directory"):
        verify_area_path(outer / "storage" / "u1" / "data", None)


def test_datasets_are_declared_by_the_admin_and_mounted_read_only(tmp_path: Path) -> None:
    mnist = tmp_path / "mnist"
    mnist.mkdir()
    assert parse_datasets([f"mnist={mnist}"]) == {"mnist": mnist.resolve()}
    for bad, why in (
        ("mnist", "not NAME=HOSTPATH"),
        ("Bad=/x", "not a DNS label"),
        ("m=/nope", "not a directory"),
    ):
        with pytest.raises(ValueError, match=why):
            parse_datasets([bad])
    sources = MountSources(None, {"mnist": mnist.resolve()})
    tenant = User(id=5, name="t", is_admin=False)
    mount = sources.resolve(tenant, "dataset:mnist:/mnist")
    assert mount == Mount(str(mnist.resolve()), "/mnist", read_only=True)
    record = sources.record("dataset:mnist:/mnist", mount)
    assert shown_mount(record) == "dataset:mnist:/mnist" and stored_mounts(json.dumps([record])) == [mount]
    with pytest.raises(Conflict, match="keeps no storage areas"):
        sources.resolve(tenant, "storage:x:/data")


def test_a_tenants_host_path_recorded_before_storage_areas_is_refused_at_start(tmp_path: Path) -> None:
    old = json.dumps([{"source": str(tmp_path), "target": "/data"}])  # a row from before issue 29
    with pytest.raises(Forbidden, match="admins only"):
        check_stored_mounts(old, 20005, owner_is_admin=False)
    check_stored_mounts(old, 20001, owner_is_admin=True)  # an admin's host path still starts
