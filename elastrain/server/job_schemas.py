"""Request and response schemas of the job routes (``/api/v1/jobs``, ``/clusters/{name}/jobs``).

`elastrain.server.schemas` re-exports every model here (``schemas.JobOut``).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, WithJsonSchema

from elastrain.db.models import JobStatus
from elastrain.rendezvous.api import Cause
from elastrain.server import validation as checks
from elastrain.server.errors import InvalidRequest
from elastrain.server.fields import (
    Body,
    Command,
    Count,
    DbInt,
    EpochSeconds,
    SafeText,
    UtcDatetime,
    server_check,
)

SCALAR_NAME = r"^[A-Za-z_][A-Za-z0-9_./-]{0,63}$"
MAX_SCALARS = 32
Scalars = Annotated[
    dict[
        Annotated[str, StringConstraints(pattern=SCALAR_NAME)],
        Annotated[float, Field(allow_inf_nan=False, strict=True)],  # strict: no true/false, no "1"
    ],
    Field(max_length=MAX_SCALARS),
    WithJsonSchema(
        {
            "type": "object",
            "maxProperties": MAX_SCALARS,
            "propertyNames": {"maxLength": 64},  # SCALAR_NAME's own bound, for tools that read no regex
            "patternProperties": {SCALAR_NAME: {"type": "number"}},
            "additionalProperties": False,
        }
    ),
]
"""Figures a job reports by name (``accuracy``, ``eval/loss``: TensorBoard tags), finite numbers."""


def _check_container_dir(value: str) -> None:
    checks.check_text(value, "tensorboard_dir")
    if not value.startswith("/"):
        raise InvalidRequest(
            "tensorboard_dir must be an absolute path in the launcher container (e.g. /data/tensorboard/run1)"
        )


ContainerDir = Annotated[
    str,
    StringConstraints(min_length=1, max_length=4096, pattern=f"^/[^{checks.CONTROL}]*$"),
    server_check(_check_container_dir, str),
]
"""An absolute path as the launcher container sees it."""


class JobSubmit(Body):
    """A command to run detached in the cluster's launcher container."""

    model_config = ConfigDict(extra="forbid")
    command: Command = Field(examples=[["python", "/opt/elastrain/examples/mnist_elastic.py"]])
    tensorboard_dir: ContainerDir | None = Field(
        default=None,
        description="write TensorBoard scalars under this directory (a path in the launcher container, "
        "e.g. on the cluster's storage): `elastrain run` in the command writes them there "
        "(ELASTRAIN_TENSORBOARD_DIR), as does `elastrain.report()` in a plain script",
        examples=["/data/tensorboard/run1"],
    )
    retries: int = Field(
        default=0,
        ge=0,
        le=100,
        description="times the command is started again after it exits non-zero (the user's failures, as "
        "Kubernetes' backoffLimit); launcher losses do not count here",
    )
    max_platform_restarts: int = Field(
        default=3,
        ge=0,
        le=100,
        description="times the job is started again after its launcher container died under it (platform "
        "failures); an `elastrain run` job adopts its running workers then (`--rejoin`)",
    )


class CheckpointReport(Body):
    """A checkpoint the job published (path as the container sees it)."""

    model_config = ConfigDict(extra="forbid")
    path: SafeText = Field(min_length=1, max_length=4096)
    step: Count
    epoch: Count
    world_size: int = Field(ge=0, le=1_000_000)
    bytes: Count
    write_s: float = Field(ge=0)


class CheckpointOut(CheckpointReport):
    """A checkpoint in a job's list, with when it was reported."""

    path: str = Field(description="as the container sees it")
    at: UtcDatetime


class JobProgress(Body):
    """A progress report from a running job (every field optional)."""

    model_config = ConfigDict(extra="forbid")
    step: DbInt | None = None
    epoch: DbInt | None = None
    loss: float | None = None
    samples_per_s: float | None = None
    world_size: int | None = Field(default=None, ge=0, le=1_000_000)
    hosts: list[Annotated[SafeText, StringConstraints(min_length=1, max_length=253)]] | None = Field(
        default=None, max_length=256, description="the hosts the job trains on now (drains wait for it)"
    )
    checkpoint: CheckpointReport | None = None
    scalars: Scalars | None = Field(
        default=None,
        max_length=MAX_SCALARS,
        description="other figures the job reports (`elastrain.report(accuracy=0.9)`), by name",
    )


class JobAttach(Body):
    """`elastrain run` typed in a launcher container's terminal registers itself as a job."""

    model_config = ConfigDict(extra="forbid")
    command: Command
    pid: int = Field(gt=0, lt=2**31, description="the `elastrain run` process (its liveness is the job's)")


class JobAttached(BaseModel):
    """What an attached job needs: its id, its report token and where to write its log and exit code."""

    id: int
    report_url: str
    report_token: str
    log_path: str
    exit_path: str


class JobIncident(Body):
    """A generation change of a running job, as `elastrain run` records it (see rendezvous.incidents).

    Its times (``*_at``) are epoch seconds here; the job's events answer them as RFC 3339 UTC."""

    model_config = ConfigDict(extra="forbid")
    generation: Count
    cause: Cause
    world_size: int = Field(ge=0, le=1_000_000)
    start_step: Count
    steps_lost: Count
    detect_s: float = Field(ge=0)
    recover_s: float | None = Field(default=None, ge=0)
    samples_replayed: Count | None = None
    fault_at: EpochSeconds | None = Field(
        default=None, description="when the fault happened, as far as the coordinator can tell"
    )
    detected_at: EpochSeconds | None = Field(
        default=None, description="when the coordinator decided a new generation was needed"
    )
    formed_at: EpochSeconds | None = Field(default=None, description="when the generation formed")
    first_step_at: EpochSeconds | None = Field(
        default=None, description="when the new generation completed its first step"
    )
    restarted: Annotated[bool, Field(strict=True)] | None = Field(  # strict: not 0/1 or "yes"
        default=None,
        description="restart mode (a torchrun-style script): the scripts were restarted for this generation",
    )


class JobResize(BaseModel):
    """A generation change of a job after its start (a resize, or a recovery from a failure)."""

    at: UtcDatetime = Field(description="when the coordinator decided the change (else when it formed)")
    from_world: int = Field(description="workers before")
    to_world: int = Field(description="workers after")
    cause: Cause
    pause_s: float | None = Field(description="from the decision to the first step at the new size")
    restarted_processes: int = Field(
        description="the job's processes started again for it: 0 for an in-place resize (elastrain run, "
        "Horovod, DeepSpeed ZeRO-1/2), every worker for a torchrun-style script in restart mode"
    )


class JobOut(BaseModel):
    """A job: command, status and its last reported progress."""

    id: int
    cluster: str
    command: list[str]
    status: JobStatus
    pid: int | None
    exit_code: int | None
    step: int | None
    epoch: int | None
    loss: float | None
    samples_per_s: float | None
    world_size: int | None
    created_at: UtcDatetime
    finished_at: UtcDatetime | None
    tensorboard_dir: str | None = Field(default=None, description="where its TensorBoard scalars go")
    platform_restarts: int = Field(default=0, description="starts after its launcher container died")
    max_platform_restarts: int = Field(default=3, description="the budget of platform_restarts")
    user_restarts: int = Field(default=0, description="starts after the command exited non-zero")
    max_user_restarts: int = Field(default=0, description="the budget of user_restarts (`retries`)")
    resizes: list[JobResize] | None = Field(
        default=None,
        description="its generation changes after the start, oldest first (GET /jobs/{id}; null in lists)",
    )
