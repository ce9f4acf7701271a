"""Errors the API turns into 4xx JSON answers (``{"error": message, "status": code}``)."""

from __future__ import annotations

from elastrain.errors import ElastrainError


class ApiError(ElastrainError):
    """A refusal with an HTTP status; the message says what is wrong and how to fix it."""

    status = 400


class InvalidRequest(ApiError):
    """The request is well-formed but its values are refused."""

    status = 422


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
