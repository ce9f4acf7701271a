"""The `Backend` ABC: everything the control plane needs from a place that runs containers.

Implementations: `local.LocalBackend` (the process backend), `container.ContainerBackend` (podman),
`slurm.SlurmBackend` (Slurm batch jobs) and `fake.FakeBackend` (in memory, for tests). Callers use
only the methods declared here; ``tests/contract/test_backend_contract.py`` holds every implementation
to the same behaviour.
"""

from __future__ import annotations

import abc
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from elastrain.backends.tenant_files import LOG_LIMIT
from elastrain.backends.usage import ContainerUsage


@dataclass(frozen=True)
class Mount:
    """Host directory or file `source` visible at `target` (an absolute path) inside a container."""

    source: str
    target: str
    read_only: bool = False  # an admin's dataset: mounted read-only


@dataclass(frozen=True)
class ContainerSpec:
    """Everything a backend needs to start one container."""

    cluster: str
    cluster_uid: str
    name: str
    role: str
    address: str
    gpu_ids: tuple[int, ...] = ()
    real_gpus: bool = False
    shm_bytes: int = 0
    image: str = "local"
    mounts: tuple[Mount, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    framework: str = ""
    tenant: str = ""  # the owner's user name: processes in a container run as this user
    tenant_uid: int = 0  # ... with this uid (one per tenant; 0 = the server's own user, process backend)
    memory_bytes: int = 0  # memory limit (0: none)
    cpus: float = 0.0  # CPU limit in cores (0: none)


@dataclass(frozen=True)
class ContainerStatus:
    """What a backend observes about one container."""

    cluster: str
    name: str
    pid: int | None
    alive: bool
    ready: bool
    address: str = ""
    exit_reason: str = ""  # for a container that ended: its exit code and last log lines
    waiting_reason: str = ""  # for an alive container not ready yet: why, if the backend knows (optional)
    paused: bool = False  # alive but frozen (its processes stopped): a hang for its job, never an exit


@dataclass(frozen=True)
class ImageEntry:
    """An image clusters can run: its name, the frameworks it really holds, size and creation time."""

    name: str
    frameworks: tuple[str, ...]
    size_bytes: int = 0
    created: str = ""
    description: str = ""
    default_for: tuple[str, ...] = ()  # the frameworks whose clusters get this image when none is named


class Backend(abc.ABC):
    """Creates, lists and removes containers; writes files into them, runs commands, returns logs.

    Every method is idempotent: creating an existing live container or deleting a missing one is a
    no-op, so the reconciler can repeat a half-done step after a crash.
    """

    @abc.abstractmethod
    def create_container(self, spec: ContainerSpec) -> ContainerStatus:
        """Start the container (no-op returning its status when it already runs)."""

    @abc.abstractmethod
    def delete_container(self, cluster: str, name: str, cluster_uid: str = "") -> None:
        """Stop every process of the container and remove it."""

    @abc.abstractmethod
    def delete_cluster(self, cluster: str, cluster_uid: str) -> None:
        """Stop every process of the cluster (including commands run in it) and remove its files."""

    @abc.abstractmethod
    def list_containers(self) -> list[ContainerStatus]:
        """Every container the backend holds, live or dead."""

    @abc.abstractmethod
    def write_cluster_file(self, cluster: str, path: str, text: str) -> None:
        """Atomically write `text` at absolute `path` in every container of the cluster."""

    @abc.abstractmethod
    def container_path(self, cluster: str, name: str, path: str) -> Path:
        """Where absolute container `path` is on this machine (for rewriting commands)."""

    @abc.abstractmethod
    def exec(
        self, spec: ContainerSpec, command: list[str], log_path: Path | None = None
    ) -> subprocess.Popen[bytes]:
        """Start `command` in the container; stdout+stderr go to a pipe (or to `log_path`)."""

    @abc.abstractmethod
    def logs(self, cluster: str, name: str, limit: int = LOG_LIMIT) -> Iterator[str]:
        """The container's captured log lines: those of its last `limit` bytes (a log is never read
        whole into memory)."""

    # --- with defaults: what the process backend does; the container backend overrides them -------
    translates_paths = True  # commands see this machine's paths: the server rewrites container paths

    def environment(self, spec: ContainerSpec) -> dict[str, str]:
        """The environment variables a command started in the container sees (on top of the image's, or
        of the server's own where commands run on this machine): the spec's own by default."""
        return dict(spec.env)

    def hostfile_path(self, cluster: str) -> Path | None:
        """The file on this machine holding the cluster's hostfile (None: not readable here)."""
        return None

    def tenant_base(self, cluster: str) -> Path | None:
        """The directory on this machine, owned by the server, below which the cluster's files that its
        tenant can write lie (job logs, container metadata): read without following a link below it
        (`tenant_files`). None: no such directory here."""
        return None

    def resolve_image(self, image: str, framework: str) -> str:
        """The image a new cluster of `framework` runs; refuses (`InvalidRequest`) when none fits."""
        return image or "local"

    def images(self) -> list[ImageEntry]:
        """The images clusters can use (the process backend has one: the server's own environment)."""
        return [ImageEntry("local", (), description="the server's Python environment (no container image)")]

    def serve_api(self, host: str, port: int) -> None:  # noqa: B027 - optional hook
        """Where the server's API listens (a backend whose containers cannot reach it relays to it)."""

    def api_url(self, cluster: str, server_url: str) -> str:
        """The control plane's URL as processes in the cluster's containers reach it."""
        return server_url

    def terminal_command(self, spec: ContainerSpec, env: dict[str, str]) -> list[str] | None:
        """argv of an interactive shell in the container (None: a shell on this machine in its root)."""
        return None

    def path_inside(self, cluster: str, name: str, path: str) -> str:
        """How processes in the container name the container path `path`."""
        return str(self.container_path(cluster, name, path))

    def own_pid(self, spec: ContainerSpec, pid: int) -> int | None:
        """The PID (on this machine) of the container's process that calls itself `pid` (None: not its)."""
        return pid

    def stop_processes(
        self, spec: ContainerSpec, env_key: str, env_value: str, pid: int | None, signum: int
    ) -> None:
        """Signal the container's processes started with ``env_key=env_value`` (a job, an exec call),
        and `pid` (a process on this machine that runs them): its process group by default."""
        if pid:
            try:
                os.killpg(pid, signum)
            except (ProcessLookupError, PermissionError):
                pass

    def usage(self, cluster: str, cluster_uid: str) -> dict[str, ContainerUsage]:
        """CPU and memory figures of the cluster's live containers, by container name; a container
        left out has none (the default: this backend reports none)."""
        return {}

    def close(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        """Release what the backend holds in this process (containers keep running)."""
