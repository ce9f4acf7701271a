"""Token lifecycle and quotas: the pure rules, then the service functions on a migrated SQLite database."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from elastrain.cli.user_cmd import _limit
from elastrain.db.models import ApiToken, Cluster, Framework, User
from elastrain.db.repository import create_user, token_row, user_by_token
from elastrain.db.session import Database
from elastrain.server import quotas, schemas, tokens, users
from elastrain.server.errors import Conflict, Forbidden, InvalidRequest, NotFound, Unauthorized

NOW = datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


# ----- expiry and token state ---------------------------------------------------------------------
def test_expiry_from_days_or_a_time_or_never() -> None:
    assert tokens.resolve_expiry(NOW) is None
    assert tokens.resolve_expiry(NOW, expires_in_days=7) == NOW + timedelta(days=7)
    later = datetime(2030, 1, 3, 5, 0, tzinfo=timezone(timedelta(hours=2)))
    when = tokens.resolve_expiry(NOW, expires_at=later)
    assert when == later and when is not None and when.utcoffset() == timedelta(0)


@pytest.mark.parametrize(
    ("days", "at", "words"),
    [
        (1, NOW + timedelta(days=1), "not both"),
        (None, NOW - timedelta(seconds=1), "in the past"),
        (None, NOW, "in the past"),
        (None, datetime(2030, 2, 1), "needs a timezone"),
        (None, NOW + timedelta(days=3651), "3650 days"),
        (0, None, "1..3650"),
        (3651, None, "1..3650"),
    ],
)
def test_bad_expiry_is_refused_with_one_line(days: int | None, at: datetime | None, words: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        tokens.resolve_expiry(NOW, expires_in_days=days, expires_at=at)
    assert words in str(err.value) and "\n" not in str(err.value)


def _row(**fields: object) -> ApiToken:
    return ApiToken(id=7, token_hash="x", name="t", **fields)


def test_token_state_and_the_refusal_message() -> None:
    assert tokens.token_state(_row(), NOW) == "active" and tokens.refusal(_row(), NOW) is None
    future = _row(expires_at=NOW + timedelta(seconds=1))
    assert tokens.token_state(future, NOW) == "active"
    expired = _row(expires_at=NOW.replace(tzinfo=None))  # SQLite gives naive UTC back
    assert tokens.token_state(expired, NOW) == "expired"
    message = tokens.refusal(expired, NOW)
    assert message is not None and "token 7 expired at 2030-01-02T03:04:05Z" in message
    assert "elastrain user token create" in message and "admin" in message
    revoked = _row(expires_at=NOW - timedelta(days=1), revoked_at=NOW - timedelta(hours=1))
    assert tokens.token_state(revoked, NOW) == "revoked"  # revocation wins over expiry
    assert "was revoked at 2030-01-02T02:04:05Z" in (tokens.refusal(revoked, NOW) or "")


def test_last_use_is_written_at_most_once_a_minute() -> None:
    assert tokens.needs_touch(None, NOW)
    assert not tokens.needs_touch(NOW - timedelta(seconds=59), NOW)
    assert tokens.needs_touch(NOW - timedelta(seconds=60), NOW)
    assert tokens.needs_touch(NOW + timedelta(hours=1), NOW)  # a clock that went back is corrected


# ----- token and user-name limits for a new token -------------------------------------------------
def test_a_users_new_token_never_outlives_the_calling_token() -> None:
    alice, admin = User(id=1, name="alice", is_admin=False), User(id=2, name="admin", is_admin=True)
    ends = NOW + timedelta(days=3)
    assert users.capped_expiry(alice, alice, None, False, ends) == ends  # inherits the caller's expiry
    assert users.capped_expiry(alice, alice, NOW + timedelta(days=1), True, ends) == NOW + timedelta(days=1)
    for wanted in (None, NOW + timedelta(days=4)):
        with pytest.raises(Forbidden, match="cannot outlive"):
            users.capped_expiry(alice, alice, wanted, True, ends)
    assert users.capped_expiry(alice, alice, None, True, None) is None  # a permanent caller: no cap
    assert users.capped_expiry(admin, alice, None, True, ends) is None  # admins are not capped


def test_token_names_are_labels() -> None:
    assert schemas.TokenCreate(name="ci-runner.2@host").name == "ci-runner.2@host"
    for bad in ("", "-x", "a b", "x" * 64, "tab\t"):
        with pytest.raises(ValueError):
            schemas.TokenCreate(name=bad)


# ----- quota rules --------------------------------------------------------------------------------
def test_an_elastic_cluster_counts_at_its_upper_bound() -> None:
    assert quotas.footprint(3, None, 2) == quotas.Usage(1, 3, 6)
    assert quotas.footprint(3, 8, 1) == quotas.Usage(1, 8, 8)


def test_refusal_names_the_limit_the_usage_and_who_can_raise_it() -> None:
    limits = quotas.Limits(clusters=5, containers=10, gpus=None)
    assert quotas.refusal("alice", limits, quotas.Usage(4, 8, 100), quotas.Usage(1, 2, 50)) is None
    message = quotas.refusal("alice", limits, quotas.Usage(4, 8, 0), quotas.Usage(1, 3, 0))
    assert message is not None and "\n" not in message
    assert "at most 10 containers" in message and "holds 8" in message and "needs 3 more" in message
    assert "admin" in message and "elastrain user quota alice --containers N" in message
    clusters = quotas.refusal("alice", limits, quotas.Usage(5, 0, 0), quotas.Usage(1, 2, 0))
    assert clusters is not None and "at most 5 clusters" in clusters


def test_shrinking_passes_even_above_a_lowered_limit() -> None:
    limits = quotas.Limits(clusters=1, containers=2, gpus=0)
    assert quotas.refusal("bob", limits, quotas.Usage(3, 9, 9), quotas.Usage(0, -2, -2)) is None


def test_own_limits_override_the_server_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    user = User(name="carol", quota_clusters=None, quota_containers=3, quota_gpus=None)
    assert quotas.effective(user) == quotas.Limits(20, 3, None)
    monkeypatch.setattr(quotas, "DEFAULT_MAX_GPUS", 16)
    assert quotas.effective(user) == quotas.Limits(20, 3, 16)
    user.quota_clusters = 0  # zero is a limit (no clusters), not "unset"
    assert quotas.effective(user).clusters == 0


def test_quota_flags_take_a_count_or_default() -> None:
    assert _limit("4") == 4 and _limit("0") == 0 and _limit("default") is None
    for bad in ("-1", "many", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            _limit(bad)


# ----- against a migrated SQLite database ---------------------------------------------------------
@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = Database(f"sqlite:///{tmp_path / 'db.sqlite'}")
    database.migrate()
    yield database
    database.dispose()


def _user(db: Database, name: str, admin: bool = False) -> tuple[User, str]:
    with db.session() as session:
        user, token = create_user(session, name, admin)
        session.expunge(user)
        return user, token


def test_authentication_refuses_revoked_and_expired_tokens(db: Database) -> None:
    _alice, token = _user(db, "alice")
    with db.session() as session:
        assert tokens.authenticate(session, "et_unknown") is None
        found = tokens.authenticate(session, token, NOW)
        assert found is not None and found.name == "alice"
    with db.session() as session:
        row = token_row(session, token)
        assert row is not None and tokens.aware(row.last_used_at) == NOW
        tokens.authenticate(session, token, NOW + timedelta(seconds=30))
        assert tokens.aware(row.last_used_at) == NOW  # not rewritten within the minute
        row.expires_at = datetime.now(timezone.utc) - timedelta(seconds=1)
    with db.session() as session:
        with pytest.raises(Unauthorized, match="expired"):
            tokens.authenticate(session, token)
        assert user_by_token(session, token) is None
        row = token_row(session, token)
        assert row is not None
        row.expires_at, row.revoked_at = None, datetime.now(timezone.utc)
    with db.session() as session:
        with pytest.raises(Unauthorized, match="revoked"):
            tokens.authenticate(session, token)
        assert user_by_token(session, token) is None


def test_tokens_of_other_users_are_invisible_to_non_admins(db: Database) -> None:
    alice, _ = _user(db, "alice")
    bob, _ = _user(db, "bob")
    admin, _ = _user(db, "root", admin=True)
    created = users.create_token(db, alice, "alice", schemas.TokenCreate(name="laptop"))
    assert created.token.startswith("et_") and created.state == "active"
    with pytest.raises(NotFound):
        users.list_tokens(db, bob, "alice")
    with pytest.raises(NotFound):
        users.revoke_token(db, bob, "alice", created.id)
    with pytest.raises(NotFound):
        users.revoke_token(db, bob, "bob", created.id)  # alice's id under bob's name
    with pytest.raises(NotFound):
        users.create_token(db, bob, "alice", schemas.TokenCreate())
    listed = users.list_tokens(db, admin, "alice")
    assert [t.name for t in listed] == ["initial", "laptop"]
    assert all(created.token not in t.model_dump_json() for t in listed)
    revoked = users.revoke_token(db, admin, "alice", created.id)
    assert revoked.state == "revoked" and revoked.revoked_at is not None
    again = users.revoke_token(db, alice, "alice", created.id)  # idempotent
    assert again.revoked_at == revoked.revoked_at


def test_a_refused_token_expiry_names_its_field_in_errors(db: Database) -> None:
    """The 422 of a token create lists the bad field (problem details' `errors`), as every 422 does."""
    alice, _ = _user(db, "alice")
    past = datetime.now(timezone.utc) - timedelta(days=1)
    for body, loc in (
        (schemas.TokenCreate(expires_at=past), "body.expires_at"),
        (schemas.TokenCreate(expires_in_days=1, expires_at=past), "body.expires_at"),
    ):
        with pytest.raises(InvalidRequest) as err:
            users.create_token(db, alice, "alice", body)
        assert [(e.loc, e.message) for e in err.value.errors] == [(loc, str(err.value))]


def test_active_tokens_are_capped(db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(users, "MAX_ACTIVE_TOKENS", 2)
    alice, _ = _user(db, "alice")
    second = users.create_token(db, alice, "alice", schemas.TokenCreate())
    with pytest.raises(Conflict, match="revoke some"):
        users.create_token(db, alice, "alice", schemas.TokenCreate())
    users.revoke_token(db, alice, "alice", second.id)
    users.create_token(db, alice, "alice", schemas.TokenCreate())  # a revoked one frees its place


def test_only_admins_set_quotas_and_null_means_the_default(db: Database) -> None:
    alice, _ = _user(db, "alice")
    admin, _ = _user(db, "root", admin=True)
    with pytest.raises(Forbidden, match="only an admin"):
        users.update_user(db, alice, "alice", schemas.UserPatch(quota=schemas.QuotaPatch(clusters=99)))
    patch = schemas.UserPatch.model_validate({"quota": {"clusters": 2, "gpus": 4}})
    shown = users.update_user(db, admin, "alice", patch)
    assert (shown.quota.clusters, shown.quota.containers, shown.quota.gpus) == (2, 64, 4)
    assert shown.quota_overrides.containers is None and not shown.quota_exempt
    reset = schemas.UserPatch.model_validate({"quota": {"gpus": None}})
    shown = users.update_user(db, admin, "alice", reset)
    assert shown.quota.clusters == 2 and shown.quota.gpus is None  # clusters untouched
    assert users.get_user(db, alice, "alice").quota.clusters == 2
    with pytest.raises(NotFound):
        users.get_user(db, alice, "root")


def _cluster(db: Database, owner: User, name: str, containers: int, gpus: int, high: int | None) -> None:
    with db.session() as session:
        row = Cluster(name=name, uid=f"u-{name}", owner_id=owner.id, framework=Framework.pytorch)
        row.desired_containers, row.gpus_per_container, row.max_containers = containers, gpus, high
        session.add(row)


def test_gpu_quota_on_create_and_scale(db: Database) -> None:
    alice, _ = _user(db, "alice")
    admin, _ = _user(db, "root", admin=True)
    users.update_user(db, admin, "alice", schemas.UserPatch.model_validate({"quota": {"gpus": 8}}))
    _cluster(db, alice, "a", 2, 2, None)  # 4 GPUs
    _cluster(db, alice, "b", 2, 1, 3)  # elastic to 3: 3 GPUs
    with db.session() as session:
        assert quotas.usage_of(session, alice.id) == quotas.Usage(2, 5, 7)
        quotas.check_create(session, alice, 2, None, 0)  # no GPUs: fits
        with pytest.raises(Forbidden, match="at most 8 gpus and holds 7, this request needs 2 more"):
            quotas.check_create(session, alice, 2, None, 1)
        quotas.check_create(session, admin, 2, None, 4)  # admins are exempt
        a = session.query(Cluster).filter_by(name="a").one()
        with pytest.raises(Forbidden, match="gpus"):
            quotas.check_scale(session, alice, a, 3)
        quotas.check_scale(session, admin, a, 3)  # an admin acting is exempt
        b = session.query(Cluster).filter_by(name="b").one()
        quotas.check_scale(session, alice, b, 3)  # within its elastic bound: counted already
    users.update_user(db, admin, "alice", schemas.UserPatch.model_validate({"quota": {"gpus": 1}}))
    with db.session() as session:
        a = session.query(Cluster).filter_by(name="a").one()
        quotas.check_scale(session, alice, a, 2)  # no growth
        quotas.check_scale(session, alice, a, 1)  # shrinking passes above a lowered limit
