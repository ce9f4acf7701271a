"""The Slurm configuration of a ``--framework slurm`` cluster, rendered from its hostfile.

Every container of the cluster renders the same ``slurm.conf`` from the hostfile it sees at
``/etc/mpi/hostfile`` (no file is shared, no configless fetch): the controller is ``<cluster>-launcher``
(slurmctld), the nodes are the hostfile's other hosts (``<cluster>-worker-<i>``, one slurmd each), in
one partition ``main``. Everything runs as the tenant (the containers' only user) without capabilities,
so ``SlurmUser``/``SlurmdUser`` are the tenant, process tracking is ``proctrack/linuxproc`` and there
are no cgroups, no accounting and no PAM. Each container's own files live under `SLURM_DIR` (its own
``/tmp``): the config, spool and state directories, logs, PID files and munge's socket; the container
backend points ``SLURM_CONF`` at `SLURM_CONF_PATH`, so ``sinfo``/``sbatch``/``srun`` find it.

Nothing here starts a process: `elastrain.agent.slurm_services` runs the daemons and re-renders on
every hostfile change.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from elastrain.hostfile import Hostfile

SLURM_DIR = Path("/tmp/elastrain-slurm")
SLURM_CONF_PATH = SLURM_DIR / "slurm.conf"  # elastrain.backends.container_run sets SLURM_CONF to it
MUNGE_DIR = SLURM_DIR / "munge"
MUNGE_SOCKET = MUNGE_DIR / "munge.socket"
TASK_PROLOG = SLURM_DIR / "task_prolog.sh"
CTLD_PORT, SLURMD_PORT = 6817, 6818
PARTITION = "main"
# variables each container sets for itself (`elastrain.agent.noded.CONTAINER_OWN`) that a job
# submitted from another container must not carry over: the task prolog sets the node's own values
# (CUDA_VISIBLE_DEVICES stays Slurm's or the submitter's: the containers' GPU counts are equal)
NODE_OWN_ENV = (
    "HOSTNAME",
    "ELASTRAIN_CONTAINER",
    "ELASTRAIN_CONTAINER_ROLE",
    "ELASTRAIN_CONTAINER_ADDRESS",
    "ELASTRAIN_VISIBLE_GPUS",
    "NVIDIA_VISIBLE_DEVICES",
)
_CLUSTER_NAME_BAD = re.compile(r"[^a-z0-9_-]+")


@dataclass(frozen=True)
class SlurmNode:
    """One slurmd: a worker container's host name, its CPUs and GPUs."""

    name: str
    cpus: int
    gpus: int = 0


@dataclass(frozen=True)
class SlurmLayout:
    """What slurm.conf says: the cluster, its controller, the user the daemons run as, the nodes."""

    cluster: str
    controller: str
    user: str
    nodes: tuple[SlurmNode, ...]
    base: Path = SLURM_DIR

    @property
    def node_names(self) -> tuple[str, ...]:
        """The nodes' names, in slurm.conf order."""
        return tuple(n.name for n in self.nodes)


def controller_host(cluster: str) -> str:
    """The launcher container's host name: where slurmctld runs."""
    return f"{cluster}-launcher"


def slurm_cluster_name(cluster: str) -> str:
    """A ClusterName for Slurm (lower case, letters, digits, ``_`` and ``-``) from the cluster's name."""
    name = _CLUSTER_NAME_BAD.sub("_", cluster.lower()).strip("_-")
    return (name or "elastrain")[:40]


def container_cpus(environ: Mapping[str, str], cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """The CPUs a container may use: the machine's, capped by its cgroup's ``cpu.max`` quota (``--cpus``).

    Every container of a cluster runs on one machine with the same limits, so each renders the same
    value. ``ELASTRAIN_SLURM_CPUS`` overrides it.
    """
    override = environ.get("ELASTRAIN_SLURM_CPUS", "")
    if override.isdigit() and int(override) > 0:
        return int(override)
    cpus = os.cpu_count() or 1
    try:
        quota, period = (cgroup / "cpu.max").read_text().split()[:2]
        if quota != "max":
            cpus = min(cpus, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return cpus


def gpu_count(environ: Mapping[str, str]) -> int:
    """The container's GPUs (its ``CUDA_VISIBLE_DEVICES``; every container of a cluster has as many)."""
    return len([g for g in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()])


def hostfile_workers(hostfile: Hostfile, controller: str) -> dict[str, int]:
    """The hostfile's hosts but the controller: worker name -> slots, in hostfile order."""
    return {h.name: h.slots for h in hostfile.hosts if h.name != controller}


def layout(environ: Mapping[str, str], workers: Mapping[str, int], extra: Iterable[str] = ()) -> SlurmLayout:
    """The layout of this container's cluster with `workers` (name -> slots) and `extra` nodes (ones
    that left the hostfile but are kept while jobs run on them, or this very worker)."""
    cluster = environ.get("ELASTRAIN_CLUSTER", "elastrain")
    cpus, gpus = container_cpus(environ), gpu_count(environ)
    names = dict(workers)
    for name in extra:
        names.setdefault(name, 1)
    nodes = tuple(SlurmNode(name, max(cpus, slots), gpus) for name, slots in names.items())
    user = environ.get("USER") or "elastrain"
    return SlurmLayout(slurm_cluster_name(cluster), controller_host(cluster), user, nodes)


def render_slurm_conf(lay: SlurmLayout) -> str:
    """slurm.conf for `lay` (identical in every container of the cluster for the same hostfile)."""
    base = lay.base
    lines = [
        "# rendered by elastrain from /etc/mpi/hostfile; rewritten (and slurmctld restarted) on scaling",
        f"ClusterName={lay.cluster}",
        f"SlurmctldHost={lay.controller}",
        f"SlurmUser={lay.user}",
        f"SlurmdUser={lay.user}",
        f"SlurmctldPort={CTLD_PORT}",
        f"SlurmdPort={SLURMD_PORT}",
        "AuthType=auth/munge",
        f"AuthInfo=socket={MUNGE_SOCKET}",
        "CredType=cred/munge",
        f"StateSaveLocation={base / 'state'}",
        f"SlurmdSpoolDir={base / 'spool'}",
        f"SlurmctldPidFile={base / 'slurmctld.pid'}",
        f"SlurmdPidFile={base / 'slurmd.pid'}",
        f"SlurmctldLogFile={base / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={base / 'log' / 'slurmd.log'}",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        # no root, no capabilities: no cgroups, no process containment beyond the container itself
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        f"TaskProlog={TASK_PROLOG}",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "SchedulerType=sched/backfill",
        # permit_job_expansion: a running job can take in new nodes (``--dependency=expand:JOB``)
        "SchedulerParameters=sched_min_interval=0,batch_sched_delay=0,bf_interval=1,permit_job_expansion",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SlurmdParameters=config_overrides",
        "ReturnToService=2",
        "MpiDefault=none",
        "MailProg=/bin/true",
        "TreeWidth=65533",  # slurmctld talks to every slurmd itself: no forwarding through other nodes
        "DebugFlags=NO_CONF_HASH",  # workers re-render a moment after the controller does
        "SlurmctldTimeout=30",
        "SlurmdTimeout=30",
        "MessageTimeout=10",
        "MinJobAge=60",
        "KillWait=10",
    ]
    gpus = any(n.gpus for n in lay.nodes)
    if gpus:
        lines.append("GresTypes=gpu")
    for node in lay.nodes:
        gres = f" Gres=gpu:{node.gpus}" if node.gpus else ""
        lines.append(f"NodeName={node.name} CPUs={node.cpus}{gres} State=UNKNOWN")
    if not lay.nodes:  # slurmctld refuses a config without nodes: a placeholder sinfo does not show
        lines.append(f"NodeName={lay.controller}-noworker CPUs=1 State=FUTURE")
    lines.append(f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def render_gres_conf(environ: Mapping[str, str], dev: Path = Path("/dev")) -> str:
    """This container's gres.conf: its GPU device nodes (``/dev/nvidiaN`` of ELASTRAIN_VISIBLE_GPUS),
    or a bare count where the nodes are not there; empty without GPUs."""
    count = gpu_count(environ)
    if not count:
        return ""
    ids = [g.strip() for g in environ.get("ELASTRAIN_VISIBLE_GPUS", "").split(",") if g.strip()]
    files = [dev / f"nvidia{g}" for g in ids]
    if len(files) == count and all(f.exists() for f in files):
        return "".join(f"Name=gpu File={f}\n" for f in files)
    return f"Name=gpu Count={count}\n"


def render_task_prolog(environ: Mapping[str, str]) -> str:
    """The task prolog: sets this node's own `NODE_OWN_ENV` values in every task it runs (Slurm
    carries the submitting container's environment over, e.g. the launcher's ``ELASTRAIN_CONTAINER``)."""
    lines = ["#!/bin/sh", "# elastrain: this container's own variables for every Slurm task it runs"]
    for name in NODE_OWN_ENV:
        value = environ.get(name)
        if value is not None and "\n" not in value:
            lines.append(f"echo 'export {name}={value}'" if "'" not in value else "")
    return "\n".join(line for line in lines if line) + "\n"


def write_if_changed(path: Path, text: str, mode: int = 0o644) -> bool:
    """Atomically replace `path` with `text` unless it already holds it; True when it changed."""
    try:
        if path.read_text() == text:
            return False
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return True
