"""Pydantic request/response schemas of the REST API (separate from the database models)."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from datetime import datetime, timezone
from typing import Annotated, Any

from pydantic import (
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    JsonValue,
    StringConstraints,
    model_validator,
)

from elastrain.db.models import (
    ClusterState,
    ContainerRole,
    ContainerState,
    EventAction,
    Framework,
    RestartPolicy,
)
from elastrain.server.event_text import event_sentence
from elastrain.server.fields import (
    MAX_DB_INT,  # re-exported: app.py
    MAX_EPOCH_S,
    Body,
    ClusterName,
    Command,
    ContainerCount,
    ContainerName,
    FrameworkName,
    GpuCount,
    MaxContainers,
    MinContainers,
    MountSpec,
    OptionalSize,
    RestartPolicyName,
    SafeText,
    Size,
    UserName,
    UtcDatetime,
)
from elastrain.server.job_schemas import (  # re-exported: the job routes' models as schemas.JobOut etc.
    CheckpointOut,
    CheckpointReport,
    JobAttach,
    JobAttached,
    JobIncident,
    JobOut,
    JobProgress,
    JobSubmit,
)
from elastrain.server.redact import redact_value

__all__ = [  # re-exported from elsewhere (every model defined below is public as well)
    "MAX_DB_INT",
    "CheckpointOut",
    "CheckpointReport",
    "JobAttach",
    "JobAttached",
    "JobIncident",
    "JobOut",
    "JobProgress",
    "JobSubmit",
]
MAX_TOKEN_DAYS = 3650
"""The longest an API token may be valid, in days."""


def refuse_bool(value: object) -> object:
    """A JSON ``true``/``false`` is no count (pydantic would read it as 1/0); whole floats pass."""
    if isinstance(value, bool):
        raise ValueError("must be an integer, not true/false")
    return value


def at_most_one_of(first: str, second: str) -> dict[str, JsonValue]:
    """JSON Schema keywords for an object in which `first` and `second` are not both non-null (the
    server refuses such a body with 422; null counts as absent)."""
    not_null: JsonValue = {"not": {"type": "null"}}
    return {"not": {"required": [first, second], "properties": {first: not_null, second: not_null}}}


class FieldErrorOut(BaseModel):
    """One bad value of a request: where it is and what is wrong with it."""

    loc: str = Field(description="body.FIELD, query.NAME, path.NAME or header.NAME", examples=["body.name"])
    message: str = Field(examples=["cluster name 'A' is not a DNS label: ..."])


class ErrorOut(BaseModel):
    """Every refusal, as RFC 9457 problem details (media type application/problem+json)."""

    type: str = Field(
        description="a URI naming the kind of problem", examples=["https://elastrain.dev/problems/validation"]
    )
    title: str = Field(description="the kind of problem, for people", examples=["Invalid request"])
    status: int = Field(ge=400, le=599, description="the HTTP status of the answer", examples=[422])
    detail: str = Field(description="one line: what is wrong and how to fix it")
    instance: str = Field(description="the request path", examples=["/api/v1/clusters"])
    errors: list[FieldErrorOut] = Field(
        default_factory=list, description="validation problems (422) only: every bad field, in request order"
    )
    error: str = Field(
        deprecated=True, description="deprecated: the same as `detail` (the old {error, status} shape)"
    )


class UserCreate(Body):
    """Create a user (admin only): give at most one of `token_expires_in_days` and `token_expires_at`."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra=at_most_one_of("token_expires_in_days", "token_expires_at")
    )
    name: UserName = Field(description="DNS-label user name", examples=["alice"])
    admin: bool = False
    token_expires_in_days: int | None = Field(
        default=None, ge=1, le=MAX_TOKEN_DAYS, description="the first token expires after this many days"
    )
    token_expires_at: AwareDatetime | None = Field(
        default=None,
        description="the first token expires then (RFC 3339 with offset; default: never); a time not in "
        f"the future, or over {MAX_TOKEN_DAYS} days ahead, is refused (422)",
    )


class UserOut(BaseModel):
    """A user; `token` is present only in the answer that created it."""

    name: str
    admin: bool
    token: str | None = None
    token_expires_at: UtcDatetime | None = None


TokenName = Annotated[
    str, StringConstraints(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9][A-Za-z0-9._@:+-]*$")
]
"""A token's label: letters, digits and ``._@:+-``."""
QuotaValue = Annotated[int, Field(ge=0, le=1_000_000), BeforeValidator(refuse_bool)]
"""One quota limit (0: none allowed)."""


class TokenCreate(Body):
    """Create an API token: give at most one of `expires_in_days` and `expires_at` (neither: never)."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra=at_most_one_of("expires_in_days", "expires_at")
    )
    name: TokenName = Field(default="token", description="a label to tell tokens apart")
    expires_in_days: int | None = Field(default=None, ge=1, le=MAX_TOKEN_DAYS)
    expires_at: AwareDatetime | None = Field(
        default=None,
        description=f"RFC 3339 with offset, e.g. ...Z; a time not in the future, or over {MAX_TOKEN_DAYS} "
        "days ahead, is refused (422)",
    )


class TokenState(str, enum.Enum):
    """Whether a token authenticates: only an active one does."""

    active = "active"
    expired = "expired"
    revoked = "revoked"


class TokenOut(BaseModel):
    """An API token's metadata (never the token or its hash)."""

    id: int
    name: str
    state: TokenState
    created_at: UtcDatetime
    expires_at: UtcDatetime | None
    revoked_at: UtcDatetime | None
    last_used_at: UtcDatetime | None = Field(description="updated at most once a minute")


class TokenCreated(TokenOut):
    """A new token: `token` is shown in this answer only."""

    user: str
    token: str


class QuotaPatch(Body):
    """New limits: only the fields sent change; null puts a limit back to the server default."""

    model_config = ConfigDict(extra="forbid")
    clusters: QuotaValue | None = None
    containers: QuotaValue | None = None
    gpus: QuotaValue | None = None


class UserPatch(Body):
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
    created_at: UtcDatetime
    quota: QuotaOut
    quota_overrides: QuotaOut
    quota_exempt: bool = Field(description="admins are not held to quotas")
    usage: UsageOut


class ClusterCreate(Body):
    """Create a cluster: one launcher plus `containers - 1` workers."""

    model_config = ConfigDict(extra="forbid")
    name: ClusterName = Field(description="DNS label, e.g. tthvd", examples=["tthvd"])
    framework: FrameworkName = Framework.horovod
    containers: ContainerCount = Field(
        default=2, description="total containers including the launcher (2: one launcher, one worker)"
    )
    gpus_per_container: GpuCount = Field(default=0, description="the node must have them all")
    shm: Size = Field(default="64Mi", description="shared-memory size, e.g. 512Mi or 2Gi")
    image: SafeText = Field(
        default="",
        max_length=255,
        description="image of every container, one of GET /api/v1/images holding the cluster's framework "
        "(another is refused: 422); default: the framework's image",
    )
    memory: OptionalSize = Field(default="", description="memory limit per container, e.g. 4Gi ('': none)")
    cpus: float = Field(
        default=0.0,
        ge=0,
        le=4096,
        description="CPU limit per container in cores: 0 (no limit) or at least 0.01, the smallest the "
        "container runtime honours (a value between: 422)",
        json_schema_extra={"not": {"exclusiveMinimum": 0, "exclusiveMaximum": 0.01}},
    )
    mounts: list[MountSpec] = Field(
        default_factory=list,
        max_length=16,
        description="SOURCE:TARGET without '..'. SOURCE: storage:NAME, one of the caller's storage areas "
        "(GET /api/v1/storage); dataset:NAME, a dataset the admin declared (read-only); or, for admins "
        "only, an absolute host path under the server's --allow-mount roots (never its data directory). "
        "TARGET is absolute, not /, /etc or /var, nor at or under /etc/mpi, /var/log or the platform's "
        "other paths",
        examples=[["storage:mnist:/data"]],
    )
    restart_policy: RestartPolicyName = RestartPolicy.Always
    min_containers: MinContainers | None = Field(
        default=None,
        description="elastic lower bound incl. the launcher (default: 2; the elastic scheduler never "
        "shrinks it below); above containers: refused (422)",
    )
    max_containers: MaxContainers | None = Field(
        default=None,
        description="elastic upper bound incl. the launcher (default: containers); "
        "min_containers <= containers <= max_containers, else refused (422)",
    )
    idle_release_after: int | None = Field(
        default=None,
        ge=0,
        le=10_000_000,
        description="seconds without a running job after which the workers are released (the launcher "
        "stays); 0: never; null: the server's --idle-release-after",
    )
    priority: int = Field(
        default=0, ge=-1_000_000, le=1_000_000, description="higher is scheduled first and shrunk last"
    )
    gpu_type: Annotated[SafeText, StringConstraints(max_length=128)] | None = Field(
        default=None,
        description="the GPU model the containers need, one of the node's (`gpu_model` of GET "
        "/api/v1/inventory, e.g. 'NVIDIA H200'; case aside); null: any. Refused (409) when the node has "
        "no GPU of that model, too few, or too few free; the containers get GPUs of that model only",
        examples=[None],
    )


class ClusterScale(Body):
    """Change a cluster's container count (launcher included)."""

    model_config = ConfigDict(extra="forbid")
    containers: ContainerCount = Field(
        description="total containers including the launcher; an elastic cluster stays within its bounds "
        "(min_containers..max_containers; outside them: 409)"
    )


class ContainerOut(BaseModel):
    """One container as observed."""

    name: str
    role: ContainerRole
    address: str
    gpus: int
    gpu_ids: list[int]
    state: ContainerState
    reason: str
    pid: int | None
    started_at: UtcDatetime | None


class ClusterOut(BaseModel):
    """A cluster: desired fields, observed state, containers, hostfile generation."""

    name: str
    owner: str
    framework: Framework
    state: ClusterState = Field(description="Terminating from a delete until the cluster is gone")
    reason: str
    desired_containers: int
    gpus_per_container: int
    shm: str
    shm_bytes: int
    image: str
    memory: str = Field(default="", description="memory limit per container ('' for none)")
    cpus: float = Field(default=0.0, description="CPU limit per container (0 for none)")
    mounts: list[str]
    restart_policy: RestartPolicy
    hostfile_generation: int
    launch_hint: str = Field(
        description="how to start training from the launcher container with the framework's own launcher; "
        "its worker count is the first job's (`-np N`, or `--min-np A --max-np B` within the bounds)"
    )
    first_job: str = Field(
        default="",
        description="the first job to submit (the portal's job box): `elastrain run` of the shipped "
        "example over the hostfile, with the cluster's worker count or range",
    )
    min_containers: int = Field(default=0, description="elastic lower bound (launcher included)")
    max_containers: int = Field(default=0, description="elastic upper bound (launcher included)")
    priority: int = 0
    size_reason: str = Field(default="", description="why the cluster has its current size")
    idle_release_after: int | None = Field(
        default=None, description="seconds without a job before its workers go (null: the server's)"
    )
    gpu_type: str | None = Field(
        default=None, description="the GPU model its containers get (as the node names it); null: any"
    )
    created_at: UtcDatetime
    containers: list[ContainerOut]


class ExecRequest(Body):
    """A command to run in the launcher container (or the named one)."""

    model_config = ConfigDict(extra="forbid")
    command: Command = Field(examples=[["nvidia-smi"]])
    container: ContainerName | None = Field(default=None, description="default: the launcher")


INCIDENT_TIMES = ("fault_at", "detected_at", "formed_at", "first_step_at")
"""The times of a ``job.incident`` event's detail: stored as the epoch seconds `elastrain run` reports,
answered as RFC 3339 UTC (``...Z``)."""


def epoch_as_rfc3339(value: object) -> object:
    """Epoch seconds as an RFC 3339 UTC timestamp with ``Z`` (microseconds kept); anything else (an
    old row's odd value) unchanged."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= MAX_EPOCH_S:
        return value
    text = datetime.fromtimestamp(value, tz=timezone.utc).isoformat()
    return text.removesuffix("+00:00") + "Z"


class EventOut(BaseModel):
    """An audit event."""

    at: UtcDatetime
    actor: str = Field(description="a user's name, `reconciler`, `scheduler`, `server` or `elastrain run`")
    action: EventAction = Field(
        description="`object.verb`: what happened. `unknown` is never recorded: it is how an event stored "
        "by another version of the server with an action this one does not know is answered (the stored "
        "name is then in `detail.action`)",
        examples=["cluster.created"],
    )
    cluster: str
    detail: dict[str, object] = Field(
        description="the action's particulars (`job`: the job id of a job event); in a `job.incident`, "
        "`fault_at`, `detected_at`, `formed_at` and `first_step_at` are RFC 3339 UTC timestamps"
    )
    text: str = Field(
        default="",
        description="the event as an English sentence, for people (the portal and the CLI show it); "
        "scripts read `action` and `detail`",
        examples=["The scheduler grew it from 2 to 4 containers: grown into 2 idle GPUs."],
    )

    @classmethod
    def stored(
        cls, at: datetime, actor: str, action: str, cluster: str, detail: dict[str, object]
    ) -> EventOut:
        """An event as a row of ``events`` holds it (the action a string, possibly one this server
        does not know)."""
        shown = redact_value(detail)  # no server directory in a reason (`redact`)
        data = {"at": at, "actor": actor, "action": action, "cluster": cluster, "detail": shown}
        return cls.model_validate(data)

    @model_validator(mode="before")
    @classmethod
    def _readable(cls, data: Any) -> Any:
        """A stored action this server does not know becomes `unknown` (its name kept in
        ``detail.action``: no recorded event has a detail called ``action``); a ``job.incident``'s
        epoch-second times become RFC 3339."""
        if not isinstance(data, dict):
            return data
        action, detail = data.get("action"), data.get("detail")
        if not isinstance(detail, dict):
            return data
        if isinstance(action, str) and not data.get("text"):
            data = {**data, "text": event_sentence(action, detail)}
        if isinstance(action, str) and action not in _ACTIONS:
            return {**data, "action": EventAction.unknown, "detail": {**detail, "action": action}}
        if action == EventAction.job_incident:
            times = {k: epoch_as_rfc3339(detail[k]) for k in INCIDENT_TIMES if k in detail}
            return {**data, "detail": {**detail, **times}}
        return data


_ACTIONS = frozenset(a.value for a in EventAction)


def known_frameworks(names: Iterable[str]) -> list[Framework]:
    """The frameworks of `names` clusters can be created with (an image label naming another is left
    out, in order, without repeats)."""
    known = {f.value: f for f in Framework}
    return list(dict.fromkeys(known[n] for n in names if n in known))


def rfc3339_or_none(text: str) -> datetime | None:
    """An image's RFC 3339 creation time, or None when unknown ('') or unreadable."""
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None
    except ValueError:
        return None


class ImageOut(BaseModel):
    """An image clusters can be created from (the ``image`` field of a cluster)."""

    name: str
    frameworks: list[Framework] = Field(description="the frameworks the image really holds")
    size_bytes: int
    created: UtcDatetime | None = Field(description="when the image was built (null when unknown)")
    description: str = ""
    default_for: list[Framework] = Field(
        default_factory=list,
        description="the frameworks whose clusters get this image when the create request names none",
    )


class GpuModelOut(BaseModel):
    """The node's GPUs of one model."""

    model: str = Field(description="as NVML names it (virtual GPUs: as `--gpus MODEL:N` declares it)")
    gpus: int
    free: int = Field(description="not held by any cluster's container now")


class InventoryOut(BaseModel):
    """The node's GPU inventory."""

    gpus: int
    real: bool
    used: int
    free: int
    gpu_model: str = Field(
        default="",
        description="the GPUs' models as NVML names them, or as `--gpus MODEL:N` declares virtual ones "
        "(several: joined by ', '); '' for none: the `gpu_type` a cluster may ask for",
    )
    models: list[GpuModelOut] = Field(
        default_factory=list, description="each named model with its GPUs and how many are free ([]: none)"
    )
