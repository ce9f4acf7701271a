"""A paused (frozen) container is reported as Paused and kept: its job sees a hang, which the job's
heartbeat bound handles. It is never read as an exit: not failed, not removed, not replaced, and it
stays in the hostfile; unpaused, it is Running again; if its process dies meanwhile, it failed."""

from __future__ import annotations

from elastrain.backends.api import ContainerStatus
from elastrain.db.models import ClusterState, ContainerState
from tests.unit.test_server_policy import DRAIN, INV, NOW, actions, cluster, plan, row, up

HOSTS = "127.1.0.1 slots=1\n127.1.0.2 slots=1\n"


def running_cluster(worker_state: ContainerState = ContainerState.Running) -> object:
    rows = (row("c-launcher", pid=1, gpu=0), row("c-worker-0", worker_state, pid=2, gpu=1))
    return cluster(containers=rows, state=ClusterState.Running, hostfile_generation=1, hostfile_text=HOSTS)


def paused(name: str, pid: int) -> ContainerStatus:
    return ContainerStatus("c", name, pid, alive=True, ready=False, paused=True)


def test_a_paused_worker_is_marked_paused_and_nothing_else_happens() -> None:
    out = plan([running_cluster()], [up("c-launcher", 1), paused("c-worker-0", 2)], INV, NOW, DRAIN)
    assert actions(out) == [("mark_paused", "c-worker-0")]  # no mark_failed, remove, add or new hostfile


def test_a_paused_row_still_paused_is_left_alone() -> None:
    c = running_cluster(ContainerState.Paused)
    assert plan([c], [up("c-launcher", 1), paused("c-worker-0", 2)], INV, NOW, DRAIN) == []


def test_an_unpaused_container_is_running_again() -> None:
    c = running_cluster(ContainerState.Paused)
    out = plan([c], [up("c-launcher", 1), up("c-worker-0", 2)], INV, NOW, DRAIN)
    assert actions(out) == [("mark_running", "c-worker-0")]


def test_a_paused_container_whose_process_died_failed_and_is_replaced() -> None:
    c = running_cluster(ContainerState.Paused)
    out = plan([c], [up("c-launcher", 1), up("c-worker-0", 2, alive=False)], INV, NOW, DRAIN)
    acts = actions(out)
    assert ("mark_failed", "c-worker-0") in acts and ("add", "c-worker-0") in acts
