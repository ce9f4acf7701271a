"""Services: what the API routes do, on top of the repository, the backend and the reconciler."""

from __future__ import annotations

import codecs
import dataclasses
import json
import os
import re
import secrets
import select
import signal
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.orm import Session

from elastrain.backends.api import Backend, ContainerSpec
from elastrain.backends.local import HOSTFILE_PATH
from elastrain.db.models import (
    Cluster,
    ClusterState,
    ContainerRole,
    ContainerState,
    Framework,
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
from elastrain.server import quotas, schemas, tokens
from elastrain.server.access_log import note_user
from elastrain.server.create_checks import check_cluster_create
from elastrain.server.errors import Conflict, Forbidden, InvalidRequest, NotFound, checked
from elastrain.server.inventory import Inventory, parse_gpu_ids
from elastrain.server.reconciler import Reconciler, aware, container_spec
from elastrain.server.validation import (
    check_containers,
    check_name,
    format_size,
    parse_mount,
    server_state,
)

EXEC_ID_ENV = "ELASTRAIN_EXEC_ID"  # marks the processes of one exec call, so they can be stopped
_HOSTFILE = "--hostfile /etc/mpi/hostfile"
_EXAMPLES = "/opt/elastrain/examples"
# the command a user of each framework types in the launcher (the framework's own launcher, for real)
LAUNCH_HINTS = {
    Framework.horovod: f"horovodrun -np 2 {_HOSTFILE} python {_EXAMPLES}/horovod_mnist_elastic.py",
    Framework.deepspeed: (
        f"deepspeed {_HOSTFILE} {_EXAMPLES}/deepspeed_train.py --deepspeed_config {_EXAMPLES}/ds_zero2.json"
    ),
    # megatron-core's GPT at tensor parallel 2 x data parallel (processes / 2), on CPU through its shim
    Framework.megatron: f"elastrain run --mode restart {_HOSTFILE} python {_EXAMPLES}/megatron_gpt.py",
    Framework.pytorch: f"elastrain run {_HOSTFILE} python {_EXAMPLES}/mnist_elastic.py   # or torchrun",
    Framework.slurm: "sinfo; sbatch -N 2 job.sh   # or: salloc -N 2 elastrain run --slurm python train.py",
}


def cluster_out(cluster: Cluster) -> schemas.ClusterOut:
    """The API view of a cluster row."""
    mounts = json.loads(cluster.mounts or "[]")
    return schemas.ClusterOut(
        name=cluster.name,
        owner=cluster.owner.name,
        framework=cluster.framework,
        state=cluster.state,
        reason=cluster.reason,
        desired_containers=cluster.desired_containers,
        gpus_per_container=cluster.gpus_per_container,
        shm=format_size(cluster.shm_bytes),
        shm_bytes=cluster.shm_bytes,
        image=cluster.image,
        memory=format_size(cluster.memory_bytes) if cluster.memory_bytes else "",
        cpus=cluster.cpus or 0.0,
        mounts=[f"{m['source']}:{m['target']}" for m in mounts],
        restart_policy=cluster.restart_policy,
        hostfile_generation=cluster.hostfile_generation,
        launch_hint=LAUNCH_HINTS[cluster.framework],
        min_containers=cluster.min_containers or cluster.desired_containers,
        max_containers=cluster.max_containers or cluster.desired_containers,
        priority=cluster.priority or 0,
        size_reason=cluster.size_reason or "",
        created_at=aware(cluster.created_at) or cluster.created_at,
        containers=[
            schemas.ContainerOut(
                name=k.name,
                role=k.role,
                address=k.address,
                gpus=k.gpus,
                gpu_ids=parse_gpu_ids(k.gpu_ids),
                state=k.state,
                reason=k.reason,
                pid=k.pid,
                started_at=aware(k.started_at),
            )
            for k in cluster.containers
        ],
    )


def check_owner(cluster: Cluster, user: User) -> None:
    """Commands run only for the cluster's owner (an admin may see the cluster, not exec into it)."""
    if cluster.owner_id != user.id:
        raise Forbidden(f"only the owner of cluster {cluster.name!r} can run commands in it")


HOST_COMMANDS_REFUSED = (
    "this server runs the process backend, which isolates nothing; exec/terminal/jobs are refused unless "
    "the server is started with --insecure-process-backend (or use --backend container)"
)


def check_host_commands(allowed: bool) -> None:
    """Refuse running a tenant's command (exec, job, terminal) where it would run unisolated on the host
    (the process backend, unless the server was started with --insecure-process-backend)."""
    if not allowed:
        raise Forbidden(HOST_COMMANDS_REFUSED)


def rewrite_command(command: list[str], hostfile: Path, mounts: dict[str, Path]) -> list[str]:
    """Map container paths in `command` to this machine: the hostfile and the mount targets.

    A path is rewritten wherever it starts a word (also inside ``sh -c "..."`` strings or after ``=``).
    """
    out = []
    for arg in command:
        arg = arg.replace(HOSTFILE_PATH, str(hostfile))
        for target, local in mounts.items():
            pattern = r"(?<![\w./-])" + re.escape(target) + r"(?=/|$|[\s'\";:])"
            arg = re.sub(pattern, str(local).replace("\\", "\\\\"), arg)
        out.append(arg)
    return out


def command_for(backend: Backend, spec: ContainerSpec, command: list[str]) -> list[str]:
    """`command` as it must be run: container paths rewritten where the backend runs it on this machine."""
    if not backend.translates_paths:
        return list(command)
    hostfile = backend.container_path(spec.cluster, spec.name, HOSTFILE_PATH)
    mounts = {m.target: backend.container_path(spec.cluster, spec.name, m.target) for m in spec.mounts}
    return rewrite_command(command, hostfile, mounts)


@dataclass
class Services:
    """Every operation of the API; routes only parse, call one of these and serialize."""

    db: Database
    backend: Backend
    inventory: Inventory
    reconciler: Reconciler
    allowed_mount_roots: list[Path] = field(default_factory=list)
    data_dir: Path | None = None  # no mount may expose it (`validation.check_not_protected`)
    on_change: Callable[[], None] | None = None
    attach_env: Callable[[User, str], dict[str, str]] | None = None  # JobService.attach_env
    host_commands_allowed: bool = True  # False: the process backend without --insecure-process-backend

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
        when = "body.token_expires_at" if req.token_expires_at else "body.token_expires_in_days"
        days, at = req.token_expires_in_days, req.token_expires_at
        expires = checked(when, tokens.resolve_expiry, utcnow(), days, at)
        with self.db.session() as session:
            if user_by_name(session, req.name) is not None:
                raise Conflict(f"user {req.name!r} exists already")
            user, token = create_user(session, req.name, req.admin, expires_at=expires)
            add_event(session, actor.name, "user.created", user=req.name, admin=req.admin)
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

    def _check_gpu_total(self, containers: int, gpus: int) -> None:
        """Refuse (409: valid, but not on this node) more GPUs than the node has."""
        if containers * gpus > self.inventory.gpus:
            kind = "real" if self.inventory.real else "virtual"
            raise Conflict(
                f"{containers} containers x {gpus} GPUs = {containers * gpus} GPUs, but this node has "
                f"{self.inventory.gpus} {kind} GPUs; ask for fewer (or start the server with --gpus N)"
            )

    def create_cluster(self, user: User, req: schemas.ClusterCreate) -> schemas.ClusterOut:
        """Validate and record a new cluster; the reconciler starts its containers.

        One 422 names every bad field (`check_cluster_create`); then 403/409 for what this node refuses."""
        state = server_state(self.data_dir, self.db.url)
        valid = check_cluster_create(
            req,
            check_gpu_total=self._check_gpu_total,
            static=self.reconciler.scheduler is None,
            parse_mount=lambda spec: parse_mount(spec, self.allowed_mount_roots, *state),
            resolve_image=self.backend.resolve_image,
        )
        framework, low, high, elastic = valid.framework, valid.low, valid.high, valid.elastic
        shm, memory, policy, mounts, image = valid.shm, valid.memory, valid.policy, valid.mounts, valid.image
        with self.db.session() as session:
            if cluster_by_name(session, req.name) is not None:
                raise Conflict(f"cluster name {req.name!r} is taken; pick another name")
            quotas.check_create(session, user, req.containers, high, req.gpus_per_container)
            cluster = Cluster(
                name=req.name,
                uid=secrets.token_hex(8),
                owner_id=user.id,
                framework=framework,
                desired_containers=req.containers,
                gpus_per_container=req.gpus_per_container,
                shm_bytes=shm,
                image=image,
                memory_bytes=memory,
                cpus=req.cpus,
                mounts=json.dumps([{"source": m.source, "target": m.target} for m in mounts]),
                restart_policy=policy,
                state=ClusterState.Pending,
                reason="starting containers",
                min_containers=low if elastic else None,
                max_containers=high if elastic else None,
                priority=req.priority,
                # with a scheduler, a cluster with GPUs waits for its admission
                admitted=self.reconciler.scheduler is None or req.gpus_per_container == 0,
                size_reason="" if self.reconciler.scheduler is None else "queued for the scheduler",
            )
            session.add(cluster)
            add_event(
                session,
                user.name,
                "cluster.created",
                req.name,
                user.id,
                containers=req.containers,
                gpus_per_container=req.gpus_per_container,
                framework=framework.value,
                min_containers=low,
                max_containers=high,
                priority=req.priority,
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
            if cluster.min_containers is not None and cluster.max_containers is not None:
                low, high = cluster.min_containers, cluster.max_containers
                if not low <= containers <= high:  # the cluster's own bounds: a conflict with its state
                    raise Conflict(
                        f"containers: cluster {name!r} is elastic between {low} and {high} containers "
                        f"(got {containers}); scale within them, or recreate it with other bounds"
                    )
            quotas.check_scale(session, user, cluster, containers)
            before = cluster.desired_containers
            cluster.desired_containers = containers
            cluster.size_reason = f"scaled by {user.name}"
            add_event(session, user.name, "cluster.scaled", name, user.id, before=before, after=containers)
            out = cluster_out(cluster)
        self._changed()
        return out

    def delete_cluster(self, user: User, name: str) -> schemas.ClusterOut:
        """Mark the cluster for deletion; the reconciler stops everything and removes it."""
        with self.db.session() as session:
            cluster = self._get(session, user, name)
            if cluster.state != ClusterState.Terminating:
                cluster.state, cluster.reason = ClusterState.Terminating, "deleting"
                add_event(session, user.name, "cluster.delete_requested", name, user.id)
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
                schemas.EventOut(
                    at=e.at,
                    actor=e.actor,
                    action=e.action,
                    cluster=e.cluster,
                    detail=json.loads(e.detail or "{}"),
                )
                for e in events_for(session, cluster)
            ]

    def container_logs(self, user: User, name: str, container: str | None) -> str:
        """The captured output of a container's init process (the launcher's by default)."""
        with self.db.session() as session:
            cluster = self._get(session, user, name)
            rows = [
                k
                for k in cluster.containers
                if (k.name == container if container else k.role == ContainerRole.launcher)
            ]
            if not rows:
                raise NotFound(f"container {container!r} not found in cluster {name!r}")
        return "".join(self.backend.logs(name, rows[0].name))

    def images(self) -> list[schemas.ImageOut]:
        """The images the backend can run, newest first."""
        try:
            found = self.backend.images()
        except ElastrainError as exc:  # podman failing: say so, as a 4xx-free empty list would hide it
            raise Conflict(f"cannot list images: {exc}") from None
        return [
            schemas.ImageOut(
                name=i.name,
                frameworks=list(i.frameworks),
                size_bytes=i.size_bytes,
                created=i.created,
                description=i.description,
                default_for=list(i.default_for),
            )
            for i in sorted(found, key=lambda i: i.created, reverse=True)
        ]

    def inventory_out(self) -> schemas.InventoryOut:
        """GPU inventory and usage."""
        with self.db.session() as session:
            used = sum(
                k.gpus
                for c in all_clusters(session)
                for k in c.containers
                if k.state != ContainerState.Failed
            )
        return schemas.InventoryOut(
            gpus=self.inventory.gpus, real=self.inventory.real, used=used, free=self.inventory.gpus - used
        )

    # --- exec --------------------------------------------------------------------------------------
    def exec_stream(self, user: User, name: str, req: schemas.ExecRequest) -> Iterator[bytes]:
        """Start the command in the launcher container; returns NDJSON chunks: {"out"}... then {"exit"}."""
        check_host_commands(self.host_commands_allowed)
        with self.db.session() as session:
            cluster = self._get(session, user, name)
            check_owner(cluster, user)
            role_match = [
                k
                for k in cluster.containers
                if (k.name == req.container if req.container else k.role == ContainerRole.launcher)
            ]
            if not role_match and req.container:  # a valid name the cluster lacks (now): not a 404
                raise Conflict(
                    f"container: {req.container!r} is not a container of cluster {name!r} "
                    "(GET the cluster for its containers)"
                )
            if not role_match:
                raise Conflict(f"cluster {name!r} has no launcher container yet; wait and retry")
            row = role_match[0]
            if row.state != ContainerState.Running:
                raise Conflict(f"container {row.name} is {row.state.value}, not Running; wait and retry")
            spec = container_spec(cluster, row, self.inventory.real)
            add_event(
                session, user.name, "cluster.exec", name, user.id, container=row.name, command=req.command
            )
        command = command_for(self.backend, spec, req.command)
        exec_id = secrets.token_hex(8)
        env = {**spec.env, EXEC_ID_ENV: exec_id}
        if self.attach_env is not None:  # an `elastrain run` started this way becomes a job
            env.update(self.attach_env(user, name))
        spec = dataclasses.replace(spec, env=env)
        try:
            proc = self.backend.exec(spec, command)
        except OSError as exc:
            raise InvalidRequest(f"cannot run {command[0]!r}: {exc.strerror}") from None
        backend = self.backend

        def stop() -> None:  # the client went away: stop the command, inside the container too
            backend.stop_processes(spec, EXEC_ID_ENV, exec_id, proc.pid, signal.SIGTERM)

        return _stream(proc, stop)

    def _changed(self) -> None:
        self.reconciler.wake()
        if self.on_change is not None:
            self.on_change()


def _stream(proc: subprocess.Popen[bytes], stop: Callable[[], None]) -> Iterator[bytes]:
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    try:
        while True:
            ready, _w, _x = select.select([fd], [], [], 1.0)
            if not ready:  # a keep-alive blank line: a closed client is noticed and the command stopped
                yield b"\n"
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            text = decoder.decode(chunk)
            if text:
                yield (json.dumps({"out": text}) + "\n").encode()
        code = proc.wait()
        yield (json.dumps({"exit": code}) + "\n").encode()
    finally:
        if proc.poll() is None:
            stop()
            proc.wait()
        proc.stdout.close()
