"""The FastAPI dependencies of the API routes and the portal: the services, the settings, the caller.

`create_app` (the composition root's last step) puts the server's objects on ``app.state``; routes
receive them through these dependencies, never through closures or module globals. The bearer scheme
here is the one security scheme of the OpenAPI document.

No ``from __future__ import annotations``: FastAPI reads the dependencies' annotations as objects.
"""

from typing import Annotated

from fastapi import Depends
from fastapi.requests import HTTPConnection
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from elastrain.db.models import User
from elastrain.server.errors import Unauthorized
from elastrain.server.jobs import JobService
from elastrain.server.services import Services
from elastrain.server.settings import ServerSettings

bearer = HTTPBearer(auto_error=False, description="an API token (elastrain user create; DATA/admin-token)")
"""The one security scheme of the OpenAPI document (``Authorization: Bearer TOKEN``)."""
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]

MISSING_TOKEN = "missing bearer token; set ELASTRAIN_TOKEN or pass --token"
UNKNOWN_TOKEN = "unknown token; ask an admin for one (elastrain user create NAME)"

# get_services, get_jobs and get_settings are `async def` although they never await: FastAPI runs a
# plain `def` dependency in the thread pool, and under load each such hop costs the event loop a GIL
# hand-over; these only read app.state.


async def get_services(connection: HTTPConnection) -> Services:
    """The server's `Services` (clusters, users, exec)."""
    services: Services = connection.app.state.services
    return services


async def get_jobs(connection: HTTPConnection) -> JobService:
    """The server's `JobService`."""
    jobs: JobService = connection.app.state.jobs
    return jobs


async def get_settings(connection: HTTPConnection) -> ServerSettings | None:
    """The settings the server was started with (None for an app built without them, as in tests)."""
    settings: ServerSettings | None = connection.app.state.settings
    return settings


ServicesDep = Annotated[Services, Depends(get_services)]
JobsDep = Annotated[JobService, Depends(get_jobs)]
SettingsDep = Annotated[ServerSettings | None, Depends(get_settings)]


def user_for_token(services: Services, token: str) -> User:
    """The user owning API token `token` (detached from its session); 401 for an unknown one, and
    (`Services.authenticate`) for an expired or revoked one."""
    with services.db.session() as session:
        user = services.authenticate(session, token)
        if user is None:
            raise Unauthorized(UNKNOWN_TOKEN)
        session.expunge(user)
        return user


def current_user(credentials: Credentials, services: ServicesDep) -> User:
    """The caller, from the bearer token; 401 without a valid one."""
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise Unauthorized(MISSING_TOKEN)
    return user_for_token(services, credentials.credentials)


CurrentUser = Annotated[User, Depends(current_user)]
