"""API-token lifecycle: expiry from a request, a token's state, and authentication that refuses expired
and revoked tokens with a message saying why, recording a token's last use at most once a minute."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from sqlalchemy.orm import Session

from elastrain.db.models import ApiToken, User, utcnow
from elastrain.db.repository import token_row
from elastrain.server import schemas
from elastrain.server.errors import InvalidRequest, Unauthorized, checked
from elastrain.server.schemas import MAX_TOKEN_DAYS

MAX_ACTIVE_TOKENS = 100
"""The most active (unexpired, unrevoked) tokens a user may hold; revoke some to create more."""
LAST_USED_RESOLUTION = timedelta(minutes=1)
"""A token's ``last_used_at`` is written at most this often (authentication stays read-mostly)."""
NEW_TOKEN_HINT = (
    "create a new one with `elastrain user token create` using another valid token, or ask an admin "
    "(elastrain user token create USER)"
)


def aware(value: datetime | None) -> datetime | None:
    """`value` as timezone-aware UTC (SQLite returns naive datetimes, which are UTC)."""
    if value is None:
        return None
    if value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc)


def iso(value: datetime | None) -> str:
    """An RFC 3339 UTC timestamp with ``Z`` (seconds), or ``never``."""
    stamp = aware(value)
    return "never" if stamp is None else stamp.strftime("%Y-%m-%dT%H:%M:%SZ")


def resolve_expiry(
    now: datetime, expires_in_days: int | None = None, expires_at: datetime | None = None
) -> datetime | None:
    """When a new token expires: `expires_in_days` from `now`, or `expires_at` (in the future, at
    most `MAX_TOKEN_DAYS` ahead), or None (never). Both given, or a bad time: `InvalidRequest`."""
    if expires_in_days is not None and expires_at is not None:
        raise InvalidRequest("give expires_in_days or expires_at, not both")
    if expires_in_days is not None:
        if not 1 <= expires_in_days <= MAX_TOKEN_DAYS:
            raise InvalidRequest(f"expires_in_days must be 1..{MAX_TOKEN_DAYS} (got {expires_in_days})")
        return now + timedelta(days=expires_in_days)
    if expires_at is None:
        return None
    if expires_at.tzinfo is None:
        raise InvalidRequest("expires_at needs a timezone, e.g. 2030-01-01T00:00:00Z")
    when = expires_at.astimezone(timezone.utc)
    if when <= now:
        raise InvalidRequest(f"expires_at {iso(when)} is in the past; give a future time")
    if when > now + timedelta(days=MAX_TOKEN_DAYS):
        raise InvalidRequest(f"expires_at {iso(when)} is more than {MAX_TOKEN_DAYS} days ahead")
    return when


def checked_expiry(
    now: datetime, expires_in_days: int | None, expires_at: datetime | None, prefix: str = ""
) -> datetime | None:
    """`resolve_expiry` whose refusal names its body field in `errors` (``body.{prefix}expires_at``,
    else ``body.{prefix}expires_in_days``)."""
    field = "expires_at" if expires_at is not None else "expires_in_days"
    return checked(f"body.{prefix}{field}", resolve_expiry, now, expires_in_days, expires_at)


def token_state(row: ApiToken, now: datetime) -> str:
    """``revoked``, ``expired`` or ``active``."""
    if row.revoked_at is not None:
        return "revoked"
    expires = aware(row.expires_at)
    if expires is not None and expires <= now:
        return "expired"
    return "active"


def refusal(row: ApiToken, now: datetime) -> str | None:
    """Why the token authenticates nobody (one line with how to get a new one), or None if it is valid."""
    state = token_state(row, now)
    if state == "revoked":
        return f"token {row.id} was revoked at {iso(row.revoked_at)}; {NEW_TOKEN_HINT}"
    if state == "expired":
        return f"token {row.id} expired at {iso(row.expires_at)}; {NEW_TOKEN_HINT}"
    return None


def needs_touch(last_used: datetime | None, now: datetime) -> bool:
    """Whether ``last_used_at`` is stale enough to be written again."""
    last = aware(last_used)
    return last is None or now - last >= LAST_USED_RESOLUTION or last > now


def authenticate(session: Session, token: str, now: datetime | None = None) -> User | None:
    """The user owning `token`; None for an unknown token; `Unauthorized` (saying why and how to get
    a new one) for an expired or revoked token. Records the use at most once a minute."""
    now = now or utcnow()
    row = token_row(session, token)
    if row is None:
        return None
    message = refusal(row, now)
    if message is not None:
        raise Unauthorized(message)
    if needs_touch(row.last_used_at, now):
        row.last_used_at = now
    return row.user


def token_out(row: ApiToken, now: datetime) -> schemas.TokenOut:
    """The API view of a token: metadata only, never the token or its hash."""
    return schemas.TokenOut(
        id=row.id,
        name=row.name,
        state=schemas.TokenState(token_state(row, now)),
        created_at=aware(row.created_at) or now,
        expires_at=aware(row.expires_at),
        revoked_at=aware(row.revoked_at),
        last_used_at=aware(row.last_used_at),
    )
