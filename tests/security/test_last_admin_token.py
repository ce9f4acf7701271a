"""Issue 29 item 4: the last active admin token cannot be revoked.

The attack (or accident): the only admin revoked its own last token, and nobody could administer
the server any more. Revoking the last active token of any admin is now a one-line 409 saying to
create another first; with a second one, the first may go.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.security.harness import refused, start_server

pytestmark = pytest.mark.timeout(120)


@pytest.mark.attack("29.last-admin-token")
def test_the_last_admin_token_cannot_be_revoked(tmp_path: Path) -> None:
    with start_server(tmp_path) as server:
        with server.http() as admin:
            tokens = admin.get("/users/admin/tokens").json()
            assert [t["state"] for t in tokens] == ["active"], tokens
            first = tokens[0]["id"]
            refused(admin.delete(f"/users/admin/tokens/{first}"), 409, "last active admin token", "create")
            assert admin.get("/me").status_code == 200  # still the admin's
            created = admin.post("/users/admin/tokens", json={"name": "spare"})
            assert created.status_code == 201, created.text
            spare, spare_id = created.json()["token"], created.json()["id"]
            assert admin.delete(f"/users/admin/tokens/{first}").json()["state"] == "revoked"
        with server.http(token=spare) as admin:
            refused(admin.delete(f"/users/admin/tokens/{spare_id}"), 409, "last active admin token")
            assert admin.get("/me").json()["name"] == "admin"
