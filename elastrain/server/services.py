"""Services: what the API routes do, on top of the repository, the backend and the reconciler."""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.orm import Session

from elastrain.backends.api import Backend
from elastrain.backends.tenant_files import LOG_LIMIT
from elastrain.db.models import (
    Cluster,
    ClusterState,
    ContainerRole,
    ContainerState,
    EventAction,
    User,
    utcnow,
)
from elastrain.db.repository import (
    add_event,
    all_clusters,
    cluster_by_name,
    create_user,
    events_for,
    find_cluster,
    user_by_name,
    visible_clusters,
)
from elastrain.db.session import Database
from elastrain.errors import ElastrainError
from elastrain.server import quotas, redact, schemas, tokens
from elastrain.server.access_log import note_user
from elastrain.server.bounded import BoundedCalls
from elastrain.server.cluster_views import cluster_out
from elastrain.server.create_checks import check_cluster_create, check_name_free
from elastrain.server.errors import ApiError, Conflict, Forbidden, NotFound, checked
from elastrain.server.exec_service import ExecService
from elastrain.server.gpu_types import free_of_type
from elastrain.server.inventory import Inventory, parse_gpu_ids
from elastrain.server.mount_sources import MountSources
from elastrain.server.reconciler import Reconciler, tenant_uid
from elastrain.server.scheduling import fold_service
from elastrain.server.storage import StorageAreas
from elastrain.server.storage_service import StorageService
from elastrain.server.validation import check_containers, check_name, server_state

LOG_READ_DEADLINE_S = 30.0  # `podman logs` of a log of hundreds of MiB, kept to its tail


@dataclass
class Services:
    """Every operation of the API; routes only parse, call one of these and serialize."""

    db: Database
    backend: Backend
    inventory: Inventory
    reconciler: Reconciler
    allowed_mount_roots: list[Path] = field(default_factory=list)  # of admins' host-path mounts
    data_dir: Path | None = None  # no mount may expose it (`validation.check_not_protected`)
    areas: StorageAreas | None = None  # users' storage areas; default: under data_dir/storage
    storage: StorageService | None = field(init=False, default=None)  # the API's operations on `areas`
    datasets: dict[str, Path] = field(default_factory=dict)  # admin-declared, mounted read-only
    on_change: Callable[[], None] | None = None
    exec_service: ExecService | None = None  # default: one on `backend` (`main` shares one with the jobs)
    quota_defaults: quotas.Limits | None = None  # per-user limits (settings); None: the module defaults
    default_memory_bytes: int = 0  # a new cluster's memory limit per container when it asks for none
    log_reads: BoundedCalls = field(
        default_factory=lambda: BoundedCalls(
            "reads of container logs", LOG_READ_DEADLINE_S, per_key=2, total=8
        )
    )

    def __post_init__(self) -> None:
        if self.exec_service is None:
            self.exec_service = ExecService(self.backend, self.inventory)
        if self.areas is None and self.data_dir is not None:
            self.areas = StorageAreas(self.data_dir / "storage")
        self.storage = None if self.areas is None else StorageService(self.db, self.areas, self.area_owner)
        redact.register(self.data_dir, None if self.areas is None else self.areas.root)

    def area_owner(self, user_id: int) -> int | None:
        """The uid `user_id`'s storage areas belong to: their uid in containers (None: the backend runs
        commands as the server's user, so the areas stay the server's)."""
        return None if self.backend.translates_paths else tenant_uid(user_id)

    @property
    def storage_areas(self) -> StorageService:
        """The storage-area operations (409 when the server has no storage root)."""
        if self.storage is None:
            raise Conflict("this server keeps no storage areas (it was started without a data directory)")
        return self.storage

    @property
    def commands(self) -> ExecService:
        """Where tenants' commands go (exec, jobs, terminals)."""
        assert self.exec_service is not None
        return self.exec_service

    # --- users -------------------------------------------------------------------------------------
    def authenticate(self, session: Session, token: str) -> User | None:
        """The user owning `token` (None for an unknown token; `Unauthorized`, saying why, for an
        expired or revoked one). A found user is noted for the request's access-log line."""
        user = tokens.authenticate(session, token)
        if user is not None:
            note_user(user.name)
        return user

    def create_user(self, actor: User, req: schemas.UserCreate) -> schemas.UserOut:
        """Create a user and their first token (admins only)."""
        if not actor.is_admin:
            raise Forbidden("only an admin can create users")
        checked("body.name", check_name, req.name, "user name")
        expires = tokens.checked_expiry(utcnow(), req.token_expires_in_days, req.token_expires_at, "token_")
        with self.db.session() as session:
            if user_by_name(session, req.name) is not None:
                raise Conflict(f"user {req.name!r} exists already")
            user, token = create_user(session, req.name, req.admin, expires_at=expires)
            add_event(session, actor.name, EventAction.user_created, user=req.name, admin=req.admin)
            return schemas.UserOut(name=user.name, admin=user.is_admin, token=token, token_expires_at=expires)

    # --- clusters ----------------------------------------------------------------------------------
    def _get(self, session: Session, user: User, name: str) -> Cluster:
        cluster = find_cluster(session, user, name)
        if cluster is None:
            raise NotFound(f"cluster {name!r} not found")
        return cluster

    def list_clusters(self, user: User) -> list[schemas.ClusterOut]:
        """The caller's clusters."""
        with self.db.session() as session:
            return [cluster_out(c) for c in visible_clusters(session, user)]

    def get_cluster(self, user: User, name: str) -> schemas.ClusterOut:
        """One of the caller's clusters (404 for others')."""
        with self.db.session() as session:
            return cluster_out(self._get(session, user, name))

    def _check_gpu_total(self, containers: int, gpus: int, gpu_type: str | None = None) -> None:
        """Refuse (409: valid, but not on this node) more GPUs than the node has (of model `gpu_type`:
        more than it has, or can free, of that model)."""
        if gpu_type is not None:
            self._check_gpu_type_free(containers * gpus, gpu_type)
        elif containers * gpus > self.inventory.gpus:
            kind = "real" if self.inventory.real else "virtual"
            raise Conflict(
                f"{containers} containers x {gpus} GPUs = {containers * gpus} GPUs, but this node has "
                f"{self.inventory.gpus} {kind} GPUs; ask for fewer (or start the server with --gpus N)"
            )

    def _check_gpu_type_total(self, need: int, gpu_type: str) -> None:
        """Refuse (409) `need` GPUs of model `gpu_type` when the node has fewer of it."""
        have = self.inventory.count(gpu_type)
        if need > have:
            raise Conflict(
                f"{need} {gpu_type} GPU(s) needed, but this node has {have} of that model "
                "(GET /api/v1/inventory); ask for fewer containers, or null for any GPU type"
            )

    def _check_gpu_type_free(self, need: int, gpu_type: str) -> None:
        """Refuse (409) `need` GPUs of model `gpu_type` when the node has fewer of it, or fewer free."""
        self._check_gpu_type_total(need, gpu_type)
        have = self.inventory.count(gpu_type)
        with self.db.session() as session:
            clusters = all_clusters(session)
            free = free_of_type(clusters, self.inventory, gpu_type, self.reconciler.scheduler is not None)
        if need > free:
            raise Conflict(
                f"{need} {gpu_type} GPU(s) needed, but {free} of this node's {have} are free now (the "
                "others are held by other clusters); retry when one is deleted, or ask for fewer or any type"
            )

    def create_cluster(self, user: User, req: schemas.ClusterCreate) -> schemas.ClusterOut:
        """Validate and record a new cluster; the reconciler starts its containers.

        One 422 names every bad field (`check_cluster_create`); then 403/409 for what this node refuses."""
        sources = MountSources(
            self.storage_areas.areas,
            self.datasets,
            self.allowed_mount_roots,
            *server_state(self.data_dir, self.db.url),
        )
        valid = check_cluster_create(
            req,
            check_gpu_total=self._check_gpu_total,
            static=self.reconciler.scheduler is None,
            parse_mount=lambda spec: sources.resolve(user, spec),
            resolve_image=self.backend.resolve_image,
            gpu_models=self.inventory.gpu_models,
        )
        framework, low, high, elastic = valid.framework, valid.low, valid.high, valid.elastic
        shm, memory, policy, mounts, image = valid.shm, valid.memory, valid.policy, valid.mounts, valid.image
        with self.db.session() as session:
            quotas.lock_owner(session, user.id)  # first: the name and quota checks see every commit
            check_name_free(req.name, cluster_by_name(session, req.name), user)
            quotas.check_create(
                session, user, req.containers, high, req.gpus_per_container, self.quota_defaults
            )
            cluster = Cluster(
                name=req.name,
                uid=secrets.token_hex(8),
                owner_id=user.id,
                framework=framework,
                desired_containers=req.containers,
                gpus_per_container=req.gpus_per_container,
                shm_bytes=shm,
                image=image,
                memory_bytes=memory or self.default_memory_bytes or 0,
                cpus=req.cpus,
                mounts=json.dumps(
                    [sources.record(spec, m) for spec, m in zip(req.mounts, mounts, strict=True)]
                ),
                restart_policy=policy,
                state=ClusterState.Pending,
                reason="starting containers",
                min_containers=low if elastic else None,
                max_containers=high if elastic else None,
                priority=req.priority,
                requested_containers=req.containers,
                idle_release_after=req.idle_release_after,
                active_at=utcnow(),
                gpu_type=valid.gpu_type,
                # with a scheduler, a cluster with GPUs waits for its admission
                admitted=self.reconciler.scheduler is None or req.gpus_per_container == 0,
                size_reason="" if self.reconciler.scheduler is None else "queued for the scheduler",
            )
            session.add(cluster)
            add_event(
                session,
                user.name,
                EventAction.cluster_created,
                req.name,
                user.id,
                containers=req.containers,
                gpus_per_container=req.gpus_per_container,
                framework=framework.value,
                min_containers=low,
                max_containers=high,
                priority=req.priority,
                gpu_type=valid.gpu_type,
            )
            session.flush()
            session.refresh(cluster)
            out = cluster_out(cluster)
        self._changed()
        return out

    def scale_cluster(self, user: User, name: str, containers: int) -> schemas.ClusterOut:
        """Set the desired container count."""
        checked("body.containers", check_containers, containers)
        with self.db.session() as session:
            cluster = self._get(session, user, name)
            if cluster.state == ClusterState.Terminating:
                raise Conflict(f"cluster {name!r} is being deleted")
            checked("body.containers", self._check_gpu_total, containers, cluster.gpus_per_container)
            if cluster.gpu_type is not None:
                self._check_gpu_type_total(containers * cluster.gpus_per_container, cluster.gpu_type)
            if cluster.min_containers is not None and cluster.max_containers is not None:
                low, high = cluster.min_containers, cluster.max_containers
                if not low <= containers <= high:  # the cluster's own bounds: a conflict with its state
                    raise Conflict(
                        f"containers: cluster {name!r} is elastic between {low} and {high} containers "
                        f"(got {containers}); scale within them, or recreate it with other bounds"
                    )
            quotas.check_scale(session, user, cluster, containers, self.quota_defaults)
            before = cluster.desired_containers
            now = utcnow()
            fold_service(cluster, now)  # the elastic scheduler's attained service, up to the change
            cluster.desired_containers = cluster.requested_containers = containers
            cluster.idle_released, cluster.active_at = False, now  # released workers come back
            cluster.size_reason = f"scaled by {user.name}"
            self.reconciler.start_backoff.reset(cluster.uid)  # its owner acted: starts are tried again
            add_event(
                session, user.name, EventAction.cluster_scaled, name, user.id, before=before, after=containers
            )
            out = cluster_out(cluster)
        self._changed()
        return out

    def delete_cluster(self, user: User, name: str) -> schemas.ClusterOut:
        """Mark the cluster for deletion; the reconciler stops everything and removes it."""
        with self.db.session() as session:
            cluster = self._get(session, user, name)
            if cluster.state != ClusterState.Terminating:
                cluster.state, cluster.reason = ClusterState.Terminating, "deleting"
                self.reconciler.start_backoff.reset(cluster.uid)  # a new cluster of its name starts afresh
                add_event(session, user.name, EventAction.cluster_delete_requested, name, user.id)
            out = cluster_out(cluster)
        self._changed()
        return out

    def hostfile(self, user: User, name: str) -> str:
        """The cluster's current hostfile text."""
        with self.db.session() as session:
            cluster = self._get(session, user, name)
            return Reconciler.hostfile_text(cluster)

    def events(self, user: User, name: str) -> list[schemas.EventOut]:
        """The cluster's audit trail."""
        with self.db.session() as session:
            cluster = self._get(session, user, name)
            return [
                schemas.EventOut.stored(e.at, e.actor, e.action, e.cluster, json.loads(e.detail or "{}"))
                for e in events_for(session, cluster)
            ]

    def container_logs(self, user: User, name: str, container: str | None) -> str:
        """The captured output of a container's init process (the launcher's by default): the lines of
        its last `LOG_LIMIT` bytes, read off the request thread with a deadline."""
        with self.db.session() as session:
            cluster = self._get(session, user, name)
            rows = [
                k
                for k in cluster.containers
                if (k.name == container if container else k.role == ContainerRole.launcher)
            ]
            if not rows:
                raise NotFound(f"container {container!r} not found in cluster {name!r}")
        read = rows[0].name
        try:
            return self.log_reads.call(name, lambda: "".join(self.backend.logs(name, read, LOG_LIMIT)))
        except ApiError:
            raise
        except ElastrainError as exc:  # a refused log file, podman failing
            raise Conflict(f"the container's log was not read: {exc}") from None

    def images(self) -> list[schemas.ImageOut]:
        """The images the backend can run, newest first."""
        try:
            found = self.backend.images()
        except ElastrainError as exc:  # podman failing: say so, as a 4xx-free empty list would hide it
            raise Conflict(f"cannot list images: {exc}") from None
        return [
            schemas.ImageOut(
                name=i.name,
                frameworks=schemas.known_frameworks(i.frameworks),
                size_bytes=i.size_bytes,
                created=schemas.rfc3339_or_none(i.created),
                description=i.description,
                default_for=schemas.known_frameworks(i.default_for),
            )
            for i in sorted(found, key=lambda i: i.created, reverse=True)
        ]

    def inventory_out(self) -> schemas.InventoryOut:
        """GPU inventory and usage."""
        with self.db.session() as session:
            held = [
                (k.gpus, parse_gpu_ids(k.gpu_ids))
                for c in all_clusters(session)
                for k in c.containers
                if k.state != ContainerState.Failed
            ]
        used = sum(n for n, _ in held)
        taken = [g for _, ids in held for g in ids]
        models = [
            schemas.GpuModelOut(model=model, gpus=count, free=len(self.inventory.free_ids(taken, model)))
            for model, count in self.inventory.model_counts().items()
        ]
        return schemas.InventoryOut(
            gpus=self.inventory.gpus,
            real=self.inventory.real,
            used=used,
            free=self.inventory.gpus - used,
            gpu_model=self.inventory.gpu_model,
            models=models,
        )

    # --- exec --------------------------------------------------------------------------------------
    def exec_stream(self, user: User, name: str, req: schemas.ExecRequest) -> Iterator[bytes]:
        """Start the command in the launcher container; returns NDJSON chunks: {"out"}... then {"exit"}."""
        with self.db.session() as session:
            cluster, row = self.commands.find(session, user, name, req.container)
            if row is None and req.container:  # a valid name the cluster lacks (now): not a 404
                raise Conflict(
                    f"container: {req.container!r} is not a container of cluster {name!r} "
                    "(GET the cluster for its containers)"
                )
            if row is None:
                raise Conflict(f"cluster {name!r} has no launcher container yet; wait and retry")
            if row.state != ContainerState.Running:
                raise Conflict(f"container {row.name} is {row.state.value}, not Running; wait and retry")
            spec = self.commands.spec(cluster, row)
            add_event(
                session,
                user.name,
                EventAction.cluster_exec,
                name,
                user.id,
                container=row.name,
                command=req.command,
            )
        return self.commands.stream(user, spec, req.command)

    def _changed(self) -> None:
        self.reconciler.wake()
        if self.on_change is not None:
            self.on_change()
