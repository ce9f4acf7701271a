"""What the ``/users/{name}`` routes do: a user's quota and usage, and their API tokens (create, list,
revoke). A user manages their own tokens, an admin anyone's; only admins set quotas. Other users are
invisible to a non-admin (404, the same answer as for a user that does not exist).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from elastrain.db.models import ApiToken, EventAction, User, utcnow
from elastrain.db.repository import add_event, issue_token, token_row, user_by_name
from elastrain.db.session import Database
from elastrain.server import quotas, schemas
from elastrain.server.errors import Conflict, Forbidden, NotFound
from elastrain.server.tokens import (
    MAX_ACTIVE_TOKENS,
    aware,
    checked_expiry,
    iso,
    token_out,
    token_state,
)


def _target(session: Session, actor: User, name: str) -> User:
    """The user `name` if `actor` may manage them (themself, or anyone for an admin); 404 otherwise."""
    if name != actor.name and not actor.is_admin:
        raise NotFound(f"user {name!r} not found; you can manage only your own user ({actor.name})")
    target = user_by_name(session, name)
    if target is None:
        raise NotFound(f"user {name!r} not found")
    return target


def _active_tokens(session: Session, user: User, now: datetime) -> int:
    query = select(func.count()).select_from(ApiToken)
    query = query.where(ApiToken.user_id == user.id, ApiToken.revoked_at.is_(None))
    return int(
        session.scalar(query.where(or_(ApiToken.expires_at.is_(None), ApiToken.expires_at > now))) or 0
    )


def capped_expiry(
    actor: User, target: User, wanted: datetime | None, explicit: bool, caller_expires: datetime | None
) -> datetime | None:
    """A non-admin's new token never outlives the token that creates it (a stolen short-lived token
    cannot mint a permanent one): without an explicit expiry it inherits the caller's; asking for a
    later one is refused (403). Admins, and callers whose token never expires, are not capped."""
    if actor.is_admin or caller_expires is None or actor.id != target.id:
        return wanted
    if not explicit:
        return caller_expires
    if wanted is None or wanted > caller_expires:
        raise Forbidden(
            f"a new token cannot outlive the token creating it (yours expires at {iso(caller_expires)}); "
            "ask for an earlier expiry, or ask an admin (elastrain user token create "
            f"--expires-in-days D {actor.name})"
        )
    return wanted


def create_token(
    db: Database, actor: User, name: str, req: schemas.TokenCreate, caller_token: str = ""
) -> schemas.TokenCreated:
    """Issue a token for user `name`; the answer holds the token (shown this once)."""
    now = utcnow()
    wanted = checked_expiry(now, req.expires_in_days, req.expires_at)
    explicit = req.expires_in_days is not None or req.expires_at is not None
    with db.session() as session:
        target = _target(session, actor, name)
        caller = token_row(session, caller_token) if caller_token else None
        caller_expires = aware(caller.expires_at) if caller is not None else None
        expires = capped_expiry(actor, target, wanted, explicit, caller_expires)
        if _active_tokens(session, target, now) >= MAX_ACTIVE_TOKENS:
            raise Conflict(
                f"user {name} holds {MAX_ACTIVE_TOKENS} active tokens, the most allowed; revoke some "
                f"(elastrain user token list {name}; elastrain user token revoke ID {name})"
            )
        token = issue_token(session, target, name=req.name, expires_at=expires)
        session.flush()
        row = token_row(session, token)
        assert row is not None
        add_event(
            session,
            actor.name,
            EventAction.token_created,
            owner_id=target.id,
            user=name,
            token_id=row.id,
            name=req.name,
            expires_at=iso(expires),
        )
        out = token_out(row, now)
        return schemas.TokenCreated(**out.model_dump(), user=name, token=token)


def list_tokens(db: Database, actor: User, name: str) -> list[schemas.TokenOut]:
    """User `name`'s tokens, oldest first: metadata only, never a token or its hash."""
    now = utcnow()
    with db.session() as session:
        target = _target(session, actor, name)
        rows = session.scalars(select(ApiToken).where(ApiToken.user_id == target.id).order_by(ApiToken.id))
        return [token_out(row, now) for row in rows]


def _active_admin_tokens(session: Session, now: datetime) -> int:
    query = select(func.count()).select_from(ApiToken).join(User, User.id == ApiToken.user_id)
    query = query.where(User.is_admin.is_(True), ApiToken.revoked_at.is_(None))
    return int(
        session.scalar(query.where(or_(ApiToken.expires_at.is_(None), ApiToken.expires_at > now))) or 0
    )


def revoke_token(db: Database, actor: User, name: str, token_id: int) -> schemas.TokenOut:
    """Revoke token `token_id` of user `name` (at once: the next request with it gets 401); idempotent.
    The last active token of any admin is refused (409): nobody could administer the server after it."""
    now = utcnow()
    with db.session() as session:
        target = _target(session, actor, name)
        row = session.get(ApiToken, token_id)
        if row is None or row.user_id != target.id:
            raise NotFound(f"token {token_id} not found for user {name} (elastrain user token list {name})")
        if target.is_admin and token_state(row, now) == "active" and _active_admin_tokens(session, now) <= 1:
            raise Conflict(
                f"token {token_id} is the last active admin token: revoking it would leave nobody able to "
                f"administer this server; create another first (elastrain user token create {name}), "
                "then revoke this one"
            )
        if row.revoked_at is None:
            row.revoked_at = now
            add_event(
                session,
                actor.name,
                EventAction.token_revoked,
                owner_id=target.id,
                user=name,
                token_id=token_id,
            )
        return token_out(row, now)


def user_detail(session: Session, user: User, defaults: quotas.Limits | None = None) -> schemas.UserDetailOut:
    """The API view of a user: effective quota (their own, else `defaults`), overrides and usage."""
    limits, own = quotas.effective(user, defaults), quotas.overrides(user)
    used = quotas.usage_of(session, user.id)
    return schemas.UserDetailOut(
        name=user.name,
        admin=user.is_admin,
        created_at=aware(user.created_at) or utcnow(),
        quota=schemas.QuotaOut(clusters=limits.clusters, containers=limits.containers, gpus=limits.gpus),
        quota_overrides=schemas.QuotaOut(clusters=own.clusters, containers=own.containers, gpus=own.gpus),
        quota_exempt=user.is_admin,
        usage=schemas.UsageOut(clusters=used.clusters, containers=used.containers, gpus=used.gpus),
    )


def get_user(
    db: Database, actor: User, name: str, defaults: quotas.Limits | None = None
) -> schemas.UserDetailOut:
    """User `name` with quota and usage (yourself, or anyone for an admin); `defaults`: the server's
    per-user limits."""
    with db.session() as session:
        return user_detail(session, _target(session, actor, name), defaults)


def update_user(
    db: Database, actor: User, name: str, req: schemas.UserPatch, defaults: quotas.Limits | None = None
) -> schemas.UserDetailOut:
    """Set user `name`'s quota (admins only): the fields sent change, null means the server default."""
    with db.session() as session:
        target = _target(session, actor, name)
        if not actor.is_admin:
            raise Forbidden(f"only an admin can change quotas; ask one (elastrain user quota {name} ...)")
        changed = {kind: getattr(req.quota, kind) for kind in req.quota.model_fields_set}
        for kind, value in changed.items():
            setattr(target, f"quota_{kind}", value)
        if changed:
            add_event(
                session, actor.name, EventAction.user_quota_changed, owner_id=target.id, user=name, **changed
            )
        session.flush()
        return user_detail(session, target, defaults)
