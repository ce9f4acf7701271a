"""The reconcile policy as a pure function: start, adopt, fail+replace, scale, GPU gating, idempotency."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from elastrain.backends.api import ContainerStatus
from elastrain.db.models import ClusterState, ContainerRole, ContainerState, RestartPolicy
from elastrain.server.inventory import Inventory
from elastrain.server.membership import JobHosts
from elastrain.server.policy import Action, ClusterView, ContainerView, Decision, hosts_text, plan

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
DRAIN = timedelta(seconds=3)
INV = Inventory(8, False)


def cluster(
    desired: int = 2, gpus: int = 1, containers: tuple[ContainerView, ...] = (), **kw: object
) -> ClusterView:
    fields: dict = dict(
        name="c",
        uid="u",
        desired_containers=desired,
        gpus_per_container=gpus,
        state=ClusterState.Pending,
        restart_policy=RestartPolicy.Always,
        hostfile_generation=0,
        hostfile_text="",
        reason="",
        containers=containers,
    )
    fields.update(kw)
    return ClusterView(**fields)


def row(
    name: str,
    state: ContainerState = ContainerState.Running,
    pid: int | None = 10,
    gpu: int = 0,
    address: str = "",
) -> ContainerView:
    role = ContainerRole.launcher if name.endswith("launcher") else ContainerRole.worker
    return ContainerView(name, role, address or f"127.1.0.{gpu + 1}", (gpu,), state, pid)


def up(name: str, pid: int = 10, ready: bool = True, alive: bool = True) -> ContainerStatus:
    return ContainerStatus("c", name, pid, alive, ready)


def actions(decisions: list[Decision]) -> list[tuple[str, str]]:
    return [(d.action.value, d.container) for d in decisions]


def test_new_cluster_adds_launcher_and_workers_with_distinct_addresses_and_gpus() -> None:
    out = plan([cluster(desired=3)], [], INV, NOW, DRAIN)
    adds = [d for d in out if d.action == Action.add]
    assert [d.container for d in adds] == ["c-launcher", "c-worker-0", "c-worker-1"]
    assert len({d.address for d in adds}) == 3 and all(d.address.startswith("127.") for d in adds)
    assert sorted(g for d in adds for g in d.gpu_ids) == [0, 1, 2]


def test_steady_state_is_idempotent() -> None:
    rows = (row("c-launcher", pid=1, gpu=0), row("c-worker-0", pid=2, gpu=1))
    hosts = "127.1.0.1 slots=1\n127.1.0.2 slots=1\n"
    c = cluster(containers=rows, state=ClusterState.Running, hostfile_generation=1, hostfile_text=hosts)
    assert plan([c], [up("c-launcher", 1), up("c-worker-0", 2)], INV, NOW, DRAIN) == []


def test_pending_row_with_live_ready_process_is_adopted_not_duplicated() -> None:
    rows = (
        row("c-launcher", ContainerState.Pending, pid=None),
        row("c-worker-0", ContainerState.Pending, None, 1),
    )
    out = plan([cluster(containers=rows)], [up("c-launcher", 5), up("c-worker-0", 6)], INV, NOW, DRAIN)
    assert ("mark_running", "c-launcher") in actions(out) and ("mark_running", "c-worker-0") in actions(out)
    assert not [d for d in out if d.action in (Action.add, Action.start)]
    hostfile = next(d for d in out if d.action == Action.write_hostfile)
    assert hosts_text(hostfile.hosts) == "127.1.0.1 slots=1\n127.1.0.2 slots=1\n"  # launcher first


def test_dead_worker_is_failed_removed_and_replaced_and_leaves_the_hostfile() -> None:
    rows = (row("c-launcher", pid=1, gpu=0), row("c-worker-0", pid=2, gpu=1))
    c = cluster(
        containers=rows,
        state=ClusterState.Running,
        hostfile_generation=1,
        hostfile_text="127.1.0.1 slots=1\n127.1.0.2 slots=1\n",
    )
    out = plan([c], [up("c-launcher", 1), up("c-worker-0", 2, alive=False)], INV, NOW, DRAIN)
    acts = actions(out)
    assert acts.index(("mark_failed", "c-worker-0")) < acts.index(("remove", "c-worker-0"))
    assert ("add", "c-worker-0") in acts
    hostfile = next(d for d in out if d.action == Action.write_hostfile)
    assert hosts_text(hostfile.hosts) == "127.1.0.1 slots=1\n" and hostfile.generation == 2


def test_orphan_process_without_row_is_stopped() -> None:
    out = plan([], [ContainerStatus("gone", "gone-worker-0", 7, True, True)], INV, NOW, DRAIN)
    assert actions(out) == [("stop_orphan", "gone-worker-0")]


def test_scale_down_drains_highest_workers_then_removes_after_grace() -> None:
    rows = (row("c-launcher", pid=1, gpu=0), row("c-worker-0", pid=2, gpu=1), row("c-worker-1", pid=3, gpu=2))
    c = cluster(desired=2, containers=rows, state=ClusterState.Running)
    out = plan([c], [up("c-launcher", 1), up("c-worker-0", 2), up("c-worker-1", 3)], INV, NOW, DRAIN)
    assert ("begin_terminate", "c-worker-1") in actions(out)
    hostfile = next(d for d in out if d.action == Action.write_hostfile)
    assert [h.name for h in hostfile.hosts] == ["127.1.0.1", "127.1.0.2"]
    draining = ContainerView(
        "c-worker-1", ContainerRole.worker, "127.1.0.3", (2,), ContainerState.Terminating, 3, NOW
    )
    silent_job = (JobHosts(7, None, frozenset()),)  # a job that does not report its hosts: the bound applies
    c2 = cluster(desired=2, containers=(*rows[:2], draining), state=ClusterState.Running, jobs=silent_job)
    live = [up("c-launcher", 1), up("c-worker-0", 2), up("c-worker-1", 3)]
    assert ("remove", "c-worker-1") not in actions(plan([c2], live, INV, NOW + timedelta(seconds=1), DRAIN))
    assert ("remove", "c-worker-1") in actions(plan([c2], live, INV, NOW + timedelta(seconds=4), DRAIN))


def test_cluster_waits_pending_with_reason_when_gpus_are_short() -> None:
    out = plan([cluster(desired=3, gpus=4)], [], INV, NOW, DRAIN)
    assert not [d for d in out if d.action == Action.add]
    state = next(d for d in out if d.action == Action.set_cluster_state)
    assert (
        state.state == ClusterState.Pending
        and "waiting for GPUs" in state.reason
        and "8 of 8 free" in state.reason
    )


def test_terminating_cluster_is_finalized() -> None:
    out = plan([cluster(state=ClusterState.Terminating)], [], INV, NOW, DRAIN)
    assert actions(out) == [("finalize_delete", "")]


def test_scale_down_waits_until_the_running_jobs_report_that_the_workers_left() -> None:
    rows = (row("c-launcher", pid=1, gpu=0), row("c-worker-0", pid=2, gpu=1))
    draining = ContainerView(
        "c-worker-1", ContainerRole.worker, "127.1.0.3", (2,), ContainerState.Terminating, 3, NOW
    )
    live = [up("c-launcher", 1), up("c-worker-0", 2), up("c-worker-1", 3)]
    later = NOW + timedelta(seconds=1)
    both = frozenset({"127.1.0.1", "127.1.0.2"})

    def removed(*jobs: JobHosts) -> bool:
        c = cluster(desired=2, containers=(*rows, draining), state=ClusterState.Running, jobs=jobs)
        return ("remove", "c-worker-1") in actions(plan([c], live, INV, later, timedelta(seconds=30)))

    assert removed()  # no job trains on it: it goes at once
    assert not removed(JobHosts(1, None, frozenset()))  # a job that never reported hosts: wait the bound
    assert not removed(JobHosts(1, NOW - timedelta(seconds=1), both))  # reported before the drain began
    assert not removed(JobHosts(1, later, both | {"127.1.0.3"}))  # still a member
    assert removed(JobHosts(1, later, both))
    assert not removed(JobHosts(1, later, both), JobHosts(2, None, frozenset()))  # every job must report
