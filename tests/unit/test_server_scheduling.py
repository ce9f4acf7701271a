"""The control plane's scheduling step as pure functions: state building, decisions -> targets."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from elastrain.db.models import ClusterState, RestartPolicy
from elastrain.scheduler import api
from elastrain.scheduler.elastic import ElasticPolicy
from elastrain.scheduler.static import StaticPolicy
from elastrain.server.errors import InvalidRequest
from elastrain.server.inventory import Inventory
from elastrain.server.policy import Action, ClusterView, plan
from elastrain.server.scheduling import (
    ClusterDemand,
    Target,
    build_state,
    measured_throughput,
    plan_targets,
)
from elastrain.server.validation import check_bounds


def demand(name: str, desired: int, low: int, high: int, **kw: object) -> ClusterDemand:
    fields: dict = dict(
        name=name, desired=desired, min_containers=low, max_containers=high, gpus_per_container=1
    )
    fields.update(kw)
    return ClusterDemand(**fields)


def schedule(demands: list[ClusterDemand], gpus: int = 4, policy: api.Policy | None = None) -> list[Target]:
    state = build_state(demands, gpus, 100.0)
    return plan_targets(state, (policy or ElasticPolicy()).decide(state))


def settle(demands: list[ClusterDemand], targets: list[Target]) -> list[ClusterDemand]:
    """What the DB holds after the targets are written (what :meth:`ClusterScheduler.run` does)."""
    by_name = {t.cluster: t for t in targets if t.admitted}
    return [
        replace(d, desired=by_name[d.name].containers, admitted=True) if d.name in by_name else d
        for d in demands
    ]


def test_build_state_runs_admitted_clusters_at_their_desired_size_and_queues_the_rest() -> None:
    state = build_state([demand("a", 4, 2, 4), demand("b", 2, 2, 2, admitted=False, arrival_s=5.0)], 4, 10.0)
    assert [(j.id, j.workers, j.gpus) for j in state.running] == [("a", 4, 4)]
    assert [j.id for j in state.queued] == ["b"] and state.free_gpus == 0
    api.check_consistency(state)


def test_build_state_leaves_out_a_cluster_that_no_longer_fits() -> None:
    state = build_state([demand("a", 3, 3, 3), demand("b", 3, 3, 3, arrival_s=1.0)], 4, 10.0)
    assert [j.id for j in state.running] == ["a"] and state.free_gpus == 1
    api.check_consistency(state)


def test_queue_order_respects_priority_over_arrival() -> None:
    state = build_state(
        [
            demand("old", 2, 2, 2, admitted=False, arrival_s=1.0),
            demand("vip", 2, 2, 2, admitted=False, arrival_s=9.0, priority=5),
        ],
        4,
        10.0,
    )
    assert [j.id for j in state.queued] == ["vip", "old"]


def test_a_lone_elastic_cluster_starts_and_grows_into_every_idle_gpu() -> None:
    targets = schedule([demand("a", 2, 2, 4, admitted=False)])
    assert [(t.cluster, t.containers, t.admitted) for t in targets] == [("a", 4, True)]
    assert "grown into 2 idle GPUs" in targets[0].reason and "container(s)" in targets[0].reason


def test_an_arriving_cluster_gets_its_minimum_by_shrinking_the_elastic_one() -> None:
    demands = [demand("a", 4, 2, 4), demand("b", 2, 2, 2, admitted=False, arrival_s=5.0)]
    targets = {t.cluster: t for t in schedule(demands)}
    assert (targets["a"].containers, targets["a"].reason) == (2, "shrunk for cluster b")
    assert targets["b"].containers == 2 and targets["b"].admitted
    settled = settle(demands, list(targets.values()))
    assert schedule(settled) == []  # idempotent: the next pass changes nothing


def test_a_cluster_that_cannot_get_its_minimum_waits_with_a_reason() -> None:
    targets = schedule([demand("a", 4, 4, 4), demand("b", 2, 2, 2, admitted=False, arrival_s=5.0)])
    assert [(t.cluster, t.admitted) for t in targets] == [("b", False)]
    assert "waiting for 2 GPUs" in targets[0].reason


def test_a_higher_priority_cluster_is_not_shrunk_for_a_lower_one() -> None:
    demands = [demand("a", 4, 2, 4, priority=3), demand("b", 2, 2, 2, admitted=False, arrival_s=5.0)]
    targets = schedule(demands)
    assert [(t.cluster, t.admitted) for t in targets] == [("b", False)]


def test_static_policy_starts_at_the_requested_size_and_never_resizes() -> None:
    targets = schedule([demand("a", 3, 2, 4, admitted=False)], policy=StaticPolicy())
    assert [(t.cluster, t.containers) for t in targets] == [("a", 3)]
    assert schedule(settle([demand("a", 3, 2, 4, admitted=False)], targets), policy=StaticPolicy()) == []


def test_measured_throughput_maps_world_sizes_to_container_counts() -> None:
    reports = [(1, 100.0), (1, 120.0), (2, 200.0), (None, 5.0), (3, None), (4, 300.0)]
    assert measured_throughput(reports, 1) == ((2, 110.0), (3, 200.0), (5, 300.0))
    assert measured_throughput([(4, 80.0)], 2) == ((3, 80.0),)  # 4 ranks on 2-GPU workers


def test_measured_throughput_drives_growth_decisions() -> None:
    flat = ((2, 100.0), (3, 100.5), (4, 101.0))  # adding GPUs does not help: do not grow
    targets = schedule([demand("a", 2, 2, 4, admitted=False, throughput=flat)])
    assert [(t.cluster, t.containers) for t in targets] == [("a", 2)]


@pytest.mark.parametrize(
    ("containers", "low", "high", "message"),
    [
        (2, 1, 4, "min_containers must be at least 2"),
        (2, 3, 4, "min_containers <= containers <= max_containers"),
        (5, 2, 4, "min_containers <= containers <= max_containers"),
        (2, 2, 500, "max_containers must be at most"),
    ],
)
def test_check_bounds_refuses_with_a_message(containers: int, low: int, high: int, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        check_bounds(containers, low, high)


def test_check_bounds_defaults_to_the_requested_count() -> None:
    assert check_bounds(3, None, None) == (3, 3)
    assert check_bounds(3, 2, None) == (2, 3)


def test_reconciler_holds_a_queued_cluster_pending_with_the_schedulers_reason() -> None:
    view = ClusterView(
        "b", "u", 2, 1, ClusterState.Pending, RestartPolicy.Always, 0, "", "starting containers",
        admitted=False, size_reason="waiting for 2 GPUs (0 free)",
    )  # fmt: skip
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    out = plan([view], [], Inventory(4, False), now, timedelta(seconds=1))
    assert [(d.action, d.reason) for d in out] == [(Action.set_cluster_state, "waiting for 2 GPUs (0 free)")]
    assert plan([replace(view, reason="waiting for 2 GPUs (0 free)")], [], Inventory(4, False), now,
                timedelta(seconds=1)) == []  # fmt: skip
