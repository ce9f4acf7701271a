"""`elastrain server`'s settings: flags, environment, a settings file, defaults (in that order).

Every setting has a flag, an environment variable and a key of the settings file::

    --host                      ELASTRAIN_SERVER_HOST          --port             ELASTRAIN_SERVER_PORT
    --data-dir                  ELASTRAIN_SERVER_DATA_DIR      --backend          ELASTRAIN_SERVER_BACKEND
    --db                        ELASTRAIN_DB                   --gpus             ELASTRAIN_GPUS
    --allow-mount               ELASTRAIN_ALLOW_MOUNT (DIR:DIR...; admins' host-path mounts)
    --storage-root              ELASTRAIN_STORAGE_ROOT (default DATA-DIR/storage)
    --storage-areas-per-user    ELASTRAIN_STORAGE_AREAS_PER_USER
    --dataset                   ELASTRAIN_DATASET (NAME=DIR, repeatable; env: comma-separated)
    --open-host-port            ELASTRAIN_OPEN_HOST_PORT (a host TCP port cluster networks may reach;
                                repeatable; env: comma-separated; default none: `backends.egress`)
    --start-attempts            ELASTRAIN_START_ATTEMPTS (refused starts before giving up; default 8)
    --drain-seconds             ELASTRAIN_DRAIN_SECONDS        --max-body-bytes   ELASTRAIN_MAX_BODY_BYTES
    --reconcile-interval        ELASTRAIN_RECONCILE_INTERVAL   --scheduler        ELASTRAIN_SCHEDULER
    --idle-release-after        ELASTRAIN_IDLE_RELEASE_AFTER (seconds; 0: never)
    --insecure-host-commands    ELASTRAIN_INSECURE_HOST_COMMANDS (1/true/yes; the old names
                                --insecure-process-backend / ELASTRAIN_INSECURE_PROCESS_BACKEND work too)
    --quota-clusters            ELASTRAIN_QUOTA_CLUSTERS       --quota-containers ELASTRAIN_QUOTA_CONTAINERS
    --quota-gpus                ELASTRAIN_QUOTA_GPUS   (per-user defaults; `elastrain user quota` overrides)
    --kubeconfig                ELASTRAIN_KUBECONFIG           --namespace        ELASTRAIN_K8S_NAMESPACE
    --k8s-image-registry        ELASTRAIN_K8S_IMAGE_REGISTRY   --k8s-api-url      ELASTRAIN_K8S_API_URL
                                (the kubernetes backend's; see `elastrain.backends.kubernetes`)
    --max-exec-streams          ELASTRAIN_MAX_EXEC_STREAMS     --max-running-jobs ELASTRAIN_MAX_RUNNING_JOBS
    --report-rate               ELASTRAIN_REPORT_RATE          --max-terminals    ELASTRAIN_MAX_TERMINALS
    --max-lab-sockets           ELASTRAIN_MAX_LAB_SOCKETS
    --lab-max-message-bytes     ELASTRAIN_LAB_MAX_MESSAGE_BYTES  (per-user bounds: `.tenant_limits`)
    --metrics-token             ELASTRAIN_METRICS_TOKEN  (GET /metrics then needs ``Authorization: Bearer``
                                it; unset, /metrics is open, as most exporters are)

(host, port, data dir and backend carry ``SERVER_``: ELASTRAIN_HOST, ELASTRAIN_DATA_DIR and
ELASTRAIN_BACKEND already mean other things to workers and examples.) The settings file
(``--config FILE`` or ``ELASTRAIN_CONFIG``) holds ``NAME=VALUE`` lines with the environment's names
(``.env`` syntax: ``#`` comments, optional quotes). A database password belongs in ``ELASTRAIN_DB`` or
in that file (mode 0600), never in ``--db``: a command line is visible to every user in ``ps``; the
metrics token likewise belongs in the environment or that file (``--metrics-token`` is shown in ``ps``).
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import parse_qs, urlsplit

from pydantic import AliasChoices, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from elastrain.backends.egress import parse_ports
from elastrain.errors import ConfigError
from elastrain.server.main import DEFAULT_DATA_DIR
from elastrain.server.quotas import DEFAULT_MAX_CLUSTERS, DEFAULT_MAX_CONTAINERS, DEFAULT_MAX_GPUS
from elastrain.server.start_backoff import GIVE_UP_AFTER
from elastrain.server.storage import DEFAULT_MAX_AREAS
from elastrain.server.tenant_limits import (
    DEFAULT_LAB_MAX_MESSAGE_BYTES,
    DEFAULT_MAX_EXEC_STREAMS,
    DEFAULT_MAX_LAB_SOCKETS,
    DEFAULT_MAX_RUNNING_JOBS,
    DEFAULT_MAX_TERMINALS,
    DEFAULT_REPORT_RATE,
)

CONFIG_ENV = "ELASTRAIN_CONFIG"
DB_ENV = "ELASTRAIN_DB"
METRICS_TOKEN_ENV = "ELASTRAIN_METRICS_TOKEN"
SECRET_FIELDS = ("db", "metrics_token")  # never echoed in an error message
METRICS_TOKEN_IN_ARGV_WARNING = (
    "elastrain server: warning: --metrics-token is visible to every user in `ps`; prefer "
    f"${METRICS_TOKEN_ENV} or the settings file (--config)"
)

# field -> (flag, environment variable / settings-file key)
NAMES: dict[str, tuple[str, str]] = {
    "host": ("--host", "ELASTRAIN_SERVER_HOST"),
    "port": ("--port", "ELASTRAIN_SERVER_PORT"),
    "data_dir": ("--data-dir", "ELASTRAIN_SERVER_DATA_DIR"),
    "db": ("--db", DB_ENV),
    "gpus": ("--gpus", "ELASTRAIN_GPUS"),
    "backend": ("--backend", "ELASTRAIN_SERVER_BACKEND"),
    "allow_mount": ("--allow-mount", "ELASTRAIN_ALLOW_MOUNT"),
    "storage_root": ("--storage-root", "ELASTRAIN_STORAGE_ROOT"),
    "storage_areas_per_user": ("--storage-areas-per-user", "ELASTRAIN_STORAGE_AREAS_PER_USER"),
    "dataset": ("--dataset", "ELASTRAIN_DATASET"),
    "drain_seconds": ("--drain-seconds", "ELASTRAIN_DRAIN_SECONDS"),
    "max_body_bytes": ("--max-body-bytes", "ELASTRAIN_MAX_BODY_BYTES"),
    "reconcile_interval": ("--reconcile-interval", "ELASTRAIN_RECONCILE_INTERVAL"),
    "scheduler": ("--scheduler", "ELASTRAIN_SCHEDULER"),
    "idle_release_after": ("--idle-release-after", "ELASTRAIN_IDLE_RELEASE_AFTER"),
    "insecure_host_commands": ("--insecure-host-commands", "ELASTRAIN_INSECURE_HOST_COMMANDS"),
    "quota_clusters": ("--quota-clusters", "ELASTRAIN_QUOTA_CLUSTERS"),
    "quota_containers": ("--quota-containers", "ELASTRAIN_QUOTA_CONTAINERS"),
    "quota_gpus": ("--quota-gpus", "ELASTRAIN_QUOTA_GPUS"),
    "kubeconfig": ("--kubeconfig", "ELASTRAIN_KUBECONFIG"),
    "namespace": ("--namespace", "ELASTRAIN_K8S_NAMESPACE"),
    "k8s_image_registry": ("--k8s-image-registry", "ELASTRAIN_K8S_IMAGE_REGISTRY"),
    "k8s_api_url": ("--k8s-api-url", "ELASTRAIN_K8S_API_URL"),
    "metrics_token": ("--metrics-token", METRICS_TOKEN_ENV),
    "max_exec_streams": ("--max-exec-streams", "ELASTRAIN_MAX_EXEC_STREAMS"),
    "lab_max_message_bytes": ("--lab-max-message-bytes", "ELASTRAIN_LAB_MAX_MESSAGE_BYTES"),
    "max_running_jobs": ("--max-running-jobs", "ELASTRAIN_MAX_RUNNING_JOBS"),
    "report_rate": ("--report-rate", "ELASTRAIN_REPORT_RATE"),
    "max_terminals": ("--max-terminals", "ELASTRAIN_MAX_TERMINALS"),
    "max_lab_sockets": ("--max-lab-sockets", "ELASTRAIN_MAX_LAB_SOCKETS"),
    "start_attempts": ("--start-attempts", "ELASTRAIN_START_ATTEMPTS"),
    "open_host_port": ("--open-host-port", "ELASTRAIN_OPEN_HOST_PORT"),
    "container_memory": ("--container-memory", "ELASTRAIN_CONTAINER_MEMORY"),
}
OLD_NAMES: dict[str, tuple[str, str]] = {  # field -> its former (flag, environment variable), still accepted
    "insecure_host_commands": ("--insecure-process-backend", "ELASTRAIN_INSECURE_PROCESS_BACKEND"),
}
ENV_TO_FIELD = {env: name for name, (_flag, env) in NAMES.items()} | {
    env: name for name, (_flag, env) in OLD_NAMES.items()
}
HOST_COMMAND_BACKENDS = ("process", "local", "slurm")
"""Backends that run a tenant's commands (exec, jobs, terminal) on this server's machine as its user:
the process backend ('local' is its old name) and Slurm (its containers are jobs of the server's user
and commands run here, on the shared file system)."""


def _env(name: str) -> str:
    return NAMES[name][1]


class ServerSettings(BaseSettings):
    """The resolved settings of one `elastrain server` (see the module docstring for the names), built
    once by `load_settings`; `elastrain.server.main.serve` builds the server from them."""

    model_config = SettingsConfigDict(env_prefix="ELASTRAIN_", env_ignore_empty=True, extra="ignore")

    host: str = Field("127.0.0.1", validation_alias=_env("host"))
    port: int = Field(8080, validation_alias=_env("port"))
    data_dir: Path = Field(DEFAULT_DATA_DIR, validation_alias=_env("data_dir"))
    db: str | None = Field(None, validation_alias=_env("db"))
    # N virtual GPUs, or a spec naming their models (`elastrain.server.inventory.parse_gpu_spec`)
    gpus: int | str | None = Field(None, validation_alias=_env("gpus"))
    backend: Literal["container", "process", "local", "slurm", "kubernetes"] | None = Field(
        None, validation_alias=_env("backend")
    )
    allow_mount: Annotated[list[Path], NoDecode] = Field(
        default_factory=list, validation_alias=_env("allow_mount")
    )
    storage_root: Path | None = Field(None, validation_alias=_env("storage_root"))
    storage_areas_per_user: int = Field(
        DEFAULT_MAX_AREAS, ge=0, validation_alias=_env("storage_areas_per_user")
    )
    dataset: Annotated[list[str], NoDecode] = Field(default_factory=list, validation_alias=_env("dataset"))
    open_host_port: Annotated[list[int], NoDecode] = Field(
        default_factory=list, validation_alias=_env("open_host_port")
    )
    drain_seconds: float = Field(30.0, validation_alias=_env("drain_seconds"))
    max_body_bytes: int | None = Field(None, validation_alias=_env("max_body_bytes"))
    reconcile_interval: float = Field(0.5, validation_alias=_env("reconcile_interval"))
    scheduler: Literal["static", "elastic"] = Field("elastic", validation_alias=_env("scheduler"))
    idle_release_after: int = Field(600, ge=0, validation_alias=_env("idle_release_after"))
    insecure_host_commands: bool = Field(
        False,
        validation_alias=AliasChoices(_env("insecure_host_commands"), OLD_NAMES["insecure_host_commands"][1]),
    )
    quota_clusters: int | None = Field(DEFAULT_MAX_CLUSTERS, ge=0, validation_alias=_env("quota_clusters"))
    quota_containers: int | None = Field(
        DEFAULT_MAX_CONTAINERS, ge=0, validation_alias=_env("quota_containers")
    )
    quota_gpus: int | None = Field(DEFAULT_MAX_GPUS, ge=0, validation_alias=_env("quota_gpus"))
    kubeconfig: Path | None = Field(None, validation_alias=_env("kubeconfig"))
    namespace: str | None = Field(
        None, pattern=r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$", validation_alias=_env("namespace")
    )
    k8s_image_registry: str = Field("", validation_alias=_env("k8s_image_registry"))
    k8s_api_url: str = Field("", pattern=r"^(https?://\S+)?$", validation_alias=_env("k8s_api_url"))
    metrics_token: str | None = Field(
        None, min_length=16, pattern=r"^[\x21-\x7e]+$", validation_alias=_env("metrics_token")
    )
    max_exec_streams: int = Field(DEFAULT_MAX_EXEC_STREAMS, ge=1, validation_alias=_env("max_exec_streams"))
    max_running_jobs: int = Field(DEFAULT_MAX_RUNNING_JOBS, ge=1, validation_alias=_env("max_running_jobs"))
    report_rate: float = Field(DEFAULT_REPORT_RATE, gt=0, validation_alias=_env("report_rate"))
    start_attempts: int = Field(GIVE_UP_AFTER, ge=1, validation_alias=_env("start_attempts"))
    # a cluster created without a memory limit gets this one per container: "auto" (half this machine's
    # memory), a size (4Gi) or "0" (none); `container_memory_bytes` resolves it
    container_memory: str = Field("auto", validation_alias=_env("container_memory"))
    max_terminals: int = Field(DEFAULT_MAX_TERMINALS, ge=1, validation_alias=_env("max_terminals"))
    max_lab_sockets: int = Field(DEFAULT_MAX_LAB_SOCKETS, ge=1, validation_alias=_env("max_lab_sockets"))
    lab_max_message_bytes: int = Field(
        DEFAULT_LAB_MAX_MESSAGE_BYTES, ge=1024, validation_alias=_env("lab_max_message_bytes")
    )

    @field_validator("container_memory")
    @classmethod
    def _memory_size(cls, value: str) -> str:
        """ "auto", "0" or a size the API accepts (refused when the server starts, with the reason)."""
        if value.strip().lower() not in ("auto", "0", "none"):
            from elastrain.server.errors import InvalidRequest
            from elastrain.server.validation import parse_size

            try:
                parse_size(value.strip())
            except InvalidRequest as exc:
                raise ValueError(f"--container-memory: {exc}") from None
        return value.strip()

    def container_memory_bytes(self) -> int:
        """The default memory limit per container in bytes (0: none)."""
        value = self.container_memory.lower()
        if value in ("0", "none"):
            return 0
        if value == "auto":
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
        from elastrain.server.validation import parse_size

        return parse_size(self.container_memory)

    @field_validator("gpus", mode="before")
    @classmethod
    def _gpu_count(cls, value: object) -> object:
        """``8`` is a count; ``A100:2,V100:2`` stays a spec (checked when the inventory is made)."""
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            return int(value)
        return value

    @field_validator("allow_mount", mode="before")
    @classmethod
    def _split_paths(cls, value: object) -> object:
        """``ELASTRAIN_ALLOW_MOUNT=/a:/b`` (a PATH-like list) as well as a list from the flags."""
        if isinstance(value, str):
            return [part for part in value.split(os.pathsep) if part.strip()]
        return value

    @field_validator("open_host_port", mode="before")
    @classmethod
    def _split_ports(cls, value: object) -> object:
        """``ELASTRAIN_OPEN_HOST_PORT=5432,9100`` as well as a list from the flags; each 1-65535."""
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        return list(parse_ports(value)) if isinstance(value, list) else value

    @field_validator("dataset", mode="before")
    @classmethod
    def _split_datasets(cls, value: object) -> object:
        """``ELASTRAIN_DATASET=mnist=/srv/mnist,imagenet=/srv/in`` as well as a list from the flags."""
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value


def host_commands_allowed(backend: str | None, insecure_host_commands: bool) -> bool:
    """Whether tenants may run commands (exec, jobs, terminal): always on the container backend; on
    the process and Slurm backends (`HOST_COMMAND_BACKENDS`) only with --insecure-host-commands, since
    there they would run as this server's user on its machine (and could read its data dir)."""
    return backend not in HOST_COMMAND_BACKENDS or insecure_host_commands


def db_url_has_password(url: str) -> bool:
    """`url` carries a password (``scheme://user:PASS@host/db`` or ``?password=PASS``)."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return False
    return bool(password) or bool(parse_qs(parts.query).get("password"))


def _config_path(flag: Path | None, environ: Mapping[str, str]) -> Path | None:
    path = flag if flag is not None else (Path(environ[CONFIG_ENV]) if environ.get(CONFIG_ENV) else None)
    if path is None:
        return None
    path = path.expanduser()
    if not path.is_file():
        raise ConfigError(f"settings file {path} not found (--config / {CONFIG_ENV})")
    return path


def check_config_file(path: Path) -> None:
    """Refuse a settings file with unknown names, or with a database password others can read."""
    from dotenv import dotenv_values

    try:
        values = dotenv_values(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read settings file {path}: {exc}") from None
    for key in values:
        if key.upper() not in ENV_TO_FIELD:
            raise ConfigError(
                f"settings file {path}: unknown name {key!r}; known: {', '.join(sorted(ENV_TO_FIELD))}"
            )
    db = next((v for k, v in values.items() if k.upper() == DB_ENV), None)
    if db and db_url_has_password(db) and stat.S_IMODE(path.stat().st_mode) & 0o077:
        raise ConfigError(
            f"settings file {path} holds a database password but other users may read it; chmod 600 {path}"
        )


def _one_line(exc: ValidationError) -> str:
    first = exc.errors()[0]
    loc = str(first["loc"][0]) if first["loc"] else ""
    field = ENV_TO_FIELD.get(loc.upper(), loc)
    flag, env = NAMES.get(field, (loc, loc))
    if field in OLD_NAMES:  # it may have been given under its old name
        flag, env = f"{flag} ({OLD_NAMES[field][0]})", f"{env} ({OLD_NAMES[field][1]})"
    got = "" if field in SECRET_FIELDS else f" (got {first.get('input')!r})"  # never echo a secret
    return f"invalid server setting {flag} / {env}: {first['msg']}{got}"


def flag_values(args: argparse.Namespace) -> dict[str, Any]:
    """The settings given as flags (argparse defaults are None: an absent flag leaves env/file/default)."""
    given = {name: getattr(args, name, None) for name in NAMES}
    for name in ("allow_mount", "dataset", "open_host_port"):
        if given[name] == []:
            given[name] = None
    if given["db"] and db_url_has_password(given["db"]):
        raise ConfigError(
            f"--db carries a password, which every user sees in `ps`; put the URL in ${DB_ENV} "
            f"(environment) or in a 0600 settings file (--config FILE, {DB_ENV}=...) instead"
        )
    if given["metrics_token"]:
        print(METRICS_TOKEN_IN_ARGV_WARNING, file=sys.stderr, flush=True)
    return {name: value for name, value in given.items() if value is not None}


def load_settings(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> ServerSettings:
    """Resolve flag > environment > settings file > default; bad values are one-line ConfigErrors.

    `environ` is only consulted for ``ELASTRAIN_CONFIG``; the settings themselves come from
    ``os.environ`` (pydantic-settings reads it).
    """
    env = os.environ if environ is None else environ
    flags = flag_values(args)
    config = _config_path(getattr(args, "config", None), env)
    if config is not None:
        check_config_file(config)
    init = {_env(name): value for name, value in flags.items()}
    try:
        return ServerSettings(_env_file=config, **init)  # type: ignore[call-arg]
    except ValidationError as exc:
        raise ConfigError(_one_line(exc)) from None


def scrub_secrets_from_environment() -> None:
    """Drop ``ELASTRAIN_DB`` and ``ELASTRAIN_METRICS_TOKEN`` from this process's environment once read,
    so that nothing the server starts (the process backend's commands, Slurm jobs, portal shells)
    inherits the password or the token."""
    for secret in (DB_ENV, METRICS_TOKEN_ENV):
        for key in [k for k in os.environ if k.upper() == secret]:
            os.environ.pop(key, None)
