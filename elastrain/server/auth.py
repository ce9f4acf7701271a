"""The API's bearer-token scheme and the dependency that turns a token into its `User`.

No ``from __future__ import annotations``: FastAPI reads the dependency's annotations as objects.
"""

from collections.abc import Callable
from typing import Annotated

from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from elastrain.db.models import User
from elastrain.server.errors import Unauthorized
from elastrain.server.services import Services

bearer = HTTPBearer(auto_error=False, description="an API token (elastrain user create; DATA/admin-token)")
"""The one security scheme of the OpenAPI document (``Authorization: Bearer TOKEN``)."""
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


def caller_dependency(services: Services) -> Callable[..., User]:
    """A FastAPI dependency: the caller from the bearer token; 401 without a valid one."""

    def current_user(credentials: Credentials) -> User:
        """The caller, from the bearer token; 401 without a valid one."""
        if credentials is None or credentials.scheme.lower() != "bearer":
            raise Unauthorized("missing bearer token; set ELASTRAIN_TOKEN or pass --token")
        with services.db.session() as session:
            user = services.authenticate(session, credentials.credentials)
            if user is None:
                raise Unauthorized("unknown token; ask an admin for one (elastrain user create NAME)")
            session.expunge(user)
            return user

    return current_user
