"""Audit events are keyed by cluster uid and owner, not by name (issue 14, item 4).

Alice creates `tr`, runs a command holding a secret, deletes `tr`; Bob creates his own `tr`: his
events (cluster and job trails) hold nothing of Alice's. Real server on the process backend.
"""

from __future__ import annotations

import time

import httpx
import pytest

from tests.security.test_api_limits import Server, server  # noqa: F401 - the module's server fixture

pytestmark = pytest.mark.timeout(120)
SECRET = "sk-alice-0123456789abcdef"


def _user(api: httpx.Client, name: str) -> str:
    created = api.post("/users", json={"name": name})
    assert created.status_code == 201, created.text
    return str(created.json()["token"])


def _running(api: httpx.Client, name: str) -> None:
    created = api.post("/clusters", json={"name": name, "containers": 2, "gpus_per_container": 0})
    assert created.status_code == 201, created.text
    deadline = time.monotonic() + 60
    while api.get(f"/clusters/{name}").json()["state"] != "Running":
        assert time.monotonic() < deadline, api.get(f"/clusters/{name}").text
        time.sleep(0.2)


@pytest.mark.attack
def test_a_reused_cluster_name_sees_none_of_the_old_events(server: Server) -> None:  # noqa: F811
    with server.http() as admin:
        alice, bob = _user(admin, "audit-alice"), _user(admin, "audit-bob")
    with server.http(token=alice) as as_alice:
        _running(as_alice, "tr")
        done = as_alice.post("/clusters/tr/exec", json={"command": ["echo", f"API_KEY={SECRET}"]})
        assert done.status_code == 200, done.text
        job = as_alice.post("/clusters/tr/jobs", json={"command": ["echo", SECRET]})
        assert job.status_code == 201, job.text
        assert SECRET in as_alice.get("/clusters/tr/events").text  # the owner sees her own trail
        assert as_alice.delete("/clusters/tr").status_code in (200, 202)
        deadline = time.monotonic() + 60
        while as_alice.get("/clusters/tr").status_code != 404:
            assert time.monotonic() < deadline, "tr was not deleted"
            time.sleep(0.2)
    with server.http(token=bob) as as_bob:
        _running(as_bob, "tr")
        events = as_bob.get("/clusters/tr/events")
        assert events.status_code == 200, events.text
        assert SECRET not in events.text
        assert all(e["actor"] != "audit-alice" for e in events.json())
        assert any(e["action"] == "cluster.created" and e["actor"] == "audit-bob" for e in events.json())
        bob_job = as_bob.post("/clusters/tr/jobs", json={"command": ["true"]})
        assert bob_job.status_code == 201, bob_job.text
        trail = as_bob.get(f"/jobs/{bob_job.json()['id']}/events")
        assert trail.status_code == 200 and SECRET not in trail.text
        as_bob.delete("/clusters/tr")
