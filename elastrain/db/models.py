"""SQLAlchemy 2 models of the control plane: users and tokens, clusters, containers, jobs, events."""

from __future__ import annotations

import enum
from datetime import datetime, timezone

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Enum,
    Float,
    ForeignKey,
    Integer,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


def utcnow() -> datetime:
    """The current time, timezone-aware UTC."""
    return datetime.now(timezone.utc)


def _utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


class UtcDateTime(TypeDecorator[datetime]):
    """A timestamp stored and read back as zone-aware UTC on every database: ``timestamp with time
    zone`` on PostgreSQL; SQLite, which has no zone type, keeps the UTC wall time (same DDL as
    ``DateTime(timezone=True)``, so no migration). A naive value written is taken as UTC."""

    impl = DateTime
    cache_ok = True

    def __init__(self) -> None:
        super().__init__(timezone=True)

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        """UTC before it is stored (SQLite would keep another zone's wall time as if it were UTC)."""
        return _utc(value)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        """Zone-aware UTC, also from SQLite."""
        return _utc(value)


class Framework(str, enum.Enum):
    """The training framework a cluster is set up for (launcher command template, hostfile flavour)."""

    horovod = "horovod"
    deepspeed = "deepspeed"
    megatron = "megatron"
    pytorch = "pytorch"
    slurm = "slurm"


class ClusterState(str, enum.Enum):
    """Lifecycle of a cluster as a whole."""

    Pending = "Pending"
    Running = "Running"
    Degraded = "Degraded"  # its reconcile steps hang, or its files are refused: the others go on
    Terminating = "Terminating"


class RestartPolicy(str, enum.Enum):
    """What the reconciler does with a container whose process died."""

    Always = "Always"
    Never = "Never"


class ContainerRole(str, enum.Enum):
    """A cluster has one launcher and one or more workers."""

    launcher = "launcher"
    worker = "worker"


class ContainerState(str, enum.Enum):
    """Lifecycle of one container."""

    Pending = "Pending"
    Running = "Running"
    Paused = "Paused"  # frozen (podman pause, a cgroup freeze): alive, its processes stopped; not an exit
    Failed = "Failed"
    Terminating = "Terminating"


class JobStatus(str, enum.Enum):
    """Lifecycle of a submitted job."""

    Pending = "Pending"
    Running = "Running"
    Succeeded = "Succeeded"
    Failed = "Failed"
    Cancelled = "Cancelled"


class EventAction(str, enum.Enum):
    """What an audit event records, as ``object.verb``: every action the control plane emits.

    Stored as its value in ``events.action`` (a plain string column: a row written by another version
    of the server may hold an action this one does not know; the API answers it as `unknown`)."""

    cluster_created = "cluster.created"
    cluster_scaled = "cluster.scaled"
    cluster_exec = "cluster.exec"
    cluster_delete_requested = "cluster.delete_requested"
    cluster_deleted = "cluster.deleted"
    cluster_admitted = "cluster.admitted"
    cluster_rescheduled = "cluster.rescheduled"
    cluster_preempted = "cluster.preempted"
    cluster_idle_released = "cluster.idle_released"
    cluster_pending = "cluster.pending"
    cluster_running = "cluster.running"
    cluster_degraded = "cluster.degraded"
    container_created = "container.created"
    container_running = "container.running"
    container_paused = "container.paused"
    container_failed = "container.failed"
    container_terminating = "container.terminating"
    container_removed = "container.removed"
    container_orphan_stopped = "container.orphan_stopped"
    hostfile_written = "hostfile.written"
    reconcile_failed = "reconcile.failed"
    job_submitted = "job.submitted"
    job_attached = "job.attached"
    job_cancelled = "job.cancelled"
    job_checkpoint = "job.checkpoint"
    job_incident = "job.incident"
    job_restarted = "job.restarted"
    token_created = "token.created"
    token_revoked = "token.revoked"
    user_created = "user.created"
    user_quota_changed = "user.quota_changed"
    storage_created = "storage.created"
    storage_deleted = "storage.deleted"
    unknown = "unknown"
    """Never recorded: how the API answers a stored action this server does not know (the stored name
    is then in the event's ``detail.action``)."""

    @classmethod
    def of_cluster_state(cls, state: ClusterState) -> EventAction:
        """The event of a cluster entering `state` (Terminating: only a delete request does that)."""
        return {
            ClusterState.Pending: cls.cluster_pending,
            ClusterState.Running: cls.cluster_running,
            ClusterState.Degraded: cls.cluster_degraded,
            ClusterState.Terminating: cls.cluster_delete_requested,
        }[state]


def _enum(cls: type[enum.Enum], name: str) -> Enum:
    return Enum(cls, name=name, native_enum=False, length=32, validate_strings=True)


class Base(DeclarativeBase):
    """Declarative base of every control-plane table."""


class User(Base):
    """An API user; admins may create other users."""

    __tablename__ = "users"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(63), unique=True)
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    # migration 0006: per-user quotas (None: the server default, elastrain.server.quotas)
    quota_clusters: Mapped[int | None] = mapped_column(Integer, nullable=True)
    quota_containers: Mapped[int | None] = mapped_column(Integer, nullable=True)
    quota_gpus: Mapped[int | None] = mapped_column(Integer, nullable=True)
    tokens: Mapped[list[ApiToken]] = relationship(back_populates="user", cascade="all, delete-orphan")


class ApiToken(Base):
    """A bearer token, stored only as its SHA-256 hash; expired or revoked, it authenticates nobody."""

    __tablename__ = "api_tokens"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    # migration 0006: a label, expiry (None: never), revocation and last use (updated at most once a minute)
    name: Mapped[str] = mapped_column(String(63), default="")
    expires_at: Mapped[datetime | None] = mapped_column(UtcDateTime(), nullable=True)
    revoked_at: Mapped[datetime | None] = mapped_column(UtcDateTime(), nullable=True)
    last_used_at: Mapped[datetime | None] = mapped_column(UtcDateTime(), nullable=True)
    user: Mapped[User] = relationship(back_populates="tokens")


class Cluster(Base):
    """Desired state of a training cluster (the reconciler makes the backend match it)."""

    __tablename__ = "clusters"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(63), unique=True)
    uid: Mapped[str] = mapped_column(String(32), unique=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    framework: Mapped[Framework] = mapped_column(_enum(Framework, "framework"))
    desired_containers: Mapped[int] = mapped_column(Integer)
    gpus_per_container: Mapped[int] = mapped_column(Integer, default=0)
    shm_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    image: Mapped[str] = mapped_column(String(255), default="local")
    mounts: Mapped[str] = mapped_column(Text, default="[]")
    restart_policy: Mapped[RestartPolicy] = mapped_column(
        _enum(RestartPolicy, "restart_policy"), default=RestartPolicy.Always
    )
    hostfile_generation: Mapped[int] = mapped_column(Integer, default=0)
    hostfile_text: Mapped[str] = mapped_column(Text, default="")
    state: Mapped[ClusterState] = mapped_column(
        _enum(ClusterState, "cluster_state"), default=ClusterState.Pending
    )
    reason: Mapped[str] = mapped_column(Text, default="")
    next_index: Mapped[int] = mapped_column(Integer, default=0)
    # migration 0003: elastic bounds (None: fixed at desired_containers), priority, scheduler state
    min_containers: Mapped[int | None] = mapped_column(Integer, nullable=True)
    max_containers: Mapped[int | None] = mapped_column(Integer, nullable=True)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    admitted: Mapped[bool] = mapped_column(Boolean, default=True)  # False: the scheduler holds it queued
    size_reason: Mapped[str] = mapped_column(Text, default="")  # why it has its current size
    # migration 0004: per-container limits (0: none)
    memory_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    cpus: Mapped[float] = mapped_column(Float, default=0.0)
    # migration 0009: the GPU model its containers need (None: any), as the node's inventory names it
    gpu_type: Mapped[str | None] = mapped_column(String(128), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    # migration 0008: the elastic scheduler's memory and idle release (see elastrain.server.scheduling)
    requested_containers: Mapped[int | None] = mapped_column(Integer, nullable=True)  # create/scale
    idle_release_after: Mapped[int | None] = mapped_column(Integer, nullable=True)  # None: server default
    idle_released: Mapped[bool] = mapped_column(Boolean, default=False)  # workers released, launcher kept
    active_at: Mapped[datetime | None] = mapped_column(UtcDateTime(), nullable=True)  # last scale/submit
    attained_gpu_s: Mapped[float] = mapped_column(Float, default=0.0)  # GPU-seconds up to service_since
    service_since: Mapped[datetime | None] = mapped_column(UtcDateTime(), nullable=True)
    containers: Mapped[list[Container]] = relationship(
        back_populates="cluster", cascade="all, delete-orphan", order_by="Container.id"
    )
    owner: Mapped[User] = relationship()


class Container(Base):
    """One container of a cluster: its address, GPUs and observed state."""

    __tablename__ = "containers"
    __table_args__ = (UniqueConstraint("cluster_id", "name"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    cluster_id: Mapped[int] = mapped_column(ForeignKey("clusters.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(80))
    role: Mapped[ContainerRole] = mapped_column(_enum(ContainerRole, "container_role"))
    address: Mapped[str] = mapped_column(String(15), unique=True)
    gpus: Mapped[int] = mapped_column(Integer, default=0)
    gpu_ids: Mapped[str] = mapped_column(String(255), default="")
    state: Mapped[ContainerState] = mapped_column(
        _enum(ContainerState, "container_state"), default=ContainerState.Pending
    )
    reason: Mapped[str] = mapped_column(Text, default="")
    pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    started_at: Mapped[datetime | None] = mapped_column(UtcDateTime(), nullable=True)
    terminating_since: Mapped[datetime | None] = mapped_column(UtcDateTime(), nullable=True)
    cluster: Mapped[Cluster] = relationship(back_populates="containers")


class Job(Base):
    """A command run detached in a cluster's launcher container, with its last reported progress."""

    __tablename__ = "jobs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    cluster_id: Mapped[int] = mapped_column(ForeignKey("clusters.id", ondelete="CASCADE"), index=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    command: Mapped[str] = mapped_column(Text)
    status: Mapped[JobStatus] = mapped_column(_enum(JobStatus, "job_status"), default=JobStatus.Pending)
    pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    step: Mapped[int | None] = mapped_column(Integer, nullable=True)
    epoch: Mapped[int | None] = mapped_column(Integer, nullable=True)
    loss: Mapped[float | None] = mapped_column(Float, nullable=True)
    samples_per_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    world_size: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime(), nullable=True)
    report_token_hash: Mapped[str | None] = mapped_column(String(64), nullable=True)  # migration 0002
    log_path: Mapped[str] = mapped_column(Text, default="")  # migration 0002
    tensorboard_dir: Mapped[str | None] = mapped_column(Text, nullable=True)  # migration 0007
    # surviving the launcher (server/job_recovery.py); migration 0011
    launcher_pid: Mapped[int | None] = mapped_column(Integer, nullable=True)  # the launcher it runs in
    coordinator_port: Mapped[int | None] = mapped_column(Integer, nullable=True)  # `elastrain run` jobs
    restart_secret: Mapped[str | None] = mapped_column(String(64), nullable=True)  # its tokens derive from it
    platform_restarts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    max_platform_restarts: Mapped[int] = mapped_column(Integer, default=3, server_default="3")
    user_restarts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    max_user_restarts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


class JobMetric(Base):
    """One progress report of a job (the time series behind the job's last values)."""

    __tablename__ = "job_metrics"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    step: Mapped[int | None] = mapped_column(Integer, nullable=True)
    epoch: Mapped[int | None] = mapped_column(Integer, nullable=True)
    loss: Mapped[float | None] = mapped_column(Float, nullable=True)
    samples_per_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    world_size: Mapped[int | None] = mapped_column(Integer, nullable=True)
    scalars: Mapped[str | None] = mapped_column(Text, nullable=True)  # JSON {name: value}; migration 0007


class Event(Base):
    """Audit trail: who (a user name, or ``reconciler``) did what to which object, when."""

    __tablename__ = "events"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow, index=True)
    actor: Mapped[str] = mapped_column(String(63))
    action: Mapped[str] = mapped_column(String(63))
    cluster: Mapped[str] = mapped_column(String(63), default="", index=True)
    owner_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)
    # migration 0005: the uid of the cluster (names are reused after a delete; lookups key on uid + owner)
    cluster_uid: Mapped[str] = mapped_column(String(32), default="", index=True)
    detail: Mapped[str] = mapped_column(Text, default="")
