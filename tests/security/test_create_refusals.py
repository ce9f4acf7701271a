"""Issue 29 item 4: what a create refuses, and what its refusal does not tell.

* ``cpus`` below podman's smallest limit (0.01) was accepted, then ``podman run`` failed several
  times a second and the cluster never started: now a one-line 422 naming the bound.
* "name is taken" told a tenant that another tenant has a cluster of that name. Names are unique on
  the server (not per tenant), so a tenant still learns that a name is unavailable, but the refusal
  for another tenant's name is word for word the one for a reserved name.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.security.harness import new_user, refused, start_server

pytestmark = pytest.mark.timeout(120)


@pytest.mark.attack("29.tiny-cpus", "29.name-taken")
def test_create_refuses_cpus_below_the_runtime_minimum_and_hides_whose_name_is_taken(tmp_path: Path) -> None:
    with start_server(tmp_path) as server:
        alice, bob = new_user(server, "cr-alice"), new_user(server, "cr-bob")
        with server.http(token=bob) as api:
            message = refused(api.post("/clusters", json={"name": "tiny", "cpus": 0.0001}), 422, "0.01")
            assert "cpus" in message
            assert api.get("/clusters").json() == []
        with server.http(token=alice) as api:
            assert api.post("/clusters", json={"name": "secret-project"}).status_code == 201
            mine = refused(api.post("/clusters", json={"name": "secret-project"}), 409, "you already have")
            assert "secret-project" in mine
        with server.http(token=bob) as api:
            theirs = refused(api.post("/clusters", json={"name": "secret-project"}), 409, "not available")
            reserved = refused(api.post("/clusters", json={"name": "new"}), 409, "not available")
            assert theirs.replace("secret-project", "X") == reserved.replace("new", "X")
            assert "cr-alice" not in theirs and "taken" not in theirs
            assert api.post("/clusters", json={"name": "bobs", "cpus": 0.01}).status_code == 201
            api.delete("/clusters/bobs")
        with server.http(token=alice) as api:
            api.delete("/clusters/secret-project")
