"""Errors the API turns into RFC 9457 problem details (`elastrain.server.problems`).

An `InvalidRequest` may name the fields it is about (`FieldError`); `FieldErrors` runs several checks and
raises one `InvalidRequest` naming every bad field, so a form can mark all of them at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

from elastrain.errors import ElastrainError

P = ParamSpec("P")
T = TypeVar("T")


@dataclass(frozen=True)
class FieldError:
    """One bad value: where it is (``body.name``, ``query.offset``, ``path.job_id``) and what is wrong."""

    loc: str
    message: str


class ApiError(ElastrainError):
    """A refusal with an HTTP status; the message says what is wrong and how to fix it."""

    status = 400


class InvalidRequest(ApiError):
    """The request is well-formed but its values are refused; `errors` names the bad fields (if known).

    `field` (e.g. ``"min_containers"``) is the body field a check is about, when the check knows it.
    """

    status = 422

    def __init__(self, message: str, errors: list[FieldError] | None = None, *, field: str = "") -> None:
        super().__init__(message)
        self.errors: list[FieldError] = list(errors or [])
        self.field = field


class Unauthorized(ApiError):
    """No token or an unknown token."""

    status = 401


class Forbidden(ApiError):
    """Authenticated, but not allowed (e.g. a non-admin creating users)."""

    status = 403


class NotFound(ApiError):
    """No such object, or not one of the caller's (others' objects are invisible)."""

    status = 404


class Conflict(ApiError):
    """The object exists already or is in a state that refuses the request."""

    status = 409


class TooMany(ApiError):
    """A per-user bound on things held at once (exec streams, reports per second) is reached."""

    status = 429


class FieldErrors:
    """Collects the `InvalidRequest`s of several checks; `raise_if_any` raises one naming them all.

    found = FieldErrors()
    found.check("body.name", check_name, req.name)
    shm = found.check("body.shm", parse_size, req.shm)  # None when refused
    found.raise_if_any()
    """

    def __init__(self) -> None:
        self.errors: list[FieldError] = []

    def __bool__(self) -> bool:
        return bool(self.errors)

    def add(self, loc: str, message: str) -> None:
        """Record a refusal of the value at `loc`."""
        self.errors.append(FieldError(loc, message))

    def check(self, loc: str, check: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T | None:
        """`check(*args)`, or None after recording its refusal at `loc` (or ``body.<its field>``)."""
        try:
            return check(*args, **kwargs)
        except InvalidRequest as exc:
            if exc.errors:
                self.errors.extend(exc.errors)
            else:
                self.add(f"body.{exc.field}" if exc.field else loc, str(exc))
            return None

    def raise_if_any(self) -> None:
        """Raise one `InvalidRequest` naming every recorded field (its message: all of them, one line)."""
        if not self.errors:
            return
        if len(self.errors) == 1:
            raise InvalidRequest(self.errors[0].message, self.errors)
        found = "; ".join(f"{e.loc.removeprefix('body.')}: {e.message}" for e in self.errors)
        raise InvalidRequest(f"invalid request: {found}", self.errors)


def checked(loc: str, check: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`check(*args)`; its `InvalidRequest` names the field at `loc` (unless it names fields itself)."""
    try:
        return check(*args, **kwargs)
    except InvalidRequest as exc:
        if not exc.errors:
            exc.errors = [FieldError(f"body.{exc.field}" if exc.field else loc, str(exc))]
        raise
