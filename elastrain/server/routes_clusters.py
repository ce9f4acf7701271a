"""Routes of clusters (``/clusters``): create, read, scale, delete, hostfile, events, logs, exec.

No ``from __future__ import annotations``: FastAPI must see the route annotations as objects.
"""

from typing import Annotated

from fastapi import APIRouter, Body, Depends, Response
from fastapi.responses import PlainTextResponse, StreamingResponse

from elastrain.server import schemas
from elastrain.server.bounded import off_loop
from elastrain.server.deps import CurrentUser, ServicesDep
from elastrain.server.openapi import BODY, created, errors, location, merged
from elastrain.server.usage_schemas import ClusterUsageOut
from elastrain.server.usage_service import UsageService, get_usage

_NEW_CLUSTER = {
    "two": {"summary": "a launcher and one worker", "value": {"name": "tthvd", "containers": 2}},
    "gpus": {
        "summary": "4 containers with 1 GPU and 2Gi of /dev/shm each",
        "value": {"name": "gpus4", "framework": "pytorch", "containers": 4, "gpus_per_container": 1,
                  "shm": "2Gi"},
    },
}  # fmt: skip
_SCALE = {"four": {"summary": "grow to 4 containers (launcher included)", "value": {"containers": 4}}}
_EXEC = {"hostname": {"summary": "a harmless command", "value": {"command": ["hostname"]}}}
EXEC_LINE = {
    "type": "object",
    "description": 'one JSON object per line: {"out": TEXT} for output (stdout and stderr), then one '
    '{"exit": CODE}; a blank line is a keep-alive',
    "properties": {
        "out": {"type": "string", "description": "a piece of the command's output"},
        "exit": {"type": "integer", "description": "the command's exit code (the last line)"},
    },
    "minProperties": 1,
    "maxProperties": 1,
    "additionalProperties": False,
}


NDJSON = "application/x-ndjson"


class NdjsonResponse(StreamingResponse):
    """A stream of JSON lines (``application/x-ndjson``)."""

    media_type = NDJSON


router = APIRouter(prefix="/api/v1", tags=["clusters"])


@router.get("/clusters", response_model=list[schemas.ClusterOut], responses=errors(401))
def list_clusters(services: ServicesDep, user: CurrentUser) -> list[schemas.ClusterOut]:
    """The caller's clusters."""
    return services.list_clusters(user)


@router.post(
    "/clusters", response_model=schemas.ClusterOut, status_code=201, responses=created(*BODY, 403, 404, 409)
)
def create_cluster(
    services: ServicesDep,
    req: Annotated[schemas.ClusterCreate, Body(openapi_examples=_NEW_CLUSTER)],
    user: CurrentUser,
    response: Response,
) -> schemas.ClusterOut:
    """Create a cluster; its containers start within seconds (watch `state`). `Location` is its URL.

    422 names every bad field at once; then what this node refuses: 403, over quota, a host-path mount
    from a non-admin, or one outside the allowed roots (--allow-mount) or of the server's own state;
    404, a ``storage:NAME`` the caller has no area of, or an unknown ``dataset:NAME``; 409, the name is in use
    (or reserved), more GPUs than the node has, a `gpu_type` the node has no GPU of (GET
    /api/v1/inventory lists them) or none free of, or a mount source that does not exist on the server."""
    out = services.create_cluster(user, req)
    response.headers["Location"] = location("clusters", out.name)
    return out


@router.get("/clusters/{name}", response_model=schemas.ClusterOut, responses=errors(401, 404))
def get_cluster(services: ServicesDep, name: str, user: CurrentUser) -> schemas.ClusterOut:
    """One cluster with its containers (a deleted one is `Terminating` until it is gone)."""
    return services.get_cluster(user, name)


@router.patch("/clusters/{name}", response_model=schemas.ClusterOut, responses=errors(*BODY, 403, 404, 409))
def scale_cluster(
    services: ServicesDep,
    name: str,
    req: Annotated[schemas.ClusterScale, Body(openapi_examples=_SCALE)],
    user: CurrentUser,
) -> schemas.ClusterOut:
    """Scale: set the total container count (launcher included); 409 while it is being deleted, or for
    more GPUs than the node has."""
    return services.scale_cluster(user, name, req.containers)


@router.delete(
    "/clusters/{name}",
    response_model=schemas.ClusterOut,
    status_code=202,
    responses=merged(errors(401, 404), {202: {"description": "Accepted: the cluster is Terminating"}}),
)
def delete_cluster(services: ServicesDep, name: str, user: CurrentUser) -> schemas.ClusterOut:
    """Delete, asynchronously: answers 202 at once with the cluster in state `Terminating`.

    The reconciler then stops every process of the cluster and removes its containers; until that is
    done the cluster stays readable (GET answers it as `Terminating`, as Kubernetes does), and a
    second DELETE answers 202 again. Once it is gone, GET answers 404 and the name is free."""
    return services.delete_cluster(user, name)


@router.get(
    "/clusters/{name}/hostfile",
    response_class=PlainTextResponse,
    responses=merged(errors(401, 404), {200: {"description": "`host slots=N` lines"}}),
)
def get_hostfile(services: ServicesDep, name: str, user: CurrentUser) -> str:
    """The hostfile every container reads at /etc/mpi/hostfile (text/plain)."""
    return services.hostfile(user, name)


@router.get("/clusters/{name}/events", response_model=list[schemas.EventOut], responses=errors(401, 404))
def list_cluster_events(services: ServicesDep, name: str, user: CurrentUser) -> list[schemas.EventOut]:
    """The cluster's audit trail: who did what when."""
    return services.events(user, name)


@router.get(
    "/clusters/{name}/logs",
    response_class=PlainTextResponse,
    responses=merged(
        errors(401, 404, 409, 503, 504), {200: {"description": "the last 1 MiB of the container's output"}}
    ),
)
async def get_container_logs(
    services: ServicesDep, name: str, user: CurrentUser, container: str | None = None
) -> str:
    """A container's captured output (text/plain; the launcher's unless `container` is given): the
    lines of its last 1 MiB (a log is never read whole)."""
    return await off_loop(lambda: services.container_logs(user, name, container))


@router.post(
    "/clusters/{name}/exec",
    response_class=NdjsonResponse,
    responses=merged(
        errors(*BODY, 403, 404, 409, 429),
        {
            200: {
                "description": "NDJSON lines",
                "content": {NdjsonResponse.media_type: {"schema": EXEC_LINE}},
            }
        },
    ),
)
def exec_command(
    services: ServicesDep,
    name: str,
    req: Annotated[schemas.ExecRequest, Body(openapi_examples=_EXEC)],
    user: CurrentUser,
) -> StreamingResponse:
    """Run a command in the launcher container (or `container`); streams NDJSON (application/x-ndjson):
    ``{"out": TEXT}`` lines, then ``{"exit": CODE}``. 403: not the owner, or host commands are off;
    409: `container` is not one of the cluster's, or it is not Running (or the cluster has no launcher
    yet); 429: the caller has ``--max-exec-streams`` streams open already."""
    return NdjsonResponse(services.exec_stream(user, name, req))


@router.get("/clusters/{name}/usage", response_model=ClusterUsageOut, responses=errors(401, 404))
def get_cluster_usage(
    usage: Annotated[UsageService, Depends(get_usage)], name: str, user: CurrentUser
) -> ClusterUsageOut:
    """CPU, memory and GPU figures of each container now (the owner's and admins' only; 404 for
    others). CPU from the container's cgroup (container backend) or its processes' /proc figures
    (process backend), null where none can be read; GPUs from NVML: on a node without NVML (or with
    virtual GPUs) `gpu_note` says "no GPUs" instead of figures."""
    return usage.for_user(user, name)
