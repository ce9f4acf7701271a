"""Browser-only API routes under ``/api/v1``: a job's metrics history and the launcher terminal.

They follow the REST API's rules: a bearer token (the terminal sends it as its first WebSocket
message, since browsers cannot set headers on a WebSocket), and only the owner sees a cluster or job;
refusals of the metrics route are problem details, as every API refusal.
"""

import asyncio
import json
import logging
import pathlib
from typing import Annotated

from fastapi import APIRouter, FastAPI, Query, WebSocket, WebSocketDisconnect
from pydantic import BaseModel, Field
from sqlalchemy import select

from elastrain.db.models import ContainerState, JobMetric, User
from elastrain.portal.terminal import TerminalRegistry, TerminalSession, TerminalTarget
from elastrain.server.deps import CurrentUser, JobsDep, ServicesDep, user_for_token
from elastrain.server.errors import Conflict, Forbidden, NotFound, TooMany, Unauthorized
from elastrain.server.fields import MAX_DB_INT, UtcDatetime
from elastrain.server.openapi import errors
from elastrain.server.redact import redact
from elastrain.server.routes_jobs import JobId
from elastrain.server.services import Services
from elastrain.server.slots import terminal_slots

log = logging.getLogger("elastrain.portal")
AUTH_TIMEOUT_S = 10.0


class MetricOut(BaseModel):
    """One progress report of a job."""

    id: int
    at: UtcDatetime
    step: int | None
    epoch: int | None
    loss: float | None
    samples_per_s: float | None
    world_size: int | None
    scalars: dict[str, float] | None = Field(
        default=None, description="the other figures of this report (`elastrain.report`), by name"
    )


def terminal_target(services: Services, user: User, name: str) -> TerminalTarget:
    """Where the caller's terminal runs: the launcher container of their cluster `name`.

    The rules of REST exec (`ExecService.find`): 403 on the process and Slurm backends without
    --insecure-host-commands, 404 for a cluster the caller cannot see, 403 for one they see but do
    not own (an admin's view of a tenant's); 409 while the launcher is not Running.
    """
    commands = services.commands
    with services.db.session() as session:
        cluster, launcher = commands.find(session, user, name)
        if launcher is None or launcher.state != ContainerState.Running:
            raise Conflict(f"the launcher container of {name!r} is not Running yet; wait and retry")
        spec = commands.spec(cluster, launcher)
    backend = commands.backend
    label = f"{spec.cluster}/{spec.name}"
    if not backend.translates_paths:  # a real container: a shell inside it, as the tenant

        def shell(env: dict[str, str]) -> list[str] | None:
            return backend.terminal_command(spec, env)

        return TerminalTarget(cwd=pathlib.Path("/"), env={}, label=label, argv_for=shell)
    root = backend.container_path(spec.cluster, spec.name, "/")
    return TerminalTarget(cwd=root, env=backend.environment(spec), label=label, shm_bytes=spec.shm_bytes)


def add_portal_api(app: FastAPI) -> None:
    """Register ``GET /api/v1/jobs/{id}/metrics`` and ``WS /api/v1/clusters/{name}/terminal``."""
    terminals = TerminalRegistry()
    app.router.on_shutdown.append(terminals.close_all)
    settings = getattr(app.state, "settings", None)
    tabs = terminal_slots(settings.max_terminals) if settings is not None else terminal_slots()
    api = APIRouter(prefix="/api/v1")

    @api.get(
        "/jobs/{job_id}/metrics",
        response_model=list[MetricOut],
        responses=errors(401, 404, 422),
        tags=["jobs"],
    )
    def get_job_metrics(
        services: ServicesDep,
        jobs: JobsDep,
        job_id: JobId,
        user: CurrentUser,
        after: Annotated[
            int,
            Query(ge=0, le=MAX_DB_INT, description="only the reports with a larger id (0: from the start)"),
        ] = 0,
        limit: Annotated[int, Query(ge=1, le=20000)] = 5000,
    ) -> list[MetricOut]:
        """The job's progress reports in order (those with id > `after`): the time series behind charts."""
        jobs.get(user, job_id)  # 404 unless it is the caller's
        with services.db.session() as session:
            rows = session.scalars(
                select(JobMetric)
                .where(JobMetric.job_id == job_id, JobMetric.id > after)
                .order_by(JobMetric.id)
                .limit(limit)
            )
            return [
                MetricOut(
                    id=m.id,
                    at=m.at,
                    step=m.step,
                    epoch=m.epoch,
                    loss=m.loss,
                    samples_per_s=m.samples_per_s,
                    world_size=m.world_size,
                    scalars=json.loads(m.scalars) if m.scalars else None,
                )
                for m in rows
            ]

    @api.websocket("/clusters/{name}/terminal")
    async def terminal(websocket: WebSocket, name: str, services: ServicesDep, jobs: JobsDep) -> None:
        """A shell in the launcher container. First message ``{"token": ...}``; then ``{"input": str}``
        and ``{"resize": [cols, rows]}``; the server sends the terminal's output as text."""
        await websocket.accept()
        try:
            hello = json.loads(await asyncio.wait_for(websocket.receive_text(), AUTH_TIMEOUT_S))
            user = user_for_token(services, str(hello.get("token", "")))
            target = await asyncio.to_thread(terminal_target, services, user, name)
            release = tabs.open(user)  # 4429 past --max-terminals
        except (Unauthorized, Forbidden, NotFound, Conflict, TooMany) as exc:
            said = redact(str(exc))
            await websocket.send_text(f"\r\n{said}\r\n")
            await websocket.close(code=4000 + exc.status, reason=said[:120])
            return
        except (TimeoutError, ValueError, AttributeError, WebSocketDisconnect):
            await websocket.close(code=4400, reason='send {"token": ...} first')
            return
        size = hello.get("resize")

        def start() -> TerminalSession:
            target.env.update(jobs.attach_env(user, name))  # `elastrain run` typed there becomes a job
            return TerminalSession.start(target, size if isinstance(size, list) else None)

        try:
            session, new = terminals.get_or_start((user.id, name), start)
            log.info("terminal for %s in %s (%s)", user.name, target.label, "new" if new else "reattached")
            if not new and isinstance(size, list) and len(size) == 2:
                session.resize(size[0], size[1])
            await session.bridge(websocket)  # the shell (and a job typed in it) outlives the tab
        finally:
            release()

    app.include_router(api)
