"""The FastAPI application: routes under ``/api/v1`` (`routes_users`, `routes_clusters`, `routes_jobs`,
`routes_storage`) calling `Services`; every refusal as RFC 9457 problem details (`problems`); the
OpenAPI document says what the routes do (`openapi`). The server's objects are on ``app.state``
(services, jobs, settings), where the routes' dependencies (`deps`) find them. ``GET /metrics``
serves Prometheus metrics (`metrics`); the containers' resource figures come from
``app.state.usage`` (`usage_service`).
"""

import hmac
import re
from collections.abc import Callable, Mapping

from fastapi import FastAPI

from elastrain.db.models import Job
from elastrain.db.repository import hash_token
from elastrain.server import (
    metrics,
    openapi,
    problems,
    routes_clusters,
    routes_jobs,
    routes_storage,
    routes_users,
)
from elastrain.server.errors import Unauthorized
from elastrain.server.jobs import JobService
from elastrain.server.limits import BodyLimitMiddleware, bearer_token, resolve_max_body_bytes
from elastrain.server.schemas import MAX_DB_INT
from elastrain.server.services import Services
from elastrain.server.settings import ServerSettings
from elastrain.server.usage_service import UsageService

_JOB_TOKEN_ROUTE = re.compile(r"^/api/v1/jobs/([0-9]{1,19})/(?:progress|incidents)$")
_ATTACH_ROUTE = "/api/v1/jobs/attach"
TAGS = [
    {"name": "clusters", "description": "Clusters of containers: create, scale, delete, run commands."},
    {"name": "jobs", "description": "Commands running detached in a cluster's launcher, and their reports."},
    {"name": "users", "description": "Users, their API tokens and quotas."},
    {"name": "storage", "description": "The caller's storage areas, which clusters mount (storage:NAME)."},
    {"name": "meta", "description": "Liveness, the node's GPUs and the images clusters can use."},
]
DESCRIPTION = (
    "The elastrain control plane. Authenticate with `Authorization: Bearer TOKEN`. Every refusal is "
    "RFC 9457 problem details (`application/problem+json`: type, title, status, detail, instance; a 422 "
    "lists every bad field in `errors`); the `error` member repeats `detail` and is deprecated."
)


def body_authorizer(services: Services, jobs: JobService) -> Callable[[str, Mapping[str, str]], bool]:
    """Whether a request may send a body: the same token lookups as the routes' own authentication.

    A valid bearer token (`Services.authenticate`, the auth dependency's lookup) opens every route;
    a job's report token opens its own progress/incidents routes; an attach token opens /jobs/attach.
    """

    def authorized(path: str, headers: Mapping[str, str]) -> bool:
        token = bearer_token(headers)
        if token is not None:
            try:
                with services.db.session() as session:
                    if services.authenticate(session, token) is not None:
                        return True
            except Unauthorized:  # an expired or revoked token opens nothing
                return False
        match = _JOB_TOKEN_ROUTE.match(path)
        job_token = headers.get("x-job-token", "")
        if match is not None and job_token:
            job_id = int(match.group(1))
            if not 1 <= job_id <= MAX_DB_INT:
                return False
            with services.db.session() as session:
                job = session.get(Job, job_id)
                stored = job.report_token_hash if job is not None else None
            return stored is not None and hmac.compare_digest(stored, hash_token(job_token))
        attach_token = headers.get("x-attach-token", "")
        if path == _ATTACH_ROUTE and attach_token:
            with jobs._attach_lock:  # the lookup JobService.attach does
                return hash_token(attach_token) in jobs._attach_tokens
        return False

    return authorized


def create_app(
    services: Services,
    jobs: JobService,
    *,
    max_body_bytes: int | None = None,
    settings: ServerSettings | None = None,
    metrics_token: str | None = None,
) -> FastAPI:
    """The app with every route and error handler wired to `services` and `jobs`.

    `max_body_bytes`: the request-body cap (default: `settings`' ``max_body_bytes``, else
    ``$ELASTRAIN_MAX_BODY_BYTES``, else 1 MiB); bodies under ``/api/`` are refused (401) before they
    are read unless the request carries a valid token. `metrics_token` (default: `settings`'
    ``metrics_token``): the bearer token ``GET /metrics`` needs (None: it is open).
    """
    if max_body_bytes is None and settings is not None:
        max_body_bytes = settings.max_body_bytes
    app = FastAPI(  # /docs is served from the package (elastrain.server.docs), never from a CDN
        title="elastrain control plane",
        version="0.1.0",
        description=DESCRIPTION,
        openapi_tags=TAGS,
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json",
        generate_unique_id_function=openapi.operation_id,
    )
    app.state.services, app.state.jobs, app.state.settings = services, jobs, settings
    app.state.usage = UsageService(services.db, services.backend, services.inventory)
    if metrics_token is None and settings is not None:
        metrics_token = settings.metrics_token
    problems.install(app)
    app.include_router(routes_users.router)
    app.include_router(routes_clusters.router)
    app.include_router(routes_jobs.router)
    app.include_router(routes_storage.router)
    app.add_middleware(
        BodyLimitMiddleware,
        max_body_bytes=resolve_max_body_bytes(max_body_bytes),
        authorized=body_authorizer(services, jobs),
        error=problems.problem_response,
    )
    from elastrain.portal import mount_portal  # the web portal at /
    from elastrain.server import access_log, docs

    docs.add_docs(app)  # /docs with the vendored Swagger UI at /_swagger/
    mount_portal(app)
    openapi.finalize(app)  # errors as application/problem+json in /openapi.json
    metrics.install(app, services, app.state.usage, metrics_token)  # GET /metrics, HTTP metrics
    access_log.install(app)  # outermost: X-Request-ID on every answer, one log line each
    return app
