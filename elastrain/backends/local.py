"""The local backend: a container is a directory plus an init process on its own loopback address.

Layout under ``<data-dir>/clusters/<cluster>/`` (directories 0700, logs 0600: the server's alone)::

    hostfile                      the cluster's hostfile (rewritten atomically)
    <container>/                  the container's root
        container.json            spec + pid (how a restarted server adopts it)
        ready                     written by the init process once its address is bound
        etc/mpi/hostfile          symlink to ../../../hostfile
        etc/environment           the container's environment (KEY=VALUE lines)
        var/log/container.log     the init process's output
        <mount target>            symlink to the mounted host path

Every process started in a container carries ``ELASTRAIN_CLUSTER_UID`` and ``ELASTRAIN_CONTAINER_UID``
in its environment, so deleting a cluster finds and stops all of them, including a job's agents.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

from elastrain.backends.api import Backend, ContainerSpec, ContainerStatus, Mount
from elastrain.backends.filemodes import open_private_append, private_dir
from elastrain.backends.procs import (
    cmdline,
    has_env_settled,
    host_env,
    niced,
    pid_alive,
    pids_with_args,
    pids_with_env,
    start_in_session,
    terminate,
)
from elastrain.backends.shm import with_shm_limit
from elastrain.backends.tenant_files import LOG_LIMIT, TenantFileError, read_whole, tail_lines
from elastrain.backends.usage import ContainerUsage, processes_usage
from elastrain.errors import ConfigError
from elastrain.hostfile import atomic_write_text

HOSTFILE_PATH = "/etc/mpi/hostfile"
CLUSTER_UID_ENV = "ELASTRAIN_CLUSTER_UID"
CONTAINER_UID_ENV = "ELASTRAIN_CONTAINER_UID"
_PROC = Path("/proc")
# what the platform keeps in a container's root: a mount may not replace any of it by a link (the
# server validates targets first; this guards mounts stored before it did)
_OWN_PATHS = (
    "etc/mpi",
    "var/log",
    "etc/environment",
    "container.json",
    "ready",
    ".ready.tmp",
    "slurm-batch.sh",
)
log = logging.getLogger(__name__)


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        return None


class LocalBackend(Backend):
    """Containers as directories and processes on this machine."""

    def __init__(self, data_dir: Path, stop_timeout_s: float = 5.0) -> None:
        self.root = private_dir(Path(data_dir).resolve() / "clusters")
        self.stop_timeout_s = stop_timeout_s
        self._children: dict[int, tuple[subprocess.Popen[bytes], Path]] = {}  # pid -> (init, its root)
        self._lock = threading.Lock()

    # --- paths -------------------------------------------------------------------------------------
    def cluster_dir(self, cluster: str) -> Path:
        """The cluster's directory."""
        return self.root / cluster

    def tenant_base(self, cluster: str) -> Path | None:
        """The cluster's directory: everything its tenant can write is below it."""
        return self.cluster_dir(cluster)

    def hostfile_path(self, cluster: str) -> Path | None:
        """The one hostfile every container's ``etc/mpi/hostfile`` links to."""
        return self.cluster_dir(cluster) / "hostfile"

    def container_root(self, cluster: str, name: str) -> Path:
        """A container's root directory."""
        return self.root / cluster / name

    def container_path(self, cluster: str, name: str, path: str) -> Path:
        """Map absolute container `path` to this machine."""
        return self.container_root(cluster, name) / path.lstrip("/")

    def environment(self, spec: ContainerSpec) -> dict[str, str]:
        """The environment variables of a container (added to the server's own for commands)."""
        root = self.container_root(spec.cluster, spec.name)
        gpus = ",".join(str(g) for g in spec.gpu_ids)
        env = {
            "ELASTRAIN_CLUSTER": spec.cluster,
            "ELASTRAIN_CONTAINER": spec.name,
            "ELASTRAIN_CONTAINER_ROLE": spec.role,
            "ELASTRAIN_CONTAINER_ADDRESS": spec.address,
            "ELASTRAIN_CONTAINER_ROOT": str(root),
            "ELASTRAIN_HOSTFILE": str(root / HOSTFILE_PATH.lstrip("/")),
            "ELASTRAIN_VISIBLE_GPUS": gpus,
            "ELASTRAIN_SHM_BYTES": str(spec.shm_bytes),
            CLUSTER_UID_ENV: spec.cluster_uid,
            CONTAINER_UID_ENV: f"{spec.cluster_uid}/{spec.name}",
        }
        if spec.real_gpus:
            env["CUDA_VISIBLE_DEVICES"] = gpus
        env.update(spec.env)
        return env

    # --- lifecycle ---------------------------------------------------------------------------------
    def _layout(self, spec: ContainerSpec, root: Path) -> None:
        """The container's root: etc/mpi/hostfile (a link to the cluster's file), mounts, environment."""
        private_dir(self.cluster_dir(spec.cluster))  # 0700, as the container's root: the server's alone
        private_dir(root)
        (root / "etc" / "mpi").mkdir(parents=True, exist_ok=True)
        (root / "var" / "log").mkdir(parents=True, exist_ok=True)
        (root / "ready").unlink(missing_ok=True)
        cluster_hostfile = self.cluster_dir(spec.cluster) / "hostfile"
        if not cluster_hostfile.exists():
            atomic_write_text(cluster_hostfile, "# generation: 0\n")
        link = root / "etc" / "mpi" / "hostfile"
        if not link.is_symlink():
            link.unlink(missing_ok=True)
            link.symlink_to(Path("..") / ".." / ".." / "hostfile")
        for mount in spec.mounts:
            self._mount(root, mount)
        env = self.environment(spec)
        atomic_write_text(root / "etc" / "environment", "".join(f"{k}={v}\n" for k, v in sorted(env.items())))

    def create_container(self, spec: ContainerSpec) -> ContainerStatus:
        """Lay out the root, then start the init process (idempotent)."""
        root = self.container_root(spec.cluster, spec.name)
        current = self._status(root)
        if current is not None and current.alive:
            return current
        # an init a killed server started but never recorded (it died between the two) is an orphan:
        # stop it, or the container would run twice. Only a root laid out before can have one (and
        # the /proc scan is not free: a scale-out wave starts many containers at once)
        if root.exists():
            orphans = pids_with_args("--root", str(root))
            terminate([p for p in orphans if p != (current.pid if current else None)])
        self._layout(spec, root)
        env = self.environment(spec)
        meta = {**asdict(spec), "pid": None, "started_at": time.time()}
        log = open_private_append(root / "var" / "log" / "container.log")  # handed to the child
        try:
            init = [sys.executable, "-m", "elastrain.backends.container_proc", "--root", str(root)]
            proc = subprocess.Popen(
                niced(with_shm_limit([*init, "--address", spec.address], spec.shm_bytes)),
                cwd=root,
                env={**os.environ, **env},
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            log.close()
        with self._lock:
            self._children[proc.pid] = (proc, root)
        meta["pid"] = proc.pid
        atomic_write_text(root / "container.json", json.dumps(meta, indent=1))
        return ContainerStatus(spec.cluster, spec.name, proc.pid, True, False, spec.address)

    def _mount(self, root: Path, mount: Mount) -> None:
        relative = "/".join(part for part in mount.target.split("/") if part not in ("", "."))
        own = next((p for p in _OWN_PATHS if relative == p or relative.startswith(p + "/")), None)
        if not relative or ".." in relative.split("/") or own is not None:
            raise ConfigError(f"mount target {mount.target} would replace the container's own /{own or ''}")
        target = root / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_symlink() and os.readlink(target) == mount.source:
            return
        if target.is_symlink() or target.is_file():
            target.unlink()
        elif target.is_dir():
            shutil.rmtree(target)
        target.symlink_to(mount.source)

    def delete_container(self, cluster: str, name: str, cluster_uid: str = "") -> None:
        """Stop the init process and every command run in the container, then remove its root."""
        root = self.container_root(cluster, name)
        status = self._status(root)
        pids = [status.pid] if status is not None and status.pid and status.alive else []
        if cluster_uid:
            pids += pids_with_env(CONTAINER_UID_ENV, f"{cluster_uid}/{name}")
        terminate(pids, self.stop_timeout_s)
        self._poll_children()
        shutil.rmtree(root, ignore_errors=True)

    def delete_cluster(self, cluster: str, cluster_uid: str) -> None:
        """Stop every process carrying the cluster's uid and every init process, remove the files."""
        pids = pids_with_env(CLUSTER_UID_ENV, cluster_uid) if cluster_uid else []
        for status in self.list_containers():
            if status.cluster == cluster and status.alive and status.pid:
                pids.append(status.pid)
        terminate(pids, self.stop_timeout_s)
        self._poll_children()
        shutil.rmtree(self.cluster_dir(cluster), ignore_errors=True)

    def list_containers(self) -> list[ContainerStatus]:
        """Scan the data directory; a container is alive when its recorded pid runs its init."""
        self._poll_children()
        found = []
        for meta_path in sorted(self.root.glob("*/*/container.json")):
            status = self._status(meta_path.parent)
            if status is not None:
                found.append(status)
        return found

    def _status(self, root: Path) -> ContainerStatus | None:
        try:  # in the container's root: its tenant may have replaced it (a FIFO, a link, 50 GB)
            meta = json.loads(read_whole(root / "container.json", root.parent))
        except (OSError, ValueError, TenantFileError):
            return None
        pid = meta.get("pid")
        alive = bool(pid) and self._is_init(int(pid), root)
        ready = alive and (root / "ready").exists()
        return ContainerStatus(meta["cluster"], meta["name"], pid, alive, ready, meta.get("address", ""))

    def _is_init(self, pid: int, root: Path) -> bool:
        with self._lock:
            entry = self._children.get(pid)
        if entry is not None:
            child, child_root = entry
            if child.poll() is not None:
                return False
            if child_root == root:  # our unreaped init of `root`: its pid cannot be reused, no /proc read
                return True
        return pid_alive(pid) and str(root) in cmdline(pid)

    def _poll_children(self) -> None:
        with self._lock:
            for pid, (child, _root) in list(self._children.items()):
                if child.poll() is not None:
                    del self._children[pid]

    # --- files, commands, logs ---------------------------------------------------------------------
    def write_cluster_file(self, cluster: str, path: str, text: str) -> None:
        """Only the hostfile is shared: every container's ``etc/mpi/hostfile`` links to one file."""
        if path != HOSTFILE_PATH:
            for root in self.cluster_dir(cluster).iterdir():
                if (root / "container.json").exists():
                    atomic_write_text(root / path.lstrip("/"), text)
            return
        atomic_write_text(self.cluster_dir(cluster) / "hostfile", text)

    def exec(
        self, spec: ContainerSpec, command: list[str], log_path: Path | None = None
    ) -> subprocess.Popen[bytes]:
        """Run `command` in the container's root with its environment, in a new session."""
        root = self.container_root(spec.cluster, spec.name)
        command = with_shm_limit(command, spec.shm_bytes)
        return start_in_session(command, root, host_env(self.environment(spec)), log_path)

    # --- which processes are the container's: proven by its uid marker in their environment ----------
    def in_container(self, spec: ContainerSpec, pid: int) -> bool:
        """`pid` is a live process of the container: its environment carries the container's uid
        marker (every process started in it inherits it; a process the server did not start there has
        none, whatever its command line says)."""
        if not spec.cluster_uid or pid <= 1 or pid == os.getpid():
            return False
        return has_env_settled(pid, CONTAINER_UID_ENV, f"{spec.cluster_uid}/{spec.name}")

    def own_pid(self, spec: ContainerSpec, pid: int) -> int | None:
        """`pid` when it is a process of the container, else None (a client names any pid it likes)."""
        if self.in_container(spec, pid):
            return pid
        log.warning("pid %d is not a process of %s/%s: refused", pid, spec.cluster, spec.name)
        return None

    def stop_processes(
        self, spec: ContainerSpec, env_key: str, env_value: str, pid: int | None, signum: int
    ) -> None:
        """Signal the members of `pid`'s process group that are processes of the container; nothing
        when `pid` itself is not one (a stored pid may name a stranger: a decoy, or a reused pid)."""
        if not pid:
            return
        if not self.in_container(spec, pid):
            log.warning(
                "not signalling pid %d: not a process of %s/%s (refused)", pid, spec.cluster, spec.name
            )
            return
        group = _pgid(pid)
        members = {pid}
        if group == pid:
            members |= {
                int(e.name) for e in _PROC.iterdir() if e.name.isdigit() and _pgid(int(e.name)) == group
            }
        for member in sorted(members):
            if member != pid and not self.in_container(spec, member):
                log.warning("not signalling pid %d of job group %d: not in %s", member, pid, spec.name)
                continue
            try:
                os.kill(member, signum)
            except (ProcessLookupError, PermissionError):
                pass

    def usage(self, cluster: str, cluster_uid: str) -> dict[str, ContainerUsage]:
        """Each live container's processes (those carrying its uid marker), summed from /proc: a
        process container has no cgroup of its own, so no memory limit is known."""
        return {
            status.name: processes_usage(pids_with_env(CONTAINER_UID_ENV, f"{cluster_uid}/{status.name}"))
            for status in self.list_containers()
            if status.cluster == cluster and status.alive and cluster_uid
        }

    def logs(self, cluster: str, name: str, limit: int = LOG_LIMIT) -> Iterator[str]:
        """Lines of the last `limit` bytes of the container's init log (a file its tenant can write)."""
        path = self.container_root(cluster, name) / "var" / "log" / "container.log"
        yield from tail_lines(path, self.cluster_dir(cluster), limit)
