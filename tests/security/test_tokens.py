"""API-token expiry and revocation against a real `elastrain server` (process backend).

A revoked or expired token authenticates nobody (401 saying why and how to get a new one), tokens are
listed without the token or its hash, other users' tokens are invisible, a short-lived token cannot
mint a permanent one, and bad input is a one-line 4xx. The CLI (`elastrain user token ...`) runs
in-process against the same server.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pytest

from elastrain.cli.main import main as cli
from tests.security.harness import new_user, refused
from tests.security.test_api_limits import Server, server  # noqa: F401 - the module's server fixture

pytestmark = pytest.mark.timeout(120)


def _stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def test_tokens_are_created_listed_and_used(server: Server) -> None:  # noqa: F811
    alice = new_user(server, "tok-alice")
    with server.http(token=alice) as api:
        created = api.post("/users/tok-alice/tokens", json={"name": "laptop", "expires_in_days": 30})
        assert created.status_code == 201, created.text
        body = created.json()
        token = body["token"]
        assert token.startswith("et_") and body["name"] == "laptop" and body["state"] == "active"
        expires = datetime.fromisoformat(body["expires_at"])
        assert body["expires_at"].endswith("Z") and expires.tzinfo is not None
        assert abs(expires - datetime.now(timezone.utc) - timedelta(days=30)) < timedelta(minutes=1)
    with server.http(token=token) as laptop:
        assert laptop.get("/me").json()["name"] == "tok-alice"
        listed = laptop.get("/users/tok-alice/tokens")
    assert listed.status_code == 200, listed.text
    rows = listed.json()
    assert [r["name"] for r in rows] == ["initial", "laptop"]
    assert token not in listed.text and alice not in listed.text and "hash" not in listed.text
    assert set(rows[1]) == {"id", "name", "state", "created_at", "expires_at", "revoked_at", "last_used_at"}
    assert rows[1]["last_used_at"] is not None and rows[0]["expires_at"] is None


def test_first_token_of_a_new_user_can_expire(server: Server) -> None:  # noqa: F811
    with server.http() as admin:
        created = admin.post("/users", json={"name": "tok-temp", "token_expires_in_days": 2})
        assert created.status_code == 201, created.text
        assert created.json()["token_expires_at"].endswith("Z")
        (row,) = admin.get("/users/tok-temp/tokens").json()
    assert datetime.fromisoformat(row["expires_at"]) > datetime.now(timezone.utc) + timedelta(days=1)


@pytest.mark.attack
def test_a_revoked_token_authenticates_nobody(server: Server) -> None:  # noqa: F811
    alice = new_user(server, "tok-bob")
    with server.http(token=alice) as api:
        stolen = api.post("/users/tok-bob/tokens", json={"name": "leaked"}).json()
        revoked = api.delete(f"/users/tok-bob/tokens/{stolen['id']}")
        assert revoked.status_code == 200 and revoked.json()["state"] == "revoked", revoked.text
        again = api.delete(f"/users/tok-bob/tokens/{stolen['id']}")  # idempotent
        assert again.json()["revoked_at"] == revoked.json()["revoked_at"]
    with server.http(token=stolen["token"]) as attacker:
        refused(attacker.get("/me"), 401, "revoked", "elastrain user token create")
        refused(attacker.get("/clusters"), 401, "revoked")
        refused(attacker.post("/users/tok-bob/tokens", json={"name": "persist"}), 401)  # no new token
        refused(attacker.post("/clusters", json={"name": "x"}), 401)
        refused(attacker.delete("/users/tok-bob/tokens/1"), 401, "revoked")
    with server.http(token=alice) as api:
        assert api.get("/me").status_code == 200  # the user's other token still works
        names = [t["name"] for t in api.get("/users/tok-bob/tokens").json()]
    assert names == ["initial", "leaked"]  # the attacker made no token


@pytest.mark.attack
def test_an_expired_token_authenticates_nobody(server: Server) -> None:  # noqa: F811
    new_user(server, "tok-carol")
    soon = datetime.now(timezone.utc) + timedelta(seconds=2)
    with server.http() as admin:
        created = admin.post("/users/tok-carol/tokens", json={"name": "short", "expires_at": _stamp(soon)})
    assert created.status_code == 201, created.text
    token = created.json()["token"]
    with server.http(token=token) as api:
        assert api.get("/me").status_code == 200
        time.sleep(max(0.0, (soon - datetime.now(timezone.utc)).total_seconds()) + 0.3)
        message = refused(api.get("/me"), 401, "expired", "elastrain user token create", "admin")
        assert created.json()["expires_at"][:19] in message
        refused(api.post("/users/tok-carol/tokens", json={"name": "renew"}), 401)
        refused(api.get("/users/tok-carol/tokens"), 401, "expired")


@pytest.mark.attack
def test_other_users_tokens_are_invisible(server: Server) -> None:  # noqa: F811
    victim = new_user(server, "tok-dave")
    mallory = new_user(server, "tok-mallory")
    with server.http(token=victim) as api:
        victim_id = api.get("/users/tok-dave/tokens").json()[0]["id"]
    with server.http(token=mallory) as attacker:
        refused(attacker.get("/users/tok-dave/tokens"), 404, "not found")
        refused(attacker.delete(f"/users/tok-dave/tokens/{victim_id}"), 404)
        refused(attacker.delete(f"/users/tok-mallory/tokens/{victim_id}"), 404, "not found")
        refused(attacker.post("/users/tok-dave/tokens", json={"name": "mine"}), 404)
        refused(attacker.get("/users/admin/tokens"), 404)
        refused(attacker.get("/users/no-such-user/tokens"), 404)  # the same answer: nothing leaks
        refused(attacker.post("/users", json={"name": "tok-eve"}), 403, "admin")
    with server.http(token=victim) as api:
        assert api.get("/me").status_code == 200
        assert api.get("/users/tok-dave/tokens").json()[0]["revoked_at"] is None
    with server.http() as admin:  # an admin manages anyone's tokens
        assert admin.get("/users/tok-dave/tokens").status_code == 200
        assert admin.delete(f"/users/tok-dave/tokens/{victim_id}").json()["state"] == "revoked"
    with server.http(token=victim) as api:
        refused(api.get("/me"), 401, "revoked")


@pytest.mark.attack
def test_a_short_lived_token_cannot_mint_a_permanent_one(server: Server) -> None:  # noqa: F811
    short = new_user(server, "tok-frank", token_expires_in_days=1)
    with server.http(token=short) as api:
        refused(api.post("/users/tok-frank/tokens", json={"name": "forever", "expires_in_days": 30}), 403)
        inherited = api.post("/users/tok-frank/tokens", json={"name": "same"})
        assert inherited.status_code == 201, inherited.text
        first = api.get("/users/tok-frank/tokens").json()[0]
    assert inherited.json()["expires_at"] == first["expires_at"]


@pytest.mark.parametrize(
    ("path", "body", "words"),
    [
        ("/users/admin/tokens", {"expires_in_days": 1, "expires_at": "2099-01-01T00:00:00Z"}, "not both"),
        ("/users/admin/tokens", {"expires_at": "2000-01-01T00:00:00Z"}, "in the past"),
        ("/users/admin/tokens", {"expires_at": "2030-01-01T00:00:00"}, "timezone"),
        ("/users/admin/tokens", {"expires_in_days": 0}, "expires_in_days"),
        ("/users/admin/tokens", {"name": "two words"}, "name"),
        ("/users/admin/tokens", {"token": "et_chosen"}, "token"),
        ("/users", {"name": "tok-bad", "token_expires_in_days": -1}, "token_expires_in_days"),
    ],
)
def test_bad_token_requests_get_one_line(server: Server, path: str, body: dict, words: str) -> None:  # noqa: F811
    with server.http() as admin:
        refused(admin.post(path, json=body), 422, words)


@pytest.mark.parametrize("token_id", ["0", "abc", "99999999999999999999", "-1"])
def test_bad_token_ids_get_one_line(server: Server, token_id: str) -> None:  # noqa: F811
    with server.http() as admin:
        refused(admin.delete(f"/users/admin/tokens/{token_id}"), 422, "token_id")


def test_cli_creates_lists_and_revokes_tokens(
    server: Server,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gina = new_user(server, "tok-gina")
    monkeypatch.setenv("ELASTRAIN_URL", server.url)
    monkeypatch.setenv("ELASTRAIN_TOKEN", gina)
    assert cli(["user", "token", "create", "--name", "ci", "--expires-in-days", "7"]) == 0
    out = capsys.readouterr()
    token = out.out.strip()
    assert token.startswith("et_") and "shown once" in out.err and "tok-gina" in out.err
    assert cli(["user", "token", "list"]) == 0
    table = capsys.readouterr().out
    assert "ci" in table and "active" in table and token not in table
    token_id = next(line.split()[0] for line in table.splitlines() if " ci " in line)
    assert cli(["user", "token", "revoke", token_id]) == 0
    assert "revoked" in capsys.readouterr().out
    monkeypatch.setenv("ELASTRAIN_TOKEN", token)
    assert cli(["user", "whoami"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "revoked" in err
    monkeypatch.setenv("ELASTRAIN_TOKEN", gina)
    assert cli(["user", "token", "revoke", "424242"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not found" in err
    assert cli(["user", "token", "list", "admin"]) == 2  # another user's: not for a non-admin
    assert "not found" in capsys.readouterr().err
