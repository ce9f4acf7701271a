"""Routes of jobs: submit, list, read, cancel, logs, checkpoints, events, and the jobs' own reports.

No ``from __future__ import annotations``: FastAPI must see the route annotations as objects.
"""

from typing import Annotated

from fastapi import APIRouter, Body, Header, Path, Query, Response
from fastapi.responses import PlainTextResponse

from elastrain.server import schemas
from elastrain.server.bounded import off_loop
from elastrain.server.deps import CurrentUser, JobsDep
from elastrain.server.openapi import BODY, created, errors, location, merged
from elastrain.server.schemas import MAX_DB_INT

JobId = Annotated[int, Path(ge=1, le=MAX_DB_INT, description="a job id")]
_SUBMIT = {
    "hostname": {"summary": "a harmless command", "value": {"command": ["hostname"]}},
    "tensorboard": {
        "summary": "elastrain run, TensorBoard scalars on the cluster's storage",
        "value": {
            "command": ["elastrain", "run", "-np", "2", "python", "/data/train.py"],
            "tensorboard_dir": "/data/tensorboard/run1",
        },
    },
}
_PROGRESS = {
    "step": {"summary": "step 100", "value": {"step": 100, "epoch": 1, "loss": 0.42}},
    "scalars": {
        "summary": "elastrain.report(loss=0.42, step=100, accuracy=0.91)",
        "value": {"step": 100, "loss": 0.42, "scalars": {"accuracy": 0.91}},
    },
}
_ATTACH = {"run": {"summary": "elastrain run, pid 42", "value": {"command": ["python", "t.py"], "pid": 42}}}
_INCIDENT = {
    "failure": {
        "summary": "a worker died at step 120; 3 workers again after 4.2 s",
        "value": {"generation": 2, "cause": "worker_failure", "world_size": 3, "start_step": 118,
                  "steps_lost": 2, "detect_s": 1.5, "recover_s": 4.2},
    }
}  # fmt: skip
LOG_HEADERS = {
    "X-Next-Offset": {
        "description": "the offset to ask for next (offset + the bytes returned)",
        "schema": {"type": "integer", "minimum": 0},
    },
    "X-Job-Status": {
        "description": "the job's status now; stop following once it is not Running",
        "schema": {"$ref": "#/components/schemas/JobStatus"},
    },
}


router = APIRouter(prefix="/api/v1", tags=["jobs"])


@router.post(
    "/clusters/{name}/jobs",
    response_model=schemas.JobOut,
    status_code=201,
    responses=created(*BODY, 403, 404, 409, 429),
)
def submit_job(
    jobs: JobsDep,
    name: str,
    req: Annotated[schemas.JobSubmit, Body(openapi_examples=_SUBMIT)],
    user: CurrentUser,
    response: Response,
) -> schemas.JobOut:
    """Run a command detached in the launcher container (`elastrain job submit`); `Location` is the
    job's URL. 403: not the owner, or host commands are off; 409: no Running launcher yet; 429: the
    caller has ``--max-running-jobs`` jobs running."""
    out = jobs.submit(user, name, req)
    response.headers["Location"] = location("jobs", out.id)
    return out


@router.get("/jobs", response_model=list[schemas.JobOut], responses=errors(401, 404, 422))
def list_jobs(jobs: JobsDep, user: CurrentUser, cluster: str | None = None) -> list[schemas.JobOut]:
    """The caller's jobs, optionally of one cluster (404: no such cluster)."""
    return jobs.list(user, cluster)


@router.get("/jobs/{job_id:int}", response_model=schemas.JobOut, responses=errors(401, 404, 422))
def get_job(jobs: JobsDep, job_id: JobId, user: CurrentUser) -> schemas.JobOut:
    """A job with its status and last progress."""
    return jobs.get(user, job_id)


@router.delete("/jobs/{job_id:int}", response_model=schemas.JobOut, responses=errors(401, 404, 422))
def cancel_job(jobs: JobsDep, job_id: JobId, user: CurrentUser) -> schemas.JobOut:
    """Stop a running job (a finished one is answered as it is)."""
    return jobs.cancel(user, job_id)


@router.get(
    "/jobs/{job_id}/logs",
    response_class=PlainTextResponse,
    responses=merged(
        errors(401, 404, 409, 422, 503, 504),
        {200: {"description": "up to 1 MiB of log bytes", "headers": LOG_HEADERS}},
    ),
)
async def get_job_logs(
    jobs: JobsDep, job_id: JobId, user: CurrentUser, offset: Annotated[int, Query(ge=0, le=MAX_DB_INT)] = 0
) -> Response:
    """Log bytes from `offset` (text/plain), at most 1 MiB per request; headers X-Next-Offset and
    X-Job-Status tell how to go on. A log that is not a regular file (a FIFO, a link) is refused (409);
    one that does not answer within 5 s is 504."""
    data, next_offset, status = await off_loop(lambda: jobs.logs(user, job_id, offset))
    headers = {"X-Next-Offset": str(next_offset), "X-Job-Status": status}
    return Response(data, media_type="text/plain; charset=utf-8", headers=headers)


@router.get(
    "/jobs/{job_id}/checkpoints",
    response_model=list[schemas.CheckpointOut],
    responses=errors(401, 404, 422),
)
def list_job_checkpoints(jobs: JobsDep, job_id: JobId, user: CurrentUser) -> list[schemas.CheckpointOut]:
    """The checkpoints the job published (with --checkpoint-dir), newest first."""
    return list(jobs.checkpoints(user, job_id))


@router.post("/jobs/{job_id}/progress", status_code=204, responses=errors(*BODY, 429))
def report_progress(
    jobs: JobsDep,
    job_id: JobId,
    progress: Annotated[schemas.JobProgress, Body(openapi_examples=_PROGRESS)],
    x_job_token: Annotated[str, Header()] = "",
) -> Response:
    """A job reports step/epoch/loss/samples_per_s/world_size and other named scalars (auth: its
    X-Job-Token; 401 without; 429 past ``--report-rate`` reports a second)."""
    jobs.report(job_id, x_job_token, progress)
    return Response(status_code=204)


@router.post("/jobs/attach", response_model=schemas.JobAttached, responses=errors(*BODY, 404, 409, 429))
def attach_job(
    jobs: JobsDep,
    req: Annotated[schemas.JobAttach, Body(openapi_examples=_ATTACH)],
    x_attach_token: Annotated[str, Header()] = "",
) -> schemas.JobAttached:
    """`elastrain run` in a launcher terminal registers itself as a job (auth: X-Attach-Token)."""
    return jobs.attach(x_attach_token, req)


@router.post("/jobs/{job_id}/incidents", status_code=204, responses=errors(*BODY, 429))
def report_incident(
    jobs: JobsDep,
    job_id: JobId,
    incident: Annotated[schemas.JobIncident, Body(openapi_examples=_INCIDENT)],
    x_job_token: Annotated[str, Header()] = "",
) -> Response:
    """`elastrain run` reports a generation change: cause, detect/recover times, steps lost."""
    jobs.record_incident(job_id, x_job_token, incident)
    return Response(status_code=204)


@router.get("/jobs/{job_id}/events", response_model=list[schemas.EventOut], responses=errors(401, 404, 422))
def list_job_events(jobs: JobsDep, job_id: JobId, user: CurrentUser) -> list[schemas.EventOut]:
    """The job's events: submitted, every incident (generation change), cancelled."""
    return list(jobs.events(user, job_id))
