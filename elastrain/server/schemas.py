"""Pydantic request/response schemas of the REST API (separate from the database models)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, StringConstraints

from elastrain.rendezvous.api import Cause

MAX_DB_INT = 2**63 - 1
"""The largest integer a database column holds (64-bit signed): larger ids/offsets are a 422, not a 500."""
Count = Annotated[int, Field(ge=0, le=MAX_DB_INT)]
"""A non-negative integer stored in the database (step, epoch, bytes, ...)."""
DbInt = Annotated[int, Field(ge=-MAX_DB_INT - 1, le=MAX_DB_INT)]
"""Any integer a 64-bit database column holds."""
MAX_TOKEN_DAYS = 3650
"""The longest an API token may be valid, in days."""


class ErrorOut(BaseModel):
    """Every refusal: a message that says what to fix, and the HTTP status."""

    error: str
    status: int


class UserCreate(BaseModel):
    """Create a user (admin only)."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=63, description="DNS-label user name")
    admin: bool = False
    token_expires_in_days: int | None = Field(
        default=None, ge=1, le=MAX_TOKEN_DAYS, description="the first token expires after this many days"
    )
    token_expires_at: AwareDatetime | None = Field(
        default=None, description="the first token expires then (RFC 3339 with offset; default: never)"
    )


class UserOut(BaseModel):
    """A user; `token` is present only in the answer that created it."""

    name: str
    admin: bool
    token: str | None = None
    token_expires_at: datetime | None = None


TokenName = Annotated[
    str, StringConstraints(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9][A-Za-z0-9._@:+-]*$")
]
"""A token's label: letters, digits and ``._@:+-``."""
QuotaValue = Annotated[int, Field(ge=0, le=1_000_000)]
"""One quota limit (0: none allowed)."""


class TokenCreate(BaseModel):
    """Create an API token: give at most one of `expires_in_days` and `expires_at` (neither: never)."""

    model_config = ConfigDict(extra="forbid")
    name: TokenName = Field(default="token", description="a label to tell tokens apart")
    expires_in_days: int | None = Field(default=None, ge=1, le=MAX_TOKEN_DAYS)
    expires_at: AwareDatetime | None = Field(default=None, description="RFC 3339 with offset, e.g. ...Z")


class TokenOut(BaseModel):
    """An API token's metadata (never the token or its hash); `state`: active, expired or revoked."""

    id: int
    name: str
    state: str
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None = Field(description="updated at most once a minute")


class TokenCreated(TokenOut):
    """A new token: `token` is shown in this answer only."""

    user: str
    token: str


class QuotaPatch(BaseModel):
    """New limits: only the fields sent change; null puts a limit back to the server default."""

    model_config = ConfigDict(extra="forbid")
    clusters: QuotaValue | None = None
    containers: QuotaValue | None = None
    gpus: QuotaValue | None = None


class UserPatch(BaseModel):
    """Change a user (admin only): their quota."""

    model_config = ConfigDict(extra="forbid")
    quota: QuotaPatch


class QuotaOut(BaseModel):
    """Limits per user; null: unlimited (in `quota`) or the server default (in `quota_overrides`)."""

    clusters: int | None
    containers: int | None
    gpus: int | None


class UsageOut(BaseModel):
    """What a user's clusters hold (elastic clusters count at their max_containers)."""

    clusters: int
    containers: int
    gpus: int


class UserDetailOut(BaseModel):
    """A user with their effective quota, its per-user overrides and their usage."""

    name: str
    admin: bool
    created_at: datetime
    quota: QuotaOut
    quota_overrides: QuotaOut
    quota_exempt: bool = Field(description="admins are not held to quotas")
    usage: UsageOut


class ClusterCreate(BaseModel):
    """Create a cluster: one launcher plus `containers - 1` workers."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=200, description="DNS label, e.g. tthvd")
    framework: str = Field(default="horovod", max_length=200)
    containers: int = Field(default=2, description="total containers including the launcher (>= 2)")
    gpus_per_container: int = 0
    shm: str = Field(default="64Mi", max_length=64, description="shared-memory size, e.g. 512Mi or 2Gi")
    image: str = Field(
        default="",
        max_length=255,
        description="image of every container (GET /api/v1/images); default: the framework's image",
    )
    memory: str = Field(default="", max_length=64, description="memory limit per container, e.g. 4Gi")
    cpus: float = Field(default=0.0, ge=0, le=4096, description="CPU limit per container in cores")
    mounts: list[str] = Field(default_factory=list, description="SOURCE:TARGET, SOURCE absolute")
    restart_policy: str = Field(default="Always", max_length=32)
    min_containers: int | None = Field(
        default=None, description="elastic lower bound incl. the launcher (default: containers)"
    )
    max_containers: int | None = Field(
        default=None, description="elastic upper bound incl. the launcher (default: containers)"
    )
    priority: int = Field(
        default=0, ge=-1_000_000, le=1_000_000, description="higher is scheduled first and shrunk last"
    )


class ClusterScale(BaseModel):
    """Change a cluster's container count (launcher included)."""

    model_config = ConfigDict(extra="forbid")
    containers: int


class ContainerOut(BaseModel):
    """One container as observed."""

    name: str
    role: str
    address: str
    gpus: int
    gpu_ids: list[int]
    state: str
    reason: str
    pid: int | None
    started_at: datetime | None


class ClusterOut(BaseModel):
    """A cluster: desired fields, observed state, containers, hostfile generation."""

    name: str
    owner: str
    framework: str
    state: str
    reason: str
    desired_containers: int
    gpus_per_container: int
    shm: str
    shm_bytes: int
    image: str
    memory: str = Field(default="", description="memory limit per container ('' for none)")
    cpus: float = Field(default=0.0, description="CPU limit per container (0 for none)")
    mounts: list[str]
    restart_policy: str
    hostfile_generation: int
    launch_hint: str = Field(description="how to start training from the launcher container")
    min_containers: int = Field(default=0, description="elastic lower bound (launcher included)")
    max_containers: int = Field(default=0, description="elastic upper bound (launcher included)")
    priority: int = 0
    size_reason: str = Field(default="", description="why the cluster has its current size")
    created_at: datetime
    containers: list[ContainerOut]


class ExecRequest(BaseModel):
    """A command to run in the launcher container (or the named one)."""

    model_config = ConfigDict(extra="forbid")
    command: list[str] = Field(min_length=1)
    container: str | None = None


class EventOut(BaseModel):
    """An audit event."""

    at: datetime
    actor: str
    action: str
    cluster: str
    detail: dict[str, object]


class ImageOut(BaseModel):
    """An image clusters can be created from (the ``image`` field of a cluster)."""

    name: str
    frameworks: list[str] = Field(description="the frameworks the image really holds")
    size_bytes: int
    created: str = Field(description="RFC 3339 UTC; empty when unknown")
    description: str = ""


class InventoryOut(BaseModel):
    """The node's GPU inventory."""

    gpus: int
    real: bool
    used: int
    free: int


class JobSubmit(BaseModel):
    """A command to run detached in the cluster's launcher container."""

    model_config = ConfigDict(extra="forbid")
    command: list[str] = Field(min_length=1)


class CheckpointReport(BaseModel):
    """A checkpoint the job published (path as the container sees it)."""

    model_config = ConfigDict(extra="forbid")
    path: str = Field(min_length=1, max_length=4096)
    step: Count
    epoch: Count
    world_size: int = Field(ge=0, le=1_000_000)
    bytes: Count
    write_s: float = Field(ge=0)


class CheckpointOut(CheckpointReport):
    """A checkpoint in a job's list, with when it was reported."""

    at: datetime


class JobProgress(BaseModel):
    """A progress report from a running job (every field optional)."""

    model_config = ConfigDict(extra="forbid")
    step: DbInt | None = None
    epoch: DbInt | None = None
    loss: float | None = None
    samples_per_s: float | None = None
    world_size: int | None = Field(default=None, ge=0, le=1_000_000)
    hosts: list[Annotated[str, StringConstraints(min_length=1, max_length=253)]] | None = Field(
        default=None, max_length=4096, description="the hosts the job trains on now (drains wait for it)"
    )
    checkpoint: CheckpointReport | None = None


class JobAttach(BaseModel):
    """`elastrain run` typed in a launcher container's terminal registers itself as a job."""

    model_config = ConfigDict(extra="forbid")
    command: list[Annotated[str, StringConstraints(max_length=4096)]] = Field(min_length=1, max_length=1024)
    pid: int = Field(gt=0, lt=2**31, description="the `elastrain run` process (its liveness is the job's)")


class JobAttached(BaseModel):
    """What an attached job needs: its id, its report token and where to write its log and exit code."""

    id: int
    report_url: str
    report_token: str
    log_path: str
    exit_path: str


class JobIncident(BaseModel):
    """A generation change of a running job, as `elastrain run` records it (see rendezvous.incidents)."""

    model_config = ConfigDict(extra="forbid")
    generation: Count
    cause: Cause
    world_size: int = Field(ge=0, le=1_000_000)
    start_step: Count
    steps_lost: Count
    detect_s: float = Field(ge=0)
    recover_s: float | None = Field(default=None, ge=0)
    samples_replayed: Count | None = None
    fault_at: float | None = None
    detected_at: float | None = None
    formed_at: float | None = None
    first_step_at: float | None = None


class JobOut(BaseModel):
    """A job: command, status and its last reported progress."""

    id: int
    cluster: str
    command: list[str]
    status: str
    pid: int | None
    exit_code: int | None
    step: int | None
    epoch: int | None
    loss: float | None
    samples_per_s: float | None
    world_size: int | None
    created_at: datetime
    finished_at: datetime | None
