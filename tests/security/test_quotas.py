"""Per-user quotas against a real `elastrain server` (process backend): an admin sets them, a user sees
their own with usage, and a create or scale past a limit is refused (403, one line naming the limit,
the usage and who can raise it) with nothing created or changed. Every cluster made here is deleted.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from elastrain.cli.main import main as cli
from tests.security.harness import new_user, refused
from tests.security.test_api_limits import Server, server  # noqa: F401 - the module's server fixture

pytestmark = pytest.mark.timeout(180)
CLUSTERS = ("qa-1", "qa-2")


def _reset(server: Server, clusters: int, containers: int) -> None:  # noqa: F811
    """Alice's quota to these limits (GPUs: the default) and both her clusters back to 2 containers."""
    with server.http() as admin:
        limits = {"clusters": clusters, "containers": containers, "gpus": None}
        assert admin.patch("/users/quota-alice", json={"quota": limits}).status_code == 200
        for name in CLUSTERS:
            assert admin.patch(f"/clusters/{name}", json={"containers": 2}).status_code == 200


@pytest.fixture(scope="module")
def alice(server: Server) -> Iterator[str]:  # noqa: F811
    """A user with two 2-container clusters and a quota of 2 clusters, 5 containers; her clusters are
    deleted (and waited for) at the end."""
    token = new_user(server, "quota-alice")
    with server.http() as admin:
        set_ = admin.patch("/users/quota-alice", json={"quota": {"clusters": 2, "containers": 5}})
        assert set_.status_code == 200, set_.text
    try:
        with server.http(token=token) as api:
            for name in CLUSTERS:  # up to the limit: allowed
                created = api.post("/clusters", json={"name": name, "containers": 2})
                assert created.status_code == 201, created.text
        yield token
    finally:
        with server.http(token=token) as api:
            names = [c["name"] for c in api.get("/clusters").json()]
            for name in names:
                api.delete(f"/clusters/{name}")
            deadline = time.monotonic() + 60
            while api.get("/clusters").json():
                assert time.monotonic() < deadline, f"clusters {names} were not deleted"
                time.sleep(0.2)


def test_a_user_sees_their_quota_and_usage(server: Server, alice: str) -> None:  # noqa: F811
    _reset(server, 2, 5)
    with server.http(token=alice) as api:
        shown = api.get("/users/quota-alice")
        assert shown.status_code == 200, shown.text
        body = shown.json()
        assert body["quota"] == {"clusters": 2, "containers": 5, "gpus": None}
        assert body["quota_overrides"] == {"clusters": 2, "containers": 5, "gpus": None}
        assert body["usage"] == {"clusters": 2, "containers": 4, "gpus": 0}
        assert body["quota_exempt"] is False and body["created_at"].endswith("Z")
        refused(api.get("/users/admin"), 404, "not found")
    with server.http() as admin:
        shown = admin.get("/users/admin").json()
    assert shown["quota_exempt"] is True and shown["quota"]["clusters"] == 20  # the server default


@pytest.mark.attack
def test_creating_past_the_cluster_quota_creates_nothing(server: Server, alice: str) -> None:  # noqa: F811
    _reset(server, 2, 5)
    with server.http(token=alice) as api:
        created = api.post("/clusters", json={"name": "qa-3", "containers": 2})
        refused(created, 403, "at most 2 clusters", "holds 2", "admin", "elastrain user quota quota-alice")
        refused(api.get("/clusters/qa-3"), 404)
        assert sorted(c["name"] for c in api.get("/clusters").json()) == list(CLUSTERS)


@pytest.mark.attack
def test_scaling_past_the_container_quota_changes_nothing(server: Server, alice: str) -> None:  # noqa: F811
    _reset(server, 2, 5)
    with server.http(token=alice) as api:
        grown = api.patch("/clusters/qa-1", json={"containers": 3})  # 3 + 2 = 5: exactly the limit
        assert grown.status_code == 200, grown.text
        scaled = api.patch("/clusters/qa-2", json={"containers": 3})
        refused(scaled, 403, "at most 5 containers", "holds 5", "needs 1 more", "--containers N")
        assert api.get("/clusters/qa-2").json()["desired_containers"] == 2
        events = api.get("/clusters/qa-2/events").json()
        assert not [e for e in events if e["action"] == "cluster.scaled" and e["detail"]["after"] == 3]
    with server.http() as admin:  # the admin lowers the limit: shrinking still passes
        admin.patch("/users/quota-alice", json={"quota": {"containers": 2}})
    with server.http(token=alice) as api:
        assert api.patch("/clusters/qa-1", json={"containers": 2}).status_code == 200
        refused(api.patch("/clusters/qa-1", json={"containers": 3}), 403, "at most 2 containers")


@pytest.mark.attack
def test_an_elastic_cluster_counts_at_its_upper_bound(server: Server, alice: str) -> None:  # noqa: F811
    _reset(server, 5, 6)
    with server.http(token=alice) as api:
        body = {"name": "qa-elastic", "containers": 2, "min_containers": 2, "max_containers": 4}
        refused(api.post("/clusters", json=body), 403, "at most 6 containers", "holds 4", "needs 4 more")
        refused(api.get("/clusters/qa-elastic"), 404)


@pytest.mark.attack
def test_only_admins_change_quotas(server: Server, alice: str) -> None:  # noqa: F811
    other = new_user(server, "quota-bob")
    with server.http(token=alice) as api:
        refused(api.patch("/users/quota-alice", json={"quota": {"clusters": 99}}), 403, "only an admin")
        refused(api.patch("/users/quota-bob", json={"quota": {"clusters": 0}}), 404)
    with server.http(token=other) as api:
        assert api.get("/users/quota-bob").json()["quota"]["clusters"] == 20
        refused(api.get("/users/quota-alice"), 404)


@pytest.mark.parametrize(
    "body", [{"quota": {"clusters": -1}}, {"quota": {"cpus": 1}}, {}, {"quota": {"gpus": "many"}}]
)
def test_bad_quota_requests_get_one_line(server: Server, body: dict) -> None:  # noqa: F811
    with server.http() as admin:
        refused(admin.patch("/users/admin", json=body), 422, "quota")
        refused(admin.patch("/users/nobody-here", json={"quota": {}}), 404, "not found")


def test_cli_shows_and_sets_quotas(
    server: Server,  # noqa: F811
    alice: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ELASTRAIN_URL", server.url)
    monkeypatch.setenv("ELASTRAIN_TOKEN", server.token)
    assert (
        cli(["user", "quota", "quota-alice", "--clusters", "7", "--gpus", "3", "--containers", "default"])
        == 0
    )
    table = capsys.readouterr().out
    assert "user quota-alice" in table
    rows = {line.split()[0]: line.split()[1:] for line in table.splitlines()[2:]}
    assert rows["clusters"][1:] == ["7", "set", "for", "the", "user"]
    assert rows["containers"][1:] == ["64", "server", "default"] and rows["gpus"][1] == "3"
    monkeypatch.setenv("ELASTRAIN_TOKEN", alice)
    assert cli(["user", "quota", "quota-alice"]) == 0
    assert "clusters" in capsys.readouterr().out
    assert cli(["user", "quota", "quota-alice", "--clusters", "100"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "only an admin" in err
    with pytest.raises(SystemExit) as exited:  # argparse: usage and one error line, exit 2
        cli(["user", "quota", "quota-alice", "--gpus", "-3"])
    assert exited.value.code == 2 and "negative" in capsys.readouterr().err
