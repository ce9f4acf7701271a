"""A pod that cannot be placed: the backend reports it alive with the scheduler's reason
(`ContainerStatus.waiting_reason`), and the reconcile policy makes that the Pending cluster's reason."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from elastrain.backends.api import ContainerStatus
from elastrain.backends.kubernetes_status import pod_state
from elastrain.db.models import ClusterState, ContainerRole, ContainerState, RestartPolicy
from elastrain.server.inventory import Inventory
from elastrain.server.policy import Action, ClusterView, ContainerView, plan

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
WHY = "not scheduled: 0/1 nodes are available: 1 Insufficient nvidia.com/gpu."


def _cluster(reason: str = "") -> ClusterView:
    rows = tuple(
        ContainerView(name, role, f"127.1.0.{i + 1}", (i,), ContainerState.Pending, None)
        for i, (name, role) in enumerate(
            [("c-launcher", ContainerRole.launcher), ("c-worker-0", ContainerRole.worker)]
        )
    )
    return ClusterView(
        name="c", uid="u", desired_containers=2, gpus_per_container=1, state=ClusterState.Pending,
        restart_policy=RestartPolicy.Always, hostfile_generation=0, hostfile_text="", reason=reason,
        containers=rows,
    )  # fmt: skip


def _states(out: list) -> list[tuple[ClusterState | None, str]]:
    return [(d.state, d.reason) for d in out if d.action == Action.set_cluster_state]


def test_the_scheduler_reason_is_the_pending_clusters_reason() -> None:
    actual = [
        ContainerStatus("c", "c-launcher", None, True, False, waiting_reason=WHY),
        ContainerStatus("c", "c-worker-0", None, True, False, waiting_reason=WHY),
    ]
    out = plan([_cluster()], actual, Inventory(8, False), NOW, timedelta(seconds=3))
    assert _states(out) == [(ClusterState.Pending, f"c-launcher: {WHY}")]
    assert not [d for d in out if d.action in (Action.mark_failed, Action.remove, Action.start)]
    again = plan([_cluster(f"c-launcher: {WHY}")], actual, Inventory(8, False), NOW, timedelta(seconds=3))
    assert _states(again) == []  # unchanged: no new decision


def test_without_a_waiting_reason_the_cluster_is_starting() -> None:
    actual = [ContainerStatus("c", n, None, True, False) for n in ("c-launcher", "c-worker-0")]
    out = plan([_cluster()], actual, Inventory(8, False), NOW, timedelta(seconds=3))
    assert _states(out) == [(ClusterState.Pending, "starting containers")]


def test_an_unschedulable_pod_is_alive_and_says_why() -> None:
    pod = {
        "metadata": {"labels": {"elastrain.io/cluster": "c", "elastrain.io/container": "c-launcher"}},
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": WHY.removeprefix("not scheduled: "),
                }
            ],
        },
    }
    state = pod_state(pod)
    assert state.alive and not state.ready and state.unschedulable and state.waiting_reason == WHY
