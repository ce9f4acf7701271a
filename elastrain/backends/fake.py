"""An in-memory backend: containers are records in this process, ready the moment they are created.

For tests and demos of the control plane without processes, podman or Slurm. It is a complete
`Backend` (the contract suite, ``tests/contract/test_backend_contract.py``, holds it to the same
behaviour as the others), not a mock:

* containers, their logs and the files written into them live in memory (`read_file` reads one back);
* each container has a scratch directory (its `container_path`), where the files written into it are
  mirrored, so the commands `exec` runs, which are real processes on this machine started in that
  directory, see them; job logs go there too;
* every process it starts carries the container's uid marker in its environment (as the process
  backend's do), which is how `own_pid` and `stop_processes` tell its processes from strangers.

Nothing runs for a container itself: its pid is a made-up number, never signalled.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from elastrain.backends.api import Backend, ContainerSpec, ContainerStatus
from elastrain.backends.local import CLUSTER_UID_ENV, CONTAINER_UID_ENV
from elastrain.backends.procs import has_env_settled, host_env, pids_with_env, start_in_session
from elastrain.backends.tenant_files import LOG_LIMIT, last_lines
from elastrain.backends.usage import ContainerUsage, processes_usage
from elastrain.hostfile import atomic_write_text

_FIRST_PID = 100


@dataclass
class _Container:
    spec: ContainerSpec
    pid: int
    log: list[str] = field(default_factory=list)


class FakeBackend(Backend):
    """Containers as records in memory; commands as processes in a scratch directory per container."""

    def __init__(self, scratch: Path | None = None) -> None:
        """`scratch`: where container directories go (default: a fresh temporary directory, removed by
        `close`)."""
        self._own_scratch = scratch is None
        self._scratch = Path(scratch) if scratch is not None else None
        self.containers: dict[tuple[str, str], _Container] = {}
        self.files: dict[str, dict[str, str]] = {}  # cluster -> container path -> text
        self.creates = 0  # containers started (a create of a live one is not counted)
        self._next_pid = _FIRST_PID
        self._procs: list[subprocess.Popen[bytes]] = []
        self._lock = threading.RLock()
        self._remove_scratch: Callable[[], object] = lambda: None

    # --- lifecycle ---------------------------------------------------------------------------------
    def create_container(self, spec: ContainerSpec) -> ContainerStatus:
        """Record the container (no-op returning its status when it exists); ready at once."""
        key = (spec.cluster, spec.name)
        with self._lock:
            current = self.containers.get(key)
            if current is None:
                self.creates += 1
                self._next_pid += 1
                current = _Container(spec, self._next_pid)
                current.log.append(f"container {spec.name} up at {spec.address} (pid {current.pid})\n")
                self.containers[key] = current
                files = dict(self.files.get(spec.cluster, {}))
            else:
                files = {}
        root = self._root(spec.cluster, spec.name)
        root.mkdir(parents=True, exist_ok=True)
        for path, text in files.items():
            atomic_write_text(root / path.lstrip("/"), text)
        return self._status(current)

    def delete_container(self, cluster: str, name: str, cluster_uid: str = "") -> None:
        """Forget the container, stop the commands run in it, remove its scratch directory."""
        with self._lock:
            gone = self.containers.pop((cluster, name), None)
        if gone is not None:
            self._stop_marked(CONTAINER_UID_ENV, f"{gone.spec.cluster_uid}/{name}")
        shutil.rmtree(self._root(cluster, name), ignore_errors=True)

    def delete_cluster(self, cluster: str, cluster_uid: str) -> None:
        """Forget every container and file of the cluster; stop every command run in it."""
        with self._lock:
            for key in [k for k in self.containers if k[0] == cluster]:
                del self.containers[key]
            self.files.pop(cluster, None)
        if cluster_uid:
            self._stop_marked(CLUSTER_UID_ENV, cluster_uid)
        shutil.rmtree(self.scratch / cluster, ignore_errors=True)

    def list_containers(self) -> list[ContainerStatus]:
        """Every container recorded (all of them live and ready)."""
        with self._lock:
            return [self._status(c) for c in self.containers.values()]

    @staticmethod
    def _status(container: _Container) -> ContainerStatus:
        spec = container.spec
        return ContainerStatus(spec.cluster, spec.name, container.pid, True, True, spec.address)

    # --- files, paths ------------------------------------------------------------------------------
    @property
    def scratch(self) -> Path:
        """The directory of the containers' scratch directories (made on first use)."""
        with self._lock:
            if self._scratch is None:
                self._scratch = Path(tempfile.mkdtemp(prefix="elastrain-fake-"))
                # removed by `close`, or else when this backend is collected or the process exits:
                # a test that never closes its backend leaves nothing in the temp dir
                self._remove_scratch = weakref.finalize(self, shutil.rmtree, self._scratch, True)
            return self._scratch

    def _root(self, cluster: str, name: str) -> Path:
        return self.scratch / cluster / name

    def container_path(self, cluster: str, name: str, path: str) -> Path:
        """The container's scratch copy of container path `path`."""
        return self._root(cluster, name) / path.lstrip("/")

    def write_cluster_file(self, cluster: str, path: str, text: str) -> None:
        """Hold `text` as `path` of every container of the cluster (those created later too)."""
        with self._lock:
            self.files.setdefault(cluster, {})[path] = text
            names = [n for (c, n) in self.containers if c == cluster]
        for name in names:
            atomic_write_text(self.container_path(cluster, name, path), text)

    def read_file(self, cluster: str, name: str, path: str) -> str | None:
        """The text written at `path` for the container (None: nothing written there)."""
        with self._lock:
            if (cluster, name) not in self.containers:
                return None
            return self.files.get(cluster, {}).get(path)

    # --- commands ----------------------------------------------------------------------------------
    def environment(self, spec: ContainerSpec) -> dict[str, str]:
        """The container's variables: its name, role, address, uid markers, then the spec's own."""
        return {
            "ELASTRAIN_CLUSTER": spec.cluster,
            "ELASTRAIN_CONTAINER": spec.name,
            "ELASTRAIN_CONTAINER_ROLE": spec.role,
            "ELASTRAIN_CONTAINER_ADDRESS": spec.address,
            CLUSTER_UID_ENV: spec.cluster_uid,
            CONTAINER_UID_ENV: f"{spec.cluster_uid}/{spec.name}",
            **spec.env,
        }

    def exec(
        self, spec: ContainerSpec, command: list[str], log_path: Path | None = None
    ) -> subprocess.Popen[bytes]:
        """Run `command` in the container's scratch directory, in a new session; output to a pipe or
        `log_path`."""
        root = self._root(spec.cluster, spec.name)
        root.mkdir(parents=True, exist_ok=True)
        proc = start_in_session(command, root, host_env(self.environment(spec)), log_path)
        with self._lock:
            self._procs = [p for p in self._procs if p.poll() is None] + [proc]
            container = self.containers.get((spec.cluster, spec.name))
            if container is not None:
                container.log.append(f"exec {command[0]} (pid {proc.pid})\n")
        return proc

    def logs(self, cluster: str, name: str, limit: int = LOG_LIMIT) -> Iterator[str]:
        """The container's log lines (its start and the commands run in it), the last `limit` bytes'."""
        with self._lock:
            container = self.containers.get((cluster, name))
            lines = list(container.log) if container is not None else []
        yield from last_lines(lines, limit)

    def usage(self, cluster: str, cluster_uid: str) -> dict[str, ContainerUsage]:
        """A container here is a record, not a process: only the commands running in it have figures
        (from /proc); without any, the container's figures are not available."""
        with self._lock:
            names = [name for (owner, name) in self.containers if owner == cluster]
        found = {}
        for name in names:
            pids = pids_with_env(CONTAINER_UID_ENV, f"{cluster_uid}/{name}") if cluster_uid else []
            found[name] = (
                processes_usage(pids)
                if pids
                else ContainerUsage.unavailable("not available: the fake backend runs no container process")
            )
        return found

    def own_pid(self, spec: ContainerSpec, pid: int) -> int | None:
        """`pid` when it is a live process started in the container (its uid marker), else None."""
        if pid <= 1 or pid == os.getpid():
            return None
        return pid if has_env_settled(pid, CONTAINER_UID_ENV, f"{spec.cluster_uid}/{spec.name}") else None

    def stop_processes(
        self, spec: ContainerSpec, env_key: str, env_value: str, pid: int | None, signum: int
    ) -> None:
        """Signal the container's processes carrying ``env_key=env_value``, and `pid` when it is one of
        the container's (never a stranger)."""
        targets = {p for p in pids_with_env(env_key, env_value) if self.own_pid(spec, p) is not None}
        if pid and self.own_pid(spec, pid) is not None:
            targets.add(pid)
        for target in sorted(targets):
            try:
                os.kill(target, signum)
            except (ProcessLookupError, PermissionError):
                pass

    def _stop_marked(self, key: str, value: str) -> None:
        """SIGTERM the processes carrying ``key=value``; reap those this backend started."""
        killed = set()
        for pid in pids_with_env(key, value):
            try:
                os.kill(pid, signal.SIGTERM)
                killed.add(pid)
            except (ProcessLookupError, PermissionError):
                pass
        with self._lock:
            procs = [p for p in self._procs if p.pid in killed]
        for proc in procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def close(self) -> None:
        """Stop every command still running; remove the scratch directory when this backend made it."""
        with self._lock:
            procs, self._procs = list(self._procs), []
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if self._own_scratch and self._scratch is not None:
            self._remove_scratch()
            self._scratch = None
