"""The `Backend` ABC: what the reconciler needs from a place that runs containers."""

from __future__ import annotations

import abc
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Mount:
    """Host directory or file `source` visible at `target` (an absolute path) inside a container."""

    source: str
    target: str


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


@dataclass(frozen=True)
class ContainerStatus:
    """What a backend observes about one container."""

    cluster: str
    name: str
    pid: int | None
    alive: bool
    ready: bool
    address: str = ""


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
    def logs(self, cluster: str, name: str) -> Iterator[str]:
        """The container's captured log lines."""
