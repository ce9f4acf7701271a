"""The FastAPI application: thin routes under ``/api/v1`` calling `Services`; errors as 4xx JSON.

No ``from __future__ import annotations`` here: FastAPI must see the route annotations as objects,
because the auth dependency is a closure over the app's `Services`.
"""

import hmac
import logging
import re
from collections.abc import Callable, Mapping
from typing import Annotated

from fastapi import APIRouter, Depends, FastAPI, Header, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException

from elastrain.db.models import Job, User
from elastrain.db.repository import hash_token
from elastrain.server import schemas
from elastrain.server import users as accounts
from elastrain.server.errors import ApiError, Unauthorized
from elastrain.server.jobs import JobService
from elastrain.server.limits import BodyLimitMiddleware, bearer_token, resolve_max_body_bytes
from elastrain.server.schemas import MAX_DB_INT
from elastrain.server.services import Services

log = logging.getLogger("elastrain.server")
_JOB_TOKEN_ROUTE = re.compile(r"^/api/v1/jobs/([0-9]{1,19})/(?:progress|incidents)$")
_ATTACH_ROUTE = "/api/v1/jobs/attach"
JobId = Annotated[int, Path(ge=1, le=MAX_DB_INT, description="a job id")]
TokenId = Annotated[int, Path(ge=1, le=MAX_DB_INT, description="a token id (elastrain user token list)")]
_bearer = HTTPBearer(auto_error=False, description="an API token (elastrain user create; DATA/admin-token)")


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message, "status": status}, status_code=status)


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err.get("loc", ()) if p not in ("body",)) or "request"
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return "invalid request: " + "; ".join(parts)


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


def create_app(services: Services, jobs: JobService, *, max_body_bytes: int | None = None) -> FastAPI:
    """The app with every route and error handler wired to `services`.

    `max_body_bytes`: the request-body cap (default ``$ELASTRAIN_MAX_BODY_BYTES``, else 1 MiB); bodies
    under ``/api/`` are refused (401) before they are read unless the request carries a valid token.
    """
    app = FastAPI(  # /docs is served from the package (elastrain.server.docs), never from a CDN
        title="elastrain control plane",
        version="0.1.0",
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json",
    )

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return _error(exc.status, str(exc))

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(422, _validation_message(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        response = _error(exc.status_code, str(exc.detail))
        if exc.headers:
            response.headers.update(exc.headers)
        return response

    @app.exception_handler(Exception)
    async def _internal(_request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return _error(500, f"internal error: {type(exc).__name__}")

    def current_user(
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    ) -> User:
        """The caller, from the bearer token; 401 without a valid one."""
        if credentials is None or credentials.scheme.lower() != "bearer":
            raise Unauthorized("missing bearer token; set ELASTRAIN_TOKEN or pass --token")
        with services.db.session() as session:
            user = services.authenticate(session, credentials.credentials)
            if user is None:
                raise Unauthorized("unknown token; ask an admin for one (elastrain user create NAME)")
            session.expunge(user)
            return user

    Caller = Annotated[User, Depends(current_user)]
    Bearer = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
    api = APIRouter(prefix="/api/v1")
    errors: dict[int | str, dict[str, object]] = {
        code: {"model": schemas.ErrorOut} for code in (400, 401, 403, 404, 409, 422)
    }

    @api.get("/healthz", tags=["meta"])
    def healthz() -> dict[str, str]:
        """Liveness (no token needed)."""
        return {"status": "ok"}

    @api.get("/me", response_model=schemas.UserOut, responses=errors, tags=["users"])
    def me(user: Caller) -> schemas.UserOut:
        """Who the token belongs to."""
        return schemas.UserOut(name=user.name, admin=user.is_admin)

    @api.post("/users", response_model=schemas.UserOut, status_code=201, responses=errors, tags=["users"])
    def create_user(req: schemas.UserCreate, user: Caller) -> schemas.UserOut:
        """Create a user and return their token (admin only)."""
        return services.create_user(user, req)

    @api.get("/users/{name}", response_model=schemas.UserDetailOut, responses=errors, tags=["users"])
    def get_user(name: str, user: Caller) -> schemas.UserDetailOut:
        """A user with their quota and usage (your own; an admin sees anyone's)."""
        return accounts.get_user(services.db, user, name)

    @api.patch("/users/{name}", response_model=schemas.UserDetailOut, responses=errors, tags=["users"])
    def update_user(name: str, req: schemas.UserPatch, user: Caller) -> schemas.UserDetailOut:
        """Set a user's quota (admin only); a null limit goes back to the server default."""
        return accounts.update_user(services.db, user, name, req)

    @api.post(
        "/users/{name}/tokens",
        response_model=schemas.TokenCreated,
        status_code=201,
        responses=errors,
        tags=["users"],
    )
    def create_token(
        name: str, req: schemas.TokenCreate, user: Caller, token: Bearer
    ) -> schemas.TokenCreated:
        """Create an API token for a user (yourself; an admin: anyone); the token is shown this once."""
        return accounts.create_token(services.db, user, name, req, token.credentials if token else "")

    @api.get("/users/{name}/tokens", response_model=list[schemas.TokenOut], responses=errors, tags=["users"])
    def list_tokens(name: str, user: Caller) -> list[schemas.TokenOut]:
        """A user's tokens: id, name, created, expires, revoked, last used (never the token itself)."""
        return accounts.list_tokens(services.db, user, name)

    @api.delete(
        "/users/{name}/tokens/{token_id}", response_model=schemas.TokenOut, responses=errors, tags=["users"]
    )
    def revoke_token(name: str, token_id: TokenId, user: Caller) -> schemas.TokenOut:
        """Revoke a token at once: every later request with it answers 401."""
        return accounts.revoke_token(services.db, user, name, token_id)

    @api.get("/inventory", response_model=schemas.InventoryOut, responses=errors, tags=["meta"])
    def inventory(_user: Caller) -> schemas.InventoryOut:
        """GPUs of this node and how many are in use."""
        return services.inventory_out()

    @api.get("/images", response_model=list[schemas.ImageOut], responses=errors, tags=["meta"])
    def images(_user: Caller) -> list[schemas.ImageOut]:
        """Images clusters can be created from (`elastrain image build` adds them)."""
        return services.images()

    @api.get("/clusters", response_model=list[schemas.ClusterOut], responses=errors, tags=["clusters"])
    def list_clusters(user: Caller) -> list[schemas.ClusterOut]:
        """The caller's clusters."""
        return services.list_clusters(user)

    @api.post(
        "/clusters", response_model=schemas.ClusterOut, status_code=201, responses=errors, tags=["clusters"]
    )
    def create_cluster(req: schemas.ClusterCreate, user: Caller) -> schemas.ClusterOut:
        """Create a cluster; its containers start within seconds (watch `state`)."""
        return services.create_cluster(user, req)

    @api.get("/clusters/{name}", response_model=schemas.ClusterOut, responses=errors, tags=["clusters"])
    def get_cluster(name: str, user: Caller) -> schemas.ClusterOut:
        """One cluster with its containers."""
        return services.get_cluster(user, name)

    @api.patch("/clusters/{name}", response_model=schemas.ClusterOut, responses=errors, tags=["clusters"])
    def scale_cluster(name: str, req: schemas.ClusterScale, user: Caller) -> schemas.ClusterOut:
        """Scale: set the total container count (launcher included)."""
        return services.scale_cluster(user, name, req.containers)

    @api.delete(
        "/clusters/{name}",
        response_model=schemas.ClusterOut,
        status_code=202,
        responses=errors,
        tags=["clusters"],
    )
    def delete_cluster(name: str, user: Caller) -> schemas.ClusterOut:
        """Delete: every process of the cluster is stopped, then it disappears (GET answers 404)."""
        return services.delete_cluster(user, name)

    @api.get(
        "/clusters/{name}/hostfile", response_class=PlainTextResponse, responses=errors, tags=["clusters"]
    )
    def hostfile(name: str, user: Caller) -> str:
        """The hostfile every container reads at /etc/mpi/hostfile."""
        return services.hostfile(user, name)

    @api.get(
        "/clusters/{name}/events", response_model=list[schemas.EventOut], responses=errors, tags=["clusters"]
    )
    def events(name: str, user: Caller) -> list[schemas.EventOut]:
        """The cluster's audit trail: who did what when."""
        return services.events(user, name)

    @api.get("/clusters/{name}/logs", response_class=PlainTextResponse, responses=errors, tags=["clusters"])
    def container_logs(name: str, user: Caller, container: str | None = None) -> str:
        """A container's captured output (the launcher's unless `container` is given)."""
        return services.container_logs(user, name, container)

    @api.post("/clusters/{name}/exec", responses=errors, tags=["clusters"])
    def exec_command(name: str, req: schemas.ExecRequest, user: Caller) -> StreamingResponse:
        """Run a command in the launcher container; streams NDJSON ``{"out": ...}`` then ``{"exit": N}``."""
        return StreamingResponse(services.exec_stream(user, name, req), media_type="application/x-ndjson")

    @api.post(
        "/clusters/{name}/jobs",
        response_model=schemas.JobOut,
        status_code=201,
        responses=errors,
        tags=["jobs"],
    )
    def submit_job(name: str, req: schemas.JobSubmit, user: Caller) -> schemas.JobOut:
        """Run a command detached in the launcher container (`elastrain job submit`)."""
        return jobs.submit(user, name, req)

    @api.get("/jobs", response_model=list[schemas.JobOut], responses=errors, tags=["jobs"])
    def list_jobs(user: Caller, cluster: str | None = None) -> list[schemas.JobOut]:
        """The caller's jobs, optionally of one cluster."""
        return jobs.list(user, cluster)

    @api.get("/jobs/{job_id}", response_model=schemas.JobOut, responses=errors, tags=["jobs"])
    def get_job(job_id: JobId, user: Caller) -> schemas.JobOut:
        """A job with its status and last progress."""
        return jobs.get(user, job_id)

    @api.delete("/jobs/{job_id}", response_model=schemas.JobOut, responses=errors, tags=["jobs"])
    def cancel_job(job_id: JobId, user: Caller) -> schemas.JobOut:
        """Stop a running job."""
        return jobs.cancel(user, job_id)

    @api.get("/jobs/{job_id}/logs", responses=errors, tags=["jobs"])
    def job_logs(
        job_id: JobId, user: Caller, offset: Annotated[int, Query(ge=0, le=MAX_DB_INT)] = 0
    ) -> Response:
        """Log bytes from `offset`; headers X-Next-Offset and X-Job-Status tell how to continue."""
        data, next_offset, status = jobs.logs(user, job_id, offset)
        headers = {"X-Next-Offset": str(next_offset), "X-Job-Status": status}
        return Response(data, media_type="text/plain; charset=utf-8", headers=headers)

    @api.get(
        "/jobs/{job_id}/checkpoints",
        response_model=list[schemas.CheckpointOut],
        responses=errors,
        tags=["jobs"],
    )
    def job_checkpoints(job_id: JobId, user: Caller) -> list[schemas.CheckpointOut]:
        """The checkpoints the job published (with --checkpoint-dir), newest first."""
        return list(jobs.checkpoints(user, job_id))

    @api.post("/jobs/{job_id}/progress", status_code=204, responses=errors, tags=["jobs"])
    def report_progress(
        job_id: JobId, progress: schemas.JobProgress, x_job_token: Annotated[str, Header()] = ""
    ) -> Response:
        """A job reports step/epoch/loss/samples_per_s/world_size (auth: its X-Job-Token)."""
        jobs.report(job_id, x_job_token, progress)
        return Response(status_code=204)

    @api.post("/jobs/attach", response_model=schemas.JobAttached, responses=errors, tags=["jobs"])
    def attach_job(
        req: schemas.JobAttach, x_attach_token: Annotated[str, Header()] = ""
    ) -> schemas.JobAttached:
        """`elastrain run` in a launcher terminal registers itself as a job (auth: X-Attach-Token)."""
        return jobs.attach(x_attach_token, req)

    @api.post("/jobs/{job_id}/incidents", status_code=204, responses=errors, tags=["jobs"])
    def report_incident(
        job_id: JobId, incident: schemas.JobIncident, x_job_token: Annotated[str, Header()] = ""
    ) -> Response:
        """`elastrain run` reports a generation change: cause, detect/recover times, steps lost."""
        jobs.record_incident(job_id, x_job_token, incident)
        return Response(status_code=204)

    @api.get("/jobs/{job_id}/events", response_model=list[schemas.EventOut], responses=errors, tags=["jobs"])
    def job_events(job_id: JobId, user: Caller) -> list[schemas.EventOut]:
        """The job's events: submitted, every incident (generation change), cancelled."""
        return list(jobs.events(user, job_id))

    app.include_router(api)
    app.add_middleware(
        BodyLimitMiddleware,
        max_body_bytes=resolve_max_body_bytes(max_body_bytes),
        authorized=body_authorizer(services, jobs),
        error=_error,
    )
    from elastrain.portal import mount_portal  # the web portal at /
    from elastrain.server import access_log, docs

    docs.add_docs(app)  # /docs with the vendored Swagger UI at /_swagger/
    mount_portal(app, services, jobs)
    access_log.install(app)  # outermost: X-Request-ID on every answer, one log line each
    return app
