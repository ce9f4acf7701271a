"""`elastrain server`: migrate the database, bootstrap the admin, start the reconciler, serve the API."""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from elastrain.errors import ConfigError
from elastrain.server.tenant_limits import add_tenant_limit_flags

if TYPE_CHECKING:
    from elastrain.backends.api import Backend
    from elastrain.db.session import Database
    from elastrain.server.exec_service import ExecService
    from elastrain.server.inventory import Inventory
    from elastrain.server.settings import ServerSettings

log = logging.getLogger("elastrain.server")
DEFAULT_DATA_DIR = Path("~/.elastrain").expanduser()
SERVER_SWITCH_INTERVAL_S = 0.001  # sys.setswitchinterval while serving (see serve)


SERVER_EPILOG = """\
settings: a flag wins over the environment, which wins over the settings file, which wins over the
default. Each flag's environment variable is named in its help. The settings file (--config FILE or
$ELASTRAIN_CONFIG) holds NAME=VALUE lines with the environment's names (.env syntax: # comments,
optional quotes), e.g.

    ELASTRAIN_DB=postgresql://elastrain:PASSWORD@db.example:5432/elastrain
    ELASTRAIN_SERVER_PORT=8080

A database password goes in $ELASTRAIN_DB or in that file (chmod 600; a readable one is refused),
never in --db: every user on the machine sees a command line in `ps`. The admin token is written to
DATA/admin-token (0600), never printed.
"""


def add_server_parser(sub: argparse._SubParsersAction) -> None:
    """Register `elastrain server` (flag defaults are None: an absent flag leaves env/file/default)."""
    p = sub.add_parser(
        "server",
        help="run the control plane (REST API, reconciler, container backend)",
        epilog=SERVER_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="settings file of NAME=VALUE lines (default: $ELASTRAIN_CONFIG; see below)",
    )
    p.add_argument("--host", help="address to listen on (env ELASTRAIN_SERVER_HOST; default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port to listen on (env ELASTRAIN_SERVER_PORT; default 8080)")
    p.add_argument(
        "--data-dir",
        type=Path,
        help=f"database, tokens, containers (env ELASTRAIN_SERVER_DATA_DIR; default {DEFAULT_DATA_DIR})",
    )
    p.add_argument(
        "--db",
        help="database URL without a password (env ELASTRAIN_DB, where a password may go; default: "
        "sqlite:///DATA/elastrain.db; postgresql://... works)",
    )
    p.add_argument(
        "--gpus",
        metavar="N|MODEL:N,...",
        help="declare N virtual GPUs, or virtual GPUs of named models for gpu_type (A100:2,V100:2) "
        "(env ELASTRAIN_GPUS; default: detected GPUs, else 8 virtual)",
    )
    p.add_argument(
        "--backend",
        choices=("container", "process", "local", "slurm", "kubernetes"),
        help="where containers run: 'container' (podman OCI containers; the default where podman works), "
        "'process' (directories and processes on this machine: isolates nothing, so exec, jobs and "
        "terminals are refused there without --insecure-host-commands; 'local' is its old name), "
        "or 'slurm' (Slurm jobs; SLURM_CONF; default --gpus: its GPUs; exec, jobs and terminals run on "
        "this machine, so they are refused without --insecure-host-commands too), "
        "or 'kubernetes' (pods on a Kubernetes API server: --kubeconfig, --namespace) "
        "(env ELASTRAIN_SERVER_BACKEND)",
    )
    p.add_argument(
        "--kubeconfig",
        type=Path,
        metavar="FILE",
        help="--backend kubernetes: the API server and credentials (env ELASTRAIN_KUBECONFIG; default: "
        "the pod's service account in-cluster, else $KUBECONFIG or ~/.kube/config)",
    )
    p.add_argument(
        "--namespace",
        help="--backend kubernetes: the namespace of every object (env ELASTRAIN_K8S_NAMESPACE; default: "
        "the kubeconfig context's, else the server pod's, else 'default')",
    )
    p.add_argument(
        "--k8s-image-registry",
        metavar="REGISTRY",
        help="--backend kubernetes: the registry the nodes pull elastrain images from, replacing podman's "
        "'localhost/' (env ELASTRAIN_K8S_IMAGE_REGISTRY; default: image names as podman has them)",
    )
    p.add_argument(
        "--k8s-api-url",
        metavar="URL",
        help="--backend kubernetes: this server's API as pods reach it, e.g. http://elastrain.NS.svc:8080 "
        "(env ELASTRAIN_K8S_API_URL; default: http://HOST:PORT as the server listens)",
    )
    p.add_argument(
        "--insecure-host-commands",
        "--insecure-process-backend",  # its old name
        dest="insecure_host_commands",
        action="store_true",
        default=None,
        help="on the process and Slurm backends, allow exec, jobs and portal terminals anyway: they run "
        "as this server's user on this machine and can read its data dir (admin token, database); for "
        "a single trusted user only (env ELASTRAIN_INSECURE_HOST_COMMANDS=1; the old names "
        "--insecure-process-backend / ELASTRAIN_INSECURE_PROCESS_BACKEND work too)",
    )
    for kind, default in (("clusters", "20"), ("containers", "64"), ("gpus", "unlimited")):
        p.add_argument(
            f"--quota-{kind}",
            type=int,
            metavar="N",
            help=f"per-user default limit on {kind} (`elastrain user quota` sets one user's; env "
            f"ELASTRAIN_QUOTA_{kind.upper()}; default {default}; admins are exempt)",
        )
    p.add_argument(
        "--allow-mount",
        action="append",
        type=Path,
        default=None,
        metavar="DIR",
        help="host directory admins' clusters may mount from (repeatable; env ELASTRAIN_ALLOW_MOUNT=DIR:DIR; "
        "default: cwd and home); other users mount their storage areas (storage:NAME:/data)",
    )
    p.add_argument(
        "--storage-root",
        type=Path,
        metavar="DIR",
        help="where users' storage areas live (env ELASTRAIN_STORAGE_ROOT; default DATA-DIR/storage)",
    )
    p.add_argument(
        "--storage-areas-per-user",
        type=int,
        metavar="N",
        help="storage areas one user may have (env ELASTRAIN_STORAGE_AREAS_PER_USER; default 20)",
    )
    p.add_argument(
        "--dataset",
        action="append",
        default=None,
        metavar="NAME=DIR",
        help="a host directory every cluster may mount read-only as dataset:NAME:/TARGET (repeatable; "
        "env ELASTRAIN_DATASET=NAME=DIR,NAME=DIR)",
    )
    p.add_argument(
        "--open-host-port",
        action="append",
        default=None,
        metavar="PORT",
        help="a TCP port of this host that containers may connect to (repeatable; env "
        "ELASTRAIN_OPEN_HOST_PORT=P,P; default none: cluster networks reach no host service)",
    )
    p.add_argument(
        "--container-memory",
        metavar="SIZE",
        help="the memory limit per container of a cluster created without one: a size (4Gi), 'auto' "
        "(half this machine's memory) or 0 (none) (env ELASTRAIN_CONTAINER_MEMORY; default auto)",
    )
    p.add_argument(
        "--drain-seconds",
        type=float,
        help="longest wait for a scaled-down container's workers to leave (their jobs' progress reports "
        "show when they have; a container no job trains on goes at once) (env ELASTRAIN_DRAIN_SECONDS; "
        "default 30)",
    )
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=None,
        metavar="N",
        help="largest request body accepted (413 above it; env ELASTRAIN_MAX_BODY_BYTES; default 1 MiB)",
    )
    p.add_argument(
        "--reconcile-interval",
        type=float,
        help="seconds between reconcile passes (env ELASTRAIN_RECONCILE_INTERVAL; default 0.5)",
    )
    p.add_argument(
        "--metrics-token",
        metavar="TOKEN",
        help="GET /metrics needs `Authorization: Bearer TOKEN` (16+ printable characters); prefer env "
        "ELASTRAIN_METRICS_TOKEN or the settings file, as a flag shows in `ps` (default: /metrics is open)",
    )
    add_tenant_limit_flags(p)
    p.add_argument("-v", "--verbose", action="store_true", help="log reconciler decisions and requests")


def bootstrap_admin(db: Database, data_dir: Path) -> str | None:
    """Create the admin user on first start and write its token to DATA/admin-token (0600)."""
    from sqlalchemy import func, select

    from elastrain.db.models import EventAction, User
    from elastrain.db.repository import add_event, create_user

    token_path = data_dir / "admin-token"
    with db.session() as session:
        if session.scalar(select(func.count()).select_from(User)):
            return token_path.read_text().strip() if token_path.exists() else None
        _user, token = create_user(session, "admin", is_admin=True)
        add_event(session, "server", EventAction.user_created, user="admin", admin=True)
        fd = os.open(token_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        os.chmod(token_path, 0o600)
        return token


def _check_port_free(host: str, port: int) -> None:
    """Refuse early (before printing a token or touching containers) when the port is taken."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise ConfigError(
                f"cannot listen on {host}:{port}: {exc.strerror}; pick another --port"
            ) from None


def resolve_backend(settings: ServerSettings) -> ServerSettings:
    """`settings` with the backend decided: the one named ('local' is the process backend's old name),
    else containers where podman works, else the process backend."""
    from elastrain.backends.podmanctl import podman_works

    backend = settings.backend
    if backend is None:
        backend = "container" if podman_works() else "process"
        if backend == "process":
            print(
                "elastrain server: podman cannot run containers here; using the process backend, "
                "which isolates nothing (install podman and runc for real containers)",
                file=sys.stderr,
                flush=True,
            )
    elif backend == "local":
        backend = "process"
    return settings.model_copy(update={"backend": backend})


def make_backend(settings: ServerSettings, data_dir: Path) -> tuple[Backend, Inventory]:
    """The backend `settings` name (decided by `resolve_backend`) and the GPU inventory."""
    from elastrain.backends.podmanctl import podman_works
    from elastrain.server.inventory import Inventory

    if settings.backend == "slurm":
        from elastrain.backends.slurm import SlurmBackend
        from elastrain.backends.slurmctl import SlurmCommands, SlurmError

        slurm = SlurmBackend(data_dir, commands=SlurmCommands())
        try:  # virtual GPU ids for the policy; Slurm picks the real ones (--gres)
            gpus = settings.gpus if settings.gpus is not None else slurm.slurm.total_gpus()
        except SlurmError as exc:
            raise ConfigError(f"--backend slurm: cannot reach Slurm (SLURM_CONF?): {exc}") from None
        return slurm, Inventory.create(gpus, str(data_dir))
    inventory = Inventory.create(settings.gpus, str(data_dir))
    if settings.backend == "kubernetes":
        return kubernetes_backend(settings, data_dir), inventory
    if settings.backend == "container":
        from elastrain.backends.container import ContainerBackend

        if not podman_works():
            raise ConfigError(
                "--backend container: podman cannot run containers here; install podman and runc "
                "(apt-get install podman runc) or use --backend process"
            )
        from elastrain.backends.egress import HostEgress

        return ContainerBackend(data_dir, egress=HostEgress(tuple(settings.open_host_port))), inventory
    from elastrain.backends.local import LocalBackend

    print(
        "elastrain server: warning: the process backend isolates nothing: a tenant's shell and jobs would "
        "run as the server's user on this machine",
        file=sys.stderr,
        flush=True,
    )
    return LocalBackend(data_dir), inventory


def kubernetes_backend(settings: ServerSettings, data_dir: Path) -> Backend:
    """The Kubernetes backend of `settings`, once the API server answers, the namespace exists and RBAC
    allows what it needs (else a one-line `ConfigError`)."""
    from elastrain.backends.container import server_key
    from elastrain.backends.kubernetes import KubernetesBackend
    from elastrain.backends.kubernetes_client import check_ready, connect

    conn = connect(settings.kubeconfig, settings.namespace)
    check_ready(conn)
    print(f"elastrain server: Kubernetes API {conn.url}, namespace {conn.namespace}", flush=True)
    return KubernetesBackend(
        data_dir,
        conn,
        server_key(data_dir),
        image_registry=settings.k8s_image_registry,
        api_url=settings.k8s_api_url,
    )


def host_commands_policy(settings: ServerSettings) -> bool:
    """Whether tenants may run commands (exec, jobs, portal terminal) on `settings.backend`; says so
    at start-up where they are refused, and warns loudly where --insecure-host-commands lets them run
    as this server's user on this machine (the process and Slurm backends)."""
    from elastrain.server.exec_service import host_commands_refusal
    from elastrain.server.settings import HOST_COMMAND_BACKENDS, host_commands_allowed

    allowed = host_commands_allowed(settings.backend, settings.insecure_host_commands)
    if settings.backend not in HOST_COMMAND_BACKENDS:
        return allowed
    if allowed:
        print(
            f"elastrain server: WARNING: --insecure-host-commands: on the {settings.backend} backend "
            f"every user's exec, jobs and portal terminals run as this server's user (uid {os.getuid()}) "
            "on this machine and can read its data dir (the admin token, the database): use it only "
            "where every user is trusted",
            file=sys.stderr,
            flush=True,
        )
    else:
        print(f"elastrain server: {host_commands_refusal(settings.backend)}", file=sys.stderr, flush=True)
    return allowed


def exec_service_for(settings: ServerSettings, backend: Backend, inventory: Inventory) -> ExecService:
    """The server's one `ExecService` (exec, jobs, portal terminal) on `backend`, with the host-command
    policy of `settings` (`host_commands_policy`: refused on the process and Slurm backends without
    --insecure-host-commands, with a one-line 403 saying how to allow them)."""
    from elastrain.server.exec_service import ExecService, host_commands_refusal
    from elastrain.server.slots import exec_slots

    return ExecService(
        backend,
        inventory,
        host_commands_allowed=host_commands_policy(settings),
        host_commands_refusal=host_commands_refusal(settings.backend),
        streams=exec_slots(settings.max_exec_streams),
    )


def run_server(args: argparse.Namespace) -> int:
    """`elastrain server`: resolve the settings once (flag > environment > settings file > default),
    then serve with them."""
    from elastrain.server.settings import load_settings, scrub_secrets_from_environment

    settings = load_settings(args)
    scrub_secrets_from_environment()  # nothing the server starts inherits ELASTRAIN_DB's password
    return serve(settings, verbose=bool(getattr(args, "verbose", False)))


def serve(settings: ServerSettings, *, verbose: bool = False) -> int:
    """The composition root: build the database, backend, reconciler, services and app from
    `settings`, then run until interrupted; containers keep running when the server stops (a restart
    adopts them)."""
    import uvicorn

    from elastrain.backends.filemodes import private_dir
    from elastrain.db.session import Database
    from elastrain.server import quotas
    from elastrain.server.app import create_app
    from elastrain.server.errors import ApiError
    from elastrain.server.idle_release import IdleRelease
    from elastrain.server.jobs import JobService
    from elastrain.server.limits import resolve_max_body_bytes
    from elastrain.server.membership import JobMembership
    from elastrain.server.mount_sources import parse_datasets
    from elastrain.server.rate import RateLimiter
    from elastrain.server.reconciler import Reconciler
    from elastrain.server.redact import mountinfo_warning
    from elastrain.server.scheduler_step import scheduler_for
    from elastrain.server.services import Services
    from elastrain.server.storage import StorageAreas

    idle = f"{settings.idle_release_after} s" if settings.idle_release_after else "off"
    print(f"elastrain server: scheduler {settings.scheduler}; idle release after {idle}", flush=True)
    if verbose:
        logging.getLogger("elastrain").setLevel(logging.INFO)
    if isinstance(settings.gpus, int) and settings.gpus < 0:
        raise ConfigError("--gpus must be >= 0")
    if not 0 <= settings.port < 65536:
        raise ConfigError(f"--port {settings.port} is not a port number")
    max_body_bytes = resolve_max_body_bytes(settings.max_body_bytes)
    host, port = settings.host, settings.port
    _check_port_free(host, port)
    data_dir = settings.data_dir.expanduser().resolve()
    private_dir(data_dir)  # 0700: the database, tokens and job logs are the server's alone
    roots = [Path(p).expanduser().resolve() for p in settings.allow_mount] or [Path.cwd(), Path.home()]
    for root in roots:
        if not root.is_dir():
            raise ConfigError(f"--allow-mount {root} is not a directory")
    db = Database(settings.db or f"sqlite:///{data_dir / 'elastrain.db'}")
    try:
        db.migrate()
    except Exception as exc:
        first = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"cannot open or migrate the database: {first}") from None
    token = bootstrap_admin(db, data_dir)
    settings = resolve_backend(settings)
    backend, inventory = make_backend(settings, data_dir)
    commands = exec_service_for(settings, backend, inventory)
    membership = JobMembership()
    reconciler = Reconciler(
        db,
        backend,
        inventory,
        interval_s=settings.reconcile_interval,
        drain_s=settings.drain_seconds,
        scheduler=scheduler_for(settings.scheduler),
        membership=membership,
        idle=IdleRelease(settings.idle_release_after, elastic=settings.scheduler != "static"),
    )
    limits = quotas.Limits(settings.quota_clusters, settings.quota_containers, settings.quota_gpus)
    areas = StorageAreas(
        (settings.storage_root or data_dir / "storage").expanduser().resolve(),
        settings.storage_areas_per_user,
    )
    try:
        areas.prepare()
        datasets = parse_datasets(settings.dataset)
    except (ValueError, ApiError) as exc:
        raise ConfigError(f"storage: {exc}") from None
    services = Services(
        db,
        backend,
        inventory,
        reconciler,
        allowed_mount_roots=roots,
        data_dir=data_dir,
        areas=areas,
        datasets=datasets,
        exec_service=commands,
        quota_defaults=limits,
        default_memory_bytes=settings.container_memory_bytes(),
    )
    url = f"http://{host}:{port}"
    local = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    backend.serve_api(host, port)  # containers reach the API through relays to it
    jobs = JobService(
        db,
        backend,
        inventory,
        report_url=f"http://{local}:{port}",
        membership=membership,
        exec_service=commands,
        max_running_jobs=settings.max_running_jobs,
        reports=RateLimiter(settings.report_rate),
    )
    reconciler.hooks.append(jobs.poll)
    reconciler.start_backoff.give_up_after = settings.start_attempts
    reconciler.steps.troubles.append(jobs.files.troubles)  # a job's refused files: its cluster Degraded
    commands.attach_env = jobs.attach_env  # an `elastrain run` started by exec becomes a job
    app = create_app(services, jobs, max_body_bytes=max_body_bytes, settings=settings)
    kind = "real" if inventory.real else "virtual"
    print(f"elastrain server: {url} (API {url}/api/v1, docs {url}/docs)", flush=True)
    print(
        f"elastrain server: data in {data_dir}; {inventory.gpus} {kind} GPUs; {settings.backend} backend",
        flush=True,
    )
    warning = mountinfo_warning(data_dir, areas.root) if settings.backend == "container" else None
    if warning:
        print(f"elastrain server: warning: {warning}", flush=True)
    if token:  # never the token itself: a terminal's scrollback and logs are read by others
        print(f"elastrain server: admin token in {data_dir / 'admin-token'} (0600)", flush=True)
    print(
        f"elastrain server: export ELASTRAIN_URL={url} ELASTRAIN_TOKEN=$(cat {data_dir / 'admin-token'})",
        flush=True,
    )
    reconciler.start()
    try:
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="info" if verbose else "warning",
            access_log=False,  # elastrain.access logs each request (with its id, without query strings)
            # A terminal's keepalive pong queues behind the input the shell has not read yet (the
            # server stops reading a tab whose pty is full: backpressure); a large paste into a busy
            # shell delays it by seconds, so allow a minute before a silent client counts as gone.
            ws_ping_interval=20.0,
            ws_ping_timeout=60.0,
        )
        # The event loop gives up the GIL at each socket call and must win it back from the API's
        # worker threads and the reconciler; at CPython's default 5 ms switch interval every such
        # call can wait 5 ms under load (the GIL convoy), which a request pays dozens of times.
        sys.setswitchinterval(SERVER_SWITCH_INTERVAL_S)
        # Everything imported and built so far lives as long as the server: out of the collector's
        # sight, a full collection no longer walks the ~1M objects of FastAPI, SQLAlchemy and pydantic
        # (it held the GIL 150-230 ms every few seconds under load: every request waited on it).
        gc.collect()
        gc.freeze()
        uvicorn.Server(config).run()
    finally:
        reconciler.stop()
        backend.close()
        db.dispose()
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="elastrain")
    add_server_parser(parser.add_subparsers(dest="cmd", required=True))
    sys.exit(run_server(parser.parse_args()))
