"""Who may open a cluster's JupyterLab, and where it is: the portal's auth in front of the lab proxy.

The caller is the owner of an API token, sent as ``Authorization: Bearer`` (API clients) or in the
`LAB_COOKIE` that ``POST /clusters/<name>/lab-session`` sets (the cluster page's "Open JupyterLab":
a browser cannot add headers to a page navigation or a WebSocket). Only the cluster's owner gets
through: another tenant's cluster, or an unknown one, is 404, as everywhere in the API.
"""

from __future__ import annotations

import html
import threading
import time
from typing import Protocol, runtime_checkable

from fastapi.responses import HTMLResponse, Response

from elastrain.backends.container_run import LabEndpoint
from elastrain.db.models import ContainerState, User
from elastrain.db.repository import find_cluster
from elastrain.portal.lab_http import LAB_COOKIE, cookie_value
from elastrain.server.deps import MISSING_TOKEN, user_for_token
from elastrain.server.errors import ApiError, Conflict, NotFound, Unauthorized
from elastrain.server.exec_service import launcher_of
from elastrain.server.problems import problem_response
from elastrain.server.redact import redact
from elastrain.server.services import Services

ENDPOINT_TTL_S = 30.0  # how long a launcher's address is reused (finding it costs a podman inspect)
RETRY_AFTER_S = 5


class LabUnavailable(ApiError):
    """The launcher runs, but its JupyterLab does not answer (starting, or an image without it)."""

    status = 503


class LabUnsupported(ApiError):
    """The server's backend runs no container that JupyterLab could run in (process, Slurm)."""

    status = 501


@runtime_checkable
class LabBackend(Protocol):
    """A backend whose launchers run JupyterLab (`elastrain.backends.container.ContainerBackend`)."""

    def lab_endpoint(self, cluster: str, name: str) -> LabEndpoint | None:
        """Where the server reaches launcher `name`'s JupyterLab; None when it has none now."""


def bearer(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer TOKEN`` header."""
    scheme, _, token = (authorization or "").strip().partition(" ")
    return (token.strip() or None) if scheme.lower() == "bearer" else None


def lab_user(services: Services, authorization: str | None, cookies: str | None) -> User:
    """The caller, from a bearer token or the lab cookie; 401 without a valid one."""
    token = bearer(authorization) or cookie_value(cookies, LAB_COOKIE)
    if not token:
        raise Unauthorized(f"{MISSING_TOKEN}, or open JupyterLab from the cluster's page in the portal")
    return user_for_token(services, token)


def owned_launcher(services: Services, user: User, name: str) -> str:
    """The name of the Running launcher of `user`'s own cluster `name`: 404 for a cluster that is not
    theirs (an admin's view of a tenant's included), 409 while the launcher is not Running."""
    with services.db.session() as session:
        cluster = find_cluster(session, user, name)
        if cluster is None or cluster.owner_id != user.id:
            raise NotFound(f"cluster {name!r} not found")
        launcher = launcher_of(cluster)
        if launcher is None or launcher.state != ContainerState.Running:
            raise Conflict(f"the launcher container of {name!r} is not Running yet; wait and retry")
        return launcher.name


class LabLocator:
    """Finds the JupyterLab of a caller's cluster, reusing a launcher's address for `ENDPOINT_TTL_S`
    (every request checks the caller and the launcher's state again; only the address is reused)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._endpoints: dict[tuple[str, str], tuple[LabEndpoint, float]] = {}

    def locate(self, services: Services, user: User, name: str) -> LabEndpoint:
        """`user`'s cluster `name`'s JupyterLab (blocking: database and podman); an `ApiError` else."""
        launcher = owned_launcher(services, user, name)
        backend = services.backend
        if not isinstance(backend, LabBackend):
            raise LabUnsupported(
                "JupyterLab runs in the launcher container of the container backend; this server's "
                "backend runs no containers (start the server with --backend container)"
            )
        key = (name, launcher)
        now = time.monotonic()
        with self._lock:
            cached = self._endpoints.get(key)
        if cached is not None and cached[1] > now:
            return cached[0]
        endpoint = backend.lab_endpoint(name, launcher)
        if endpoint is None:
            raise LabUnavailable(
                f"the launcher of {name!r} runs no JupyterLab: its image has none or the container "
                "predates it (rebuild the image with `elastrain image build` and recreate the cluster)"
            )
        with self._lock:
            self._endpoints[key] = (endpoint, now + ENDPOINT_TTL_S)
        return endpoint

    def forget(self, name: str) -> None:
        """Drop the cached address of cluster `name` (it did not answer: the launcher may be new)."""
        with self._lock:
            for key in [k for k in self._endpoints if k[0] == name]:
                del self._endpoints[key]


def not_answering(name: str) -> LabUnavailable:
    """The refusal when the launcher's JupyterLab does not accept the connection."""
    return LabUnavailable(
        f"JupyterLab in the launcher of {name!r} is not answering yet (it starts with the container); "
        f"retry in a few seconds"
    )


def error_page(status: int, detail: str, cluster: str) -> HTMLResponse:
    """A small page saying why the lab cannot be shown, with the way back to the portal."""
    title = {401: "Sign in first", 404: "Not found"}.get(status, "JupyterLab is not available")
    back = (
        f'<a href="/clusters/{html.escape(cluster)}">the cluster page</a>'
        if status != 404
        else '<a href="/clusters">your clusters</a>'
    )
    body = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f'<title>{title}</title><link rel="stylesheet" href="/static/portal.css"></head>'
        f'<body><main><h1>{title}</h1><p id="lab-error">{html.escape(detail)}</p>'
        f"<p>Back to {back}.</p></main></body></html>"
    )
    response = HTMLResponse(body, status_code=status)
    response.headers["Content-Security-Policy"] = "default-src 'self'; frame-ancestors 'none'"
    return response


def refusal(exc: ApiError, path: str, cluster: str, accept: str) -> Response:
    """`exc` as the client wants it: a page for a browser's navigation, else problem details."""
    if "text/html" in accept:
        response: Response = error_page(exc.status, redact(str(exc)), cluster)
    else:
        response = problem_response(exc.status, str(exc), path)
    response.headers["Cache-Control"] = "no-store"
    if exc.status == 503:
        response.headers["Retry-After"] = str(RETRY_AFTER_S)
    return response
