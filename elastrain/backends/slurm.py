"""The Slurm backend: each container is a Slurm batch job running the container's init process.

A container keeps the local backend's layout (its root under ``<data-dir>/clusters/<cluster>/``,
which must be on a file system shared with the Slurm nodes; the hostfile at ``etc/mpi/hostfile``,
``container.json``, ``var/log/container.log``), so exec, logs and the hostfile work as with the local
backend. What differs:

* start: ``sbatch --parsable --job-name=elastrain-<cluster>-<container> --gres=gpu:N`` whose batch
  script ``exec``s ``python -m elastrain.backends.container_proc`` (the same init process) on the
  node Slurm chose; the job id and, once it runs, the node are kept in ``container.json``
  (``slurm_job_id``, ``slurm_node``) and the first log line says ``slurm job J on node N``;
* state: from ``squeue --json`` (the job) and ``sinfo --json`` (its node). A container is alive while
  its job is pending or running on a usable node, and ready once it runs and the init wrote ``ready``.
  A job on a drained, draining or down node counts as dead, so the reconciler marks the container
  Failed and drops it from the hostfile (the training job shrinks gracefully); after `node_grace_s`
  the backend cancels the job itself, so the node can finish draining;
* stop: ``scancel --signal=TERM --full`` (the init exits cleanly), then ``scancel`` after
  `stop_timeout_s`; jobs are found by their recorded id and by their working directory (the
  container's root), so a job submitted just before a crash is still adopted or stopped.

The container's address stays a loopback address from the server's block (all nodes of the test
cluster run on one machine); the Slurm node is recorded next to it.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from elastrain.backends.api import ContainerSpec, ContainerStatus
from elastrain.backends.local import CLUSTER_UID_ENV, CONTAINER_UID_ENV, LocalBackend
from elastrain.backends.procs import pids_with_env, server_first_path, terminate
from elastrain.backends.slurmctl import SlurmCommands, SlurmError, SlurmJob, SlurmNode
from elastrain.backends.tenant_files import TenantFileError, read_whole
from elastrain.hostfile import atomic_write_text

JOB_PREFIX = "elastrain-"
_NODE_TTL_S = 0.5  # sinfo is re-read at most this often while no job changed its node


def job_name(cluster: str, container: str) -> str:
    """The Slurm job name of a container."""
    return f"{JOB_PREFIX}{cluster}-{container}"


class SlurmBackend(LocalBackend):
    """Containers as Slurm batch jobs; files, exec and logs as in `LocalBackend` (shared file system)."""

    def __init__(
        self,
        data_dir: Path,
        env: Mapping[str, str] | None = None,
        cpus_per_container: int = 1,
        mem_per_container_mb: int | None = None,
        partition: str | None = None,
        extra_sbatch_args: tuple[str, ...] = (),
        stop_timeout_s: float = 5.0,
        node_grace_s: float = 1.0,
        commands: SlurmCommands | None = None,
    ) -> None:
        """`commands`: how Slurm is driven (sbatch, squeue, sinfo, scancel; default: the commands on
        PATH with `env`, e.g. SLURM_CONF); pass another `SlurmCommands` to reach another cluster or to
        script Slurm's answers in a test, instead of patching this object."""
        super().__init__(data_dir, stop_timeout_s)
        self.slurm = commands if commands is not None else SlurmCommands(env)
        self.cpus_per_container = cpus_per_container
        self.mem_per_container_mb = mem_per_container_mb
        self.partition = partition
        self.extra_sbatch_args = extra_sbatch_args
        self.node_grace_s = node_grace_s
        self._nodes: dict[str, SlurmNode] = {}
        self._nodes_at = 0.0
        self._leaving: dict[int, float] = {}  # job id -> when it was first seen on a bad node
        self._state_lock = threading.Lock()

    # --- lifecycle ---------------------------------------------------------------------------------
    def create_container(self, spec: ContainerSpec) -> ContainerStatus:
        """Lay out the root, then submit the container's batch job (idempotent)."""
        root = self.container_root(spec.cluster, spec.name)
        jobs = self.slurm.jobs()
        current = self._status(root, jobs)
        if current is not None and current.alive:
            return current
        self._stop_jobs(self._jobs_of(root, jobs))
        self._layout(spec, root)
        env = {**self.environment(spec), "PATH": server_first_path(os.environ.get("PATH", ""))}
        meta: dict[str, Any] = {**asdict(spec), "pid": None, "submitted_at": time.time()}
        meta.update(slurm_job_id=None, slurm_node="", backend="slurm")
        atomic_write_text(root / "container.json", json.dumps(meta, indent=1))  # before the job exists
        script = root / "slurm-batch.sh"
        atomic_write_text(script, _batch_script(root, spec.address))
        try:
            job_id = self.slurm.submit(self._sbatch_args(spec, root), str(script), env)
        except SlurmError as exc:
            meta["submit_error"] = str(exc)
            atomic_write_text(root / "container.json", json.dumps(meta, indent=1))
            self._log(root, f"sbatch failed: {exc}")
            return ContainerStatus(spec.cluster, spec.name, None, False, False, spec.address)
        meta["slurm_job_id"] = job_id
        atomic_write_text(root / "container.json", json.dumps(meta, indent=1))
        return ContainerStatus(spec.cluster, spec.name, None, True, False, spec.address)

    def _sbatch_args(self, spec: ContainerSpec, root: Path) -> list[str]:
        """sbatch options of a container: one task on one node with its GPUs, CPUs and memory."""
        args = [
            f"--job-name={job_name(spec.cluster, spec.name)}",
            f"--chdir={root}",
            f"--output={root / 'var' / 'log' / 'container.log'}",
            "--open-mode=append",
            "--nodes=1",
            "--ntasks=1",
            f"--cpus-per-task={self.cpus_per_container}",
            "--no-requeue",
            "--export=ALL",
        ]
        if spec.gpu_ids:
            args.append(f"--gres=gpu:{len(spec.gpu_ids)}")
        if self.mem_per_container_mb:
            args.append(f"--mem={self.mem_per_container_mb}M")
        if self.partition:
            args.append(f"--partition={self.partition}")
        return [*args, *self.extra_sbatch_args]

    def delete_container(self, cluster: str, name: str, cluster_uid: str = "") -> None:
        """Let the init exit on SIGTERM, cancel its job, stop the commands run in it, remove its root."""
        root = self.container_root(cluster, name)
        self._stop_jobs(self._jobs_of(root, self.slurm.jobs()))
        if cluster_uid:
            terminate(pids_with_env(CONTAINER_UID_ENV, f"{cluster_uid}/{name}"), self.stop_timeout_s)
        self._poll_children()
        shutil.rmtree(root, ignore_errors=True)

    def delete_cluster(self, cluster: str, cluster_uid: str) -> None:
        """Cancel every job of the cluster, stop every process carrying its uid, remove its files."""
        base = self.cluster_dir(cluster)
        recorded = {m.get("slurm_job_id") for m in self._metas(base)}
        self._stop_jobs([j for j in self.slurm.jobs() if j.job_id in recorded or _under(j.cwd, base)])
        if cluster_uid:
            terminate(pids_with_env(CLUSTER_UID_ENV, cluster_uid), self.stop_timeout_s)
        self._poll_children()
        shutil.rmtree(base, ignore_errors=True)

    def _stop_jobs(self, jobs: list[SlurmJob]) -> None:
        """Stop jobs gracefully: cancel pending ones, SIGTERM running ones (the init exits cleanly).

        Running jobs still there after `stop_timeout_s` are scancelled (Slurm kills them after KillWait).
        """
        running = {j.job_id for j in jobs if j.active and j.state != "PENDING"}
        self.slurm.cancel(j.job_id for j in jobs if j.state == "PENDING")
        if not running:
            return
        self.slurm.cancel(running, signal="TERM")
        deadline = time.monotonic() + self.stop_timeout_s
        while running and time.monotonic() < deadline:
            time.sleep(0.1)
            running &= {j.job_id for j in self.slurm.jobs() if j.active}
        self.slurm.cancel(running)

    # --- observation -------------------------------------------------------------------------------
    def list_containers(self) -> list[ContainerStatus]:
        """Every container under the data directory, with its state from squeue and sinfo.

        A Slurm job whose working directory is a container root under this data directory but that
        has no ``container.json`` (its files are gone) is listed too, so the reconciler stops it.
        """
        self._poll_children()
        jobs = self.slurm.jobs()
        found = []
        roots = set()
        for meta_path in sorted(self.root.glob("*/*/container.json")):
            roots.add(meta_path.parent)
            status = self._status(meta_path.parent, jobs)
            if status is not None:
                found.append(status)
        for job in jobs:
            path = Path(job.cwd)
            ours = job.active and job.name.startswith(JOB_PREFIX) and path.parent.parent == self.root
            if ours and path not in roots:
                found.append(ContainerStatus(path.parent.name, path.name, None, True, False))
        self._cancel_leavers(jobs)
        return found

    def _status(self, root: Path, jobs: list[SlurmJob] | None = None) -> ContainerStatus | None:
        """The container's status from its job (None when it has no job yet: the reconciler starts it)."""
        try:  # in the container's root, which its tenant can write
            meta = json.loads(read_whole(root / "container.json", root.parent))
        except (OSError, ValueError, TenantFileError):
            return None
        if meta.get("backend") != "slurm":
            return None
        address = meta.get("address", "")
        if meta.get("submit_error"):
            return ContainerStatus(meta["cluster"], meta["name"], None, False, False, address)
        candidates = self._jobs_of(root, self.slurm.jobs() if jobs is None else jobs, meta)
        if not candidates:
            if meta.get("slurm_job_id") is None:
                return None  # a crash between container.json and sbatch: submit again
            return ContainerStatus(meta["cluster"], meta["name"], None, False, False, address)
        job = max(candidates, key=lambda j: (j.active, j.job_id))
        alive, ready = job.active, False
        if job.state == "RUNNING" and job.node:
            node = self._node(job.node)
            if node is not None and not node.usable:
                alive = False
                self._mark_leaving(root, job, node)
            else:
                ready = (root / "ready").exists()
            if job.node != meta.get("slurm_node") or job.job_id != meta.get("slurm_job_id"):
                meta.update(slurm_job_id=job.job_id, slurm_node=job.node, running_at=time.time())
                atomic_write_text(root / "container.json", json.dumps(meta, indent=1))
        pid = _ready_pid(root) if ready else None
        return ContainerStatus(meta["cluster"], meta["name"], pid, alive, ready, address)

    def _jobs_of(
        self, root: Path, jobs: list[SlurmJob], meta: dict[str, Any] | None = None
    ) -> list[SlurmJob]:
        """The container's jobs: the recorded id, or any elastrain job whose working dir is its root."""
        if meta is None:
            meta = next(iter(self._metas_at(root)), {})
        recorded = meta.get("slurm_job_id")
        return [
            j
            for j in jobs
            if j.job_id == recorded or (j.name.startswith(JOB_PREFIX) and j.cwd == str(root) and j.active)
        ]

    def _node(self, name: str) -> SlurmNode | None:
        """The node's state from ``sinfo --json`` (cached for `_NODE_TTL_S`)."""
        with self._state_lock:
            if time.monotonic() - self._nodes_at > _NODE_TTL_S or name not in self._nodes:
                try:
                    self._nodes = self.slurm.nodes()
                except SlurmError:
                    return self._nodes.get(name)
                self._nodes_at = time.monotonic()
            return self._nodes.get(name)

    def _mark_leaving(self, root: Path, job: SlurmJob, node: SlurmNode) -> None:
        """Remember a job on a bad node (it is cancelled after `node_grace_s`)."""
        with self._state_lock:
            if job.job_id in self._leaving:
                return
            self._leaving[job.job_id] = time.monotonic()
        self._log(root, f"node {node.name} is {node.describe()}: container leaves (slurm job {job.job_id})")

    def _cancel_leavers(self, jobs: list[SlurmJob]) -> None:
        """scancel the jobs seen on a bad node at least `node_grace_s` ago (the hostfile dropped them)."""
        active = {j.job_id for j in jobs if j.active}
        now = time.monotonic()
        with self._state_lock:
            due = [
                j for j, since in self._leaving.items() if j in active and now - since >= self.node_grace_s
            ]
            self._leaving = {j: s for j, s in self._leaving.items() if j in active}
        if due:
            self.slurm.cancel(due)

    # --- helpers -----------------------------------------------------------------------------------
    def _metas(self, base: Path) -> list[dict[str, Any]]:
        return [m for root in sorted(base.glob("*/")) for m in self._metas_at(root)]

    @staticmethod
    def _metas_at(root: Path) -> list[dict[str, Any]]:
        try:
            return [json.loads(read_whole(root / "container.json", root.parent))]
        except (OSError, ValueError, TenantFileError):
            return []

    @staticmethod
    def _log(root: Path, line: str) -> None:
        try:
            with open(root / "var" / "log" / "container.log", "a") as log:
                log.write(f"elastrain: {line}\n")
        except OSError:
            pass


def _batch_script(root: Path, address: str) -> str:
    """The job's batch script: announce the job and node, then become the container's init."""
    init = shlex.join(
        [sys.executable, "-m", "elastrain.backends.container_proc", "--root", str(root), "--address", address]
    )
    return f'#!/bin/sh\necho "elastrain: slurm job $SLURM_JOB_ID on node $SLURMD_NODENAME"\nexec {init}\n'


def _under(path: str, base: Path) -> bool:
    return bool(path) and (path == str(base) or path.startswith(str(base) + os.sep))


def _ready_pid(root: Path) -> int | None:
    """The init's pid from its ``ready`` file."""
    try:
        return int(read_whole(root / "ready", root.parent, max_bytes=256).split()[0])
    except (OSError, ValueError, IndexError, TenantFileError):
        return None
