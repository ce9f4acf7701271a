"""The reconcile policy: a pure function from desired state (DB) and actual state (backend) to decisions.

The loop in `reconciler.py` applies the decisions; running the policy again on the result yields no
new decisions (idempotent), and a crash between two applied decisions is repaired on the next pass:
a row `Pending` whose process is up is adopted, a `Running` row whose process is gone is `Failed`,
a process without a row is stopped.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from elastrain.backends.api import ContainerStatus
from elastrain.db.models import ClusterState, ContainerRole, ContainerState, RestartPolicy
from elastrain.hostfile import Host
from elastrain.server.inventory import Inventory, allocate_address
from elastrain.server.membership import JobHosts


@dataclass(frozen=True)
class ContainerView:
    """A container row as the policy sees it."""

    name: str
    role: ContainerRole
    address: str
    gpu_ids: tuple[int, ...]
    state: ContainerState
    pid: int | None = None
    terminating_since: datetime | None = None


@dataclass(frozen=True)
class ClusterView:
    """A cluster row with its containers."""

    name: str
    uid: str
    desired_containers: int
    gpus_per_container: int
    state: ClusterState
    restart_policy: RestartPolicy
    hostfile_generation: int
    hostfile_text: str
    reason: str
    containers: tuple[ContainerView, ...] = ()
    admitted: bool = True  # False: queued by the scheduler, nothing starts
    size_reason: str = ""  # the scheduler's reason for the size (or for waiting)
    jobs: tuple[JobHosts, ...] = ()  # the running jobs and the hosts they last reported
    next_index: int = 0  # named hosts: the lowest worker index never used in this cluster
    gpu_type: str | None = None  # the GPU model its containers get (None: any)


class Action(str, enum.Enum):
    """What a decision does."""

    add = "add"  # insert a Pending row (address, GPUs) and start it
    start = "start"  # start the backend container of a Pending row
    mark_running = "mark_running"  # the process is up and ready (also: adopt after a restart)
    mark_failed = "mark_failed"  # the process died
    mark_paused = "mark_paused"  # frozen (paused): alive, a hang to its job, not an exit
    begin_terminate = "begin_terminate"  # scale-down: leave the hostfile, drain, then remove
    remove = "remove"  # stop the container and delete its row
    stop_orphan = "stop_orphan"  # a backend container without a row
    write_hostfile = "write_hostfile"
    set_cluster_state = "set_cluster_state"
    finalize_delete = "finalize_delete"  # stop everything of the cluster and delete it


@dataclass(frozen=True)
class Decision:
    """One step for the loop to carry out."""

    action: Action
    cluster: str
    container: str = ""
    role: ContainerRole | None = None
    address: str = ""
    gpu_ids: tuple[int, ...] = ()
    pid: int | None = None
    hosts: tuple[Host, ...] = ()
    generation: int = 0
    state: ClusterState | None = None
    reason: str = ""


@dataclass
class _Pool:
    """Addresses and GPUs taken so far in this pass (across clusters)."""

    addresses: set[str]
    free_gpus: list[int]
    extra: dict[str, int] = field(default_factory=dict)


_WORKER_INDEX = re.compile(r"-worker-(\d+)$")
_HOLDS_RESOURCES = (
    ContainerState.Pending,
    ContainerState.Running,
    ContainerState.Paused,
    ContainerState.Terminating,
)


def worker_index(name: str) -> int:
    """The N of ``<cluster>-worker-N`` (-1 for other names)."""
    match = _WORKER_INDEX.search(name)
    return int(match.group(1)) if match else -1


def plan(
    clusters: list[ClusterView],
    actual: list[ContainerStatus],
    inventory: Inventory,
    now: datetime,
    drain: timedelta,
    named_hosts: bool = False,
) -> list[Decision]:
    """Every decision needed to move the backend and the rows toward the desired state.

    With `named_hosts` (containers on their own networks) a container's address is its host name;
    otherwise a free loopback address."""
    used_gpus = [g for c in clusters for k in c.containers if k.state in _HOLDS_RESOURCES for g in k.gpu_ids]
    pool = _Pool({k.address for c in clusters for k in c.containers}, inventory.free_ids(used_gpus))
    by_key = {(s.cluster, s.name): s for s in actual}
    decisions: list[Decision] = []
    known = {(c.name, k.name) for c in clusters for k in c.containers}
    for status in actual:
        if (status.cluster, status.name) not in known:
            decisions.append(Decision(Action.stop_orphan, status.cluster, status.name))
    for cluster in clusters:
        decisions += _plan_cluster(cluster, by_key, pool, now, drain, inventory, named_hosts)
    return decisions


def _plan_cluster(
    cluster: ClusterView,
    actual: dict[tuple[str, str], ContainerStatus],
    pool: _Pool,
    now: datetime,
    drain: timedelta,
    inventory: Inventory,
    named_hosts: bool = False,
) -> list[Decision]:
    if cluster.state == ClusterState.Terminating:
        return [Decision(Action.finalize_delete, cluster.name)]
    if not cluster.admitted and not cluster.containers:
        reason = cluster.size_reason or "queued by the scheduler"
        if cluster.state != ClusterState.Pending or cluster.reason != reason:
            return [
                Decision(Action.set_cluster_state, cluster.name, state=ClusterState.Pending, reason=reason)
            ]
        return []
    if not cluster.admitted and cluster.desired_containers == 0:
        return _preempted(cluster)
    out: list[Decision] = []
    live: dict[str, ContainerView] = {}  # rows that stay Pending/Running after this pass
    running: set[str] = set()
    for row in cluster.containers:
        status = actual.get((cluster.name, row.name))
        alive = status is not None and status.alive
        if row.state == ContainerState.Pending:
            live[row.name] = row
            if alive and status is not None and status.ready:
                out.append(Decision(Action.mark_running, cluster.name, row.name, pid=status.pid))
                running.add(row.name)
            elif status is None:
                out.append(Decision(Action.start, cluster.name, row.name))
            elif not alive:
                why = status.exit_reason or "the container's init process exited before it was ready"
                out.append(_failed(cluster, row, why))
                live.pop(row.name)
        elif row.state in (ContainerState.Running, ContainerState.Paused):
            if alive and status is not None:
                # a paused (frozen) container is kept: its job sees a hang and its heartbeat bound
                # decides; it is neither replaced nor taken out of the hostfile
                live[row.name] = row
                running.add(row.name)
                if status.paused and row.state != ContainerState.Paused:
                    out.append(Decision(Action.mark_paused, cluster.name, row.name, pid=status.pid))
                elif (row.state == ContainerState.Paused and not status.paused) or status.pid != row.pid:
                    out.append(Decision(Action.mark_running, cluster.name, row.name, pid=status.pid))
            else:
                pid = row.pid if row.pid is not None else "?"
                why = status.exit_reason if status is not None and status.exit_reason else ""
                out.append(_failed(cluster, row, why or f"the container's init process (pid {pid}) exited"))
                if cluster.restart_policy == RestartPolicy.Always:
                    out.append(Decision(Action.remove, cluster.name, row.name))
        elif row.state == ContainerState.Failed:
            if cluster.restart_policy == RestartPolicy.Always:
                out.append(Decision(Action.remove, cluster.name, row.name))
        elif row.state == ContainerState.Terminating:
            since = row.terminating_since or now
            if not alive:
                why = "its init process had exited"
            elif workers_left(row.address, since, cluster.jobs):
                why = "its workers left" if cluster.jobs else "no job was running on it"
            elif now - since >= drain:
                why = f"the drain bound ({drain.total_seconds():g} s) passed before its workers left"
            else:
                continue
            out.append(Decision(Action.remove, cluster.name, row.name, reason=why))
    waiting = [
        f"{row.name}: {status.waiting_reason}"
        for row in live.values()
        if row.name not in running
        and (status := actual.get((cluster.name, row.name)))
        and status.waiting_reason
    ]  # why Pending containers wait, where the backend says (Kubernetes: the scheduler's reason)
    out += _scale(cluster, live, running, pool, inventory, named_hosts, waiting[:1])
    return out


def _preempted(cluster: ClusterView) -> list[Decision]:
    """A preempted cluster gives back every container at once (its job stops) and waits Pending."""
    reason = cluster.size_reason or "preempted by the scheduler"
    out = [Decision(Action.remove, cluster.name, k.name, reason=reason) for k in cluster.containers]
    if cluster.state != ClusterState.Pending or cluster.reason != reason:
        pending = ClusterState.Pending
        out.append(Decision(Action.set_cluster_state, cluster.name, state=pending, reason=reason))
    return out


def workers_left(address: str, since: datetime, jobs: tuple[JobHosts, ...]) -> bool:
    """Has every running job reported, after `since`, a membership without `address`?

    True at once without running jobs; a job that has not reported since (or never reports hosts)
    keeps the container until the drain bound.
    """
    return all(j.at is not None and j.at > since and address not in j.hosts for j in jobs)


def _failed(cluster: ClusterView, row: ContainerView, reason: str) -> Decision:
    return Decision(Action.mark_failed, cluster.name, row.name, reason=reason)


def _scale(
    cluster: ClusterView,
    live: dict[str, ContainerView],
    running: set[str],
    pool: _Pool,
    inventory: Inventory,
    named_hosts: bool = False,
    waiting: list[str] | None = None,
) -> list[Decision]:
    """Add or drain containers toward the desired count (GPU-gated), then hostfile and cluster state
    (a cluster not up yet is Pending with the first of `waiting`, why its containers wait, if any)."""
    out: list[Decision] = []
    kept_failed = [
        k for k in cluster.containers
        if k.state == ContainerState.Failed and cluster.restart_policy == RestartPolicy.Never
    ]  # fmt: skip
    launchers = [k for k in live.values() if k.role == ContainerRole.launcher]
    workers = sorted(
        (k for k in live.values() if k.role == ContainerRole.worker), key=lambda k: worker_index(k.name)
    )
    failed_workers = sum(1 for k in kept_failed if k.role == ContainerRole.worker)
    want_workers = cluster.desired_containers - 1 - failed_workers
    to_add: list[tuple[str, ContainerRole]] = []
    if not launchers and not any(k.role == ContainerRole.launcher for k in kept_failed):
        to_add.append((f"{cluster.name}-launcher", ContainerRole.launcher))
    taken = {k.name for k in cluster.containers if k.state == ContainerState.Terminating} | set(live)
    taken |= {k.name for k in kept_failed}
    # Named hosts never reuse a worker's name: a replaced container is a new host to a running job (and
    # to DNS), not an old one that a job may still hold a dead connection to.
    index = cluster.next_index if named_hosts else 0
    for _ in range(max(0, want_workers - len(workers))):
        while f"{cluster.name}-worker-{index}" in taken:
            index += 1
        taken.add(f"{cluster.name}-worker-{index}")
        to_add.append((f"{cluster.name}-worker-{index}", ContainerRole.worker))
    surplus = len(workers) - max(want_workers, 0)
    if surplus > 0:
        pending_first = sorted(
            workers, key=lambda k: (k.state == ContainerState.Pending, worker_index(k.name))
        )
        for row in reversed(pending_first[-surplus:]):  # Pending ones first, then the highest index
            out.append(Decision(Action.begin_terminate, cluster.name, row.name))
            live.pop(row.name)
            running.discard(row.name)
    reason = ""
    need = cluster.gpus_per_container
    gang = not running  # a cluster that is not up yet starts all of its containers or none
    usable = _usable_gpus(pool.free_gpus, inventory, cluster.gpu_type)
    if to_add and need * len(to_add) > len(usable) and (gang or need > len(usable)):
        missing = need * len(to_add)
        model = f"{cluster.gpu_type} " if cluster.gpu_type else ""
        reason = (
            f"waiting for GPUs: {len(to_add)} container(s) need {missing} {model}GPU(s), "
            f"{len(usable)} of {inventory.count(cluster.gpu_type)} free"
        )
        if gang:
            to_add = []
    for name, role in to_add:
        if need > len(usable):
            break
        gpu_ids = tuple(usable[:need])
        del usable[:need]
        pool.free_gpus = [g for g in pool.free_gpus if g not in gpu_ids]
        address = name if named_hosts else allocate_address(pool.addresses, inventory.address_octet)
        pool.addresses.add(address)
        out.append(Decision(Action.add, cluster.name, name, role=role, address=address, gpu_ids=gpu_ids))
    out += _hostfile(cluster, live, running)
    # a cluster whose workers were released (desired: the launcher alone) is up with its launcher
    up = any(live[n].role == ContainerRole.launcher for n in running) and (
        want_workers <= 0 or any(live[n].role == ContainerRole.worker for n in running)
    )
    state = ClusterState.Running if up else ClusterState.Pending
    if not reason and not up:
        reason = waiting[0] if waiting else "starting containers"
    if state != cluster.state or reason != cluster.reason:
        out.append(Decision(Action.set_cluster_state, cluster.name, state=state, reason=reason))
    return out


def _usable_gpus(free: list[int], inventory: Inventory, gpu_type: str | None) -> list[int]:
    """The free GPU ids a cluster may get: of its model only; without one, GPUs of no model first (so
    the named models stay for the clusters that ask for them), then the rest, lowest id first."""
    if gpu_type is not None:
        return [g for g in free if inventory.model_of(g) == gpu_type]
    return sorted(free, key=lambda g: (inventory.model_of(g) != "", g))


def hostfile_hosts(rows: list[ContainerView]) -> tuple[Host, ...]:
    """The hostfile lines for the Running containers: one host per container, slots = its GPUs (>= 1).

    The launcher container is listed first: as in the seed's Horovod clusters it runs a worker too, so a
    2-container cluster trains with ``-np 2`` and scaling to 4 containers gives 4 workers.
    """
    ordered = sorted(rows, key=lambda k: (k.role != ContainerRole.launcher, worker_index(k.name)))
    return tuple(Host(k.address, max(len(k.gpu_ids), 1)) for k in ordered)


def hosts_text(hosts: tuple[Host, ...]) -> str:
    """The host lines of a hostfile, without the generation line (what a change is judged on)."""
    return "".join(f"{h.name} slots={h.slots}\n" for h in hosts)


def _hostfile(cluster: ClusterView, live: dict[str, ContainerView], running: set[str]) -> list[Decision]:
    hosts = hostfile_hosts([live[n] for n in running])
    if hosts_text(hosts) == cluster.hostfile_text and cluster.hostfile_generation > 0:
        return []
    return [
        Decision(Action.write_hostfile, cluster.name, hosts=hosts, generation=cluster.hostfile_generation + 1)
    ]
