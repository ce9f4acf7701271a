"""Scheduler policies and `apply` on small hand-made states."""

from __future__ import annotations

import pytest

from elastrain.errors import ElastrainError
from elastrain.scheduler.api import (
    ClusterState,
    DecisionKind,
    Finish,
    Grow,
    InvalidDecision,
    Job,
    Node,
    Preempt,
    PreemptToMin,
    Shrink,
    Start,
    Wait,
    apply,
    check_consistency,
)
from elastrain.scheduler.elastic import ElasticPolicy
from elastrain.scheduler.ranking import rank_jobs
from elastrain.scheduler.registry import POLICIES, PolicyName, make_policy
from elastrain.scheduler.static import StaticPolicy
from elastrain.scheduler.tiresias import TiresiasPolicy


def linear(job: Job, w: int, nodes: int = 1) -> float:
    """Perfect scaling."""
    return float(w)


def cluster(gpus: int, per_node: int = 8) -> ClusterState:
    return ClusterState.empty(gpus, per_node)


def run(state: ClusterState, policy, rounds: int = 1) -> ClusterState:
    for _ in range(rounds):
        state = apply(state, policy.decide(state))
        check_consistency(state)
    return state


def sizes(state: ClusterState) -> dict[str, int]:
    return {j.id: j.workers for j in state.running}


def reasons(state: ClusterState) -> dict[str, str]:
    return {j.id: j.reason for j in state.running}


# ------------------------------------------------------------------ apply


def test_apply_starts_grows_shrinks_and_finishes() -> None:
    s = cluster(4, 2).with_arrivals([Job("a", 1, 4), Job("b", 1, 2)])
    s = apply(s, [Start("a", 2, reason="go")])
    assert sizes(s) == {"a": 2} and s.free_gpus == 2 and [j.id for j in s.queued] == ["b"]
    s = apply(s, [Grow("a", 3), Start("b", 1)])
    assert sizes(s) == {"a": 3, "b": 1} and s.free_gpus == 0
    s = apply(s, [Shrink("a", 1, reason="shrunk for cluster b"), Grow("b", 2)])
    assert sizes(s) == {"a": 1, "b": 2} and reasons(s)["a"] == "shrunk for cluster b"
    s = apply(s, [Finish("a")])
    assert sizes(s) == {"b": 2} and s.free_gpus == 2
    check_consistency(s)


@pytest.mark.parametrize(
    "decisions",
    [
        [Start("a", 5)],  # above max
        [Start("b", 1)],  # below b's gang minimum
        [Start("a", 4), Start("b", 2)],  # 6 GPUs on a 4-GPU cluster: double-booking
        [Start("a", 2), Shrink("a", 1)],  # below a's minimum
        [Start("a", 2), Grow("a", 5)],  # above max
        [Start("a", 2), Start("a", 2)],  # already running
        [Grow("a", 3)],  # not running
        [Start("zzz", 1)],  # unknown
        [Wait("zzz")],
        [Finish("zzz")],
    ],
)
def test_apply_refuses_invalid_decisions_and_leaves_state_alone(decisions) -> None:
    s = cluster(4, 2).with_arrivals([Job("a", 2, 4), Job("b", 2, 2)])
    before = s
    with pytest.raises(InvalidDecision):
        apply(s, decisions)
    assert s == before and s.free_gpus == 4
    assert issubclass(InvalidDecision, ElastrainError)


def test_multi_gpu_workers_stay_on_one_node() -> None:
    s = cluster(6, 3).with_arrivals([Job("a", 1, 4, gpus_per_worker=2)])
    # two nodes of 3 GPUs hold only one 2-GPU worker each
    with pytest.raises(InvalidDecision):
        apply(s, [Start("a", 3)])
    s = apply(s, [Start("a", 2)])
    assert s.free_gpus == 2 and all(count == 1 for _, count in s.running[0].placement)


def test_preempt_requeues_in_arrival_order() -> None:
    s = cluster(2).with_arrivals([Job("a", arrival_s=0), Job("b", arrival_s=5), Job("c", arrival_s=9)])
    s = apply(s, [Start("a", 1), Start("b", 1)])
    s = apply(s, [Preempt("a", reason="for c"), Start("c", 1)])
    assert [j.id for j in s.queued] == ["a"] and sizes(s) == {"b": 1, "c": 1}
    check_consistency(s)


# ------------------------------------------------------------------ static


def test_static_is_fifo_gang_at_requested_size_and_never_resizes() -> None:
    jobs = [
        Job("a", 1, 8, requested_workers=3, arrival_s=0),
        Job("b", 1, 8, requested_workers=4, arrival_s=1),
        Job("c", 1, 1, arrival_s=2),
    ]
    s = run(cluster(6).with_arrivals(jobs), StaticPolicy())
    # b (4) does not fit in the 3 left; c would, but FIFO does not skip the head
    assert sizes(s) == {"a": 3} and [j.id for j in s.queued] == ["b", "c"]
    decisions = StaticPolicy().decide(s)
    assert [d.kind for d in decisions] == [DecisionKind.WAIT] and "4 GPUs" in decisions[0].reason
    s = run(apply(s, [Finish("a")]), StaticPolicy())
    assert sizes(s) == {"b": 4, "c": 1} and s.free_gpus == 1


def test_static_priority_jumps_the_queue() -> None:
    jobs = [Job("low", arrival_s=0), Job("high", priority=5, arrival_s=10)]
    s = run(cluster(1).with_arrivals(jobs), StaticPolicy())
    assert sizes(s) == {"high": 1}


# ------------------------------------------------------------------ elastic


def test_elastic_starts_at_minimum_then_grows_into_idle_gpus() -> None:
    s = run(cluster(8).with_arrivals([Job("a", 2, 6)]), ElasticPolicy(linear))
    assert sizes(s) == {"a": 6} and s.free_gpus == 2  # capped at max
    assert "grown into 4 idle GPUs" in reasons(s)["a"]


def test_elastic_gives_idle_gpus_to_the_best_marginal_gain() -> None:
    def speed(job: Job, w: int, nodes: int = 1) -> float:
        return float(w) if job.id == "scales" else min(w, 1) * 1.0  # "flat" gains nothing past 1

    jobs = [Job("flat", 1, 8, arrival_s=0), Job("scales", 1, 8, arrival_s=1)]
    s = run(cluster(8).with_arrivals(jobs), ElasticPolicy(speed))
    assert sizes(s) == {"flat": 1, "scales": 7}


def test_elastic_measured_throughput_overrides_the_model() -> None:
    measured = ((1, 100.0), (2, 101.0))  # a second worker is useless for this job
    jobs = [Job("m", 1, 4, throughput=measured, model="cifar10"), Job("model", 1, 4, model="cifar10")]
    s = run(cluster(4).with_arrivals(jobs), ElasticPolicy())
    assert sizes(s) == {"m": 1, "model": 3}


def test_elastic_admits_a_waiting_job_by_shrinking_others() -> None:
    s = run(cluster(8).with_arrivals([Job("a", 2, 8, arrival_s=0)]), ElasticPolicy(linear))
    assert sizes(s) == {"a": 8}
    s = s.with_arrivals([Job("b", 3, 8, arrival_s=5)])
    decisions = ElasticPolicy(linear).decide(s)
    kinds = [d.kind for d in decisions]
    assert kinds.index(DecisionKind.SHRINK) < kinds.index(DecisionKind.START)
    s = apply(s, decisions)
    check_consistency(s)
    assert sizes(s)["b"] >= 3 and sizes(s)["a"] >= 2 and s.free_gpus == 0
    assert reasons(s)["a"] == "shrunk for cluster b"


def test_elastic_never_shrinks_below_minimum_and_keeps_the_job_waiting() -> None:
    jobs = [Job("a", 3, 4, arrival_s=0), Job("b", 3, 4, arrival_s=1)]
    s = run(cluster(8).with_arrivals(jobs), ElasticPolicy(linear))
    assert sizes(s) == {"a": 4, "b": 4}
    s = s.with_arrivals([Job("c", 3, 3, arrival_s=2)])
    decisions = ElasticPolicy(linear).decide(s)
    # a and b can give only 1 GPU each above their minimum of 3: c (3) does not fit, nothing shrinks
    assert [d.kind for d in decisions] == [DecisionKind.WAIT] and decisions[0].job_id == "c"


def test_elastic_lower_priority_job_cannot_shrink_a_higher_one() -> None:
    s = run(cluster(4).with_arrivals([Job("vip", 1, 4, priority=5)]), ElasticPolicy(linear))
    s = run(s.with_arrivals([Job("low", 1, 4, priority=0, arrival_s=1)]), ElasticPolicy(linear))
    assert sizes(s) == {"vip": 4} and [j.id for j in s.queued] == ["low"]


def test_elastic_higher_priority_job_preempts_lower_to_minimum() -> None:
    s = run(cluster(4).with_arrivals([Job("low", 2, 4)]), ElasticPolicy(linear))
    s = s.with_arrivals([Job("vip", 2, 2, priority=5, arrival_s=1)])
    decisions = ElasticPolicy(linear).decide(s)
    assert decisions[0] == PreemptToMin("low", reason="shrunk to its minimum for cluster vip")
    s = apply(s, decisions)
    assert sizes(s) == {"low": 2, "vip": 2}


def test_elastic_shrinks_lower_priority_first() -> None:
    jobs = [Job("p1", 1, 4, priority=1), Job("p0", 1, 4, priority=0, arrival_s=1)]
    s = apply(cluster(8).with_arrivals(jobs), [Start("p1", 4), Start("p0", 4)])
    s = s.with_arrivals([Job("new", 2, 2, priority=1, arrival_s=3)])
    s = apply(s, ElasticPolicy(linear).decide(s))
    assert sizes(s) == {"p1": 4, "p0": 2, "new": 2}


def test_elastic_is_stable_when_nothing_changes() -> None:
    jobs = [Job("a", 1, 3), Job("b", 2, 4, arrival_s=1), Job("c", 1, 1, arrival_s=2)]
    s = run(cluster(8).with_arrivals(jobs), ElasticPolicy(linear))
    assert ElasticPolicy(linear).decide(s) == []


# ------------------------------------------------------------------ tiresias


def test_tiresias_preempts_jobs_with_more_attained_service() -> None:
    pol = TiresiasPolicy(thresholds=(100.0,))
    s = run(cluster(2).with_arrivals([Job("old", 2, 2)]), pol)
    old = s.running[0]
    s = s.with_time(500.0, [Job("old", 2, 2, placement=old.placement, attained_gpu_s=1000.0)])
    s = s.with_arrivals([Job("new", 1, 1, arrival_s=400.0)])
    decisions = pol.decide(s)
    assert [d.kind for d in decisions] == [DecisionKind.PREEMPT, DecisionKind.START]
    s = apply(s, decisions)
    assert sizes(s) == {"new": 1} and [j.id for j in s.queued] == ["old"]
    assert s.queued[0].attained_gpu_s == 2000.0  # 1000 + 2 GPUs x 500 s, kept while queued


def test_attained_service_accrues_while_running_and_is_folded_on_changes() -> None:
    s = cluster(4).with_arrivals([Job("a", 1, 4)]).with_time(100.0)
    s = apply(s, [Start("a", 2)])
    assert s.running[0].attained_at(160.0) == pytest.approx(120.0)
    s = apply(s.with_time(160.0), [Grow("a", 4)])
    assert s.running[0].attained_gpu_s == pytest.approx(120.0)
    assert s.running[0].attained_at(170.0) == pytest.approx(160.0)
    s = apply(s.with_time(170.0), [Preempt("a")])
    assert s.queued[0].attained_at(1e6) == pytest.approx(160.0)


def test_tiresias_candidate_order_is_priority_then_queue_then_arrival() -> None:
    pol = TiresiasPolicy(thresholds=(100.0,))
    queued = [
        Job("p1-old-served", priority=1, arrival_s=0, attained_gpu_s=500),
        Job("p1-new", priority=1, arrival_s=5),
        Job("p0-old-served", arrival_s=1, attained_gpu_s=200),
        Job("p0-a", arrival_s=2),
        Job("p0-b", arrival_s=3),
    ]
    state = cluster(1).with_arrivals(queued)
    assert [j.id for j in rank_jobs((), state.queued, pol.thresholds, 0.0)] == [
        "p1-new",
        "p1-old-served",
        "p0-a",
        "p0-b",
        "p0-old-served",
    ]


def test_tiresias_does_not_preempt_within_the_same_queue_and_wakes_at_threshold() -> None:
    pol = TiresiasPolicy(thresholds=(100.0,))
    s = run(cluster(2).with_arrivals([Job("a", 2, 2)]), pol)
    s = run(s.with_arrivals([Job("b", 1, 1, arrival_s=1.0)]), pol)
    assert sizes(s) == {"a": 2} and [j.id for j in s.queued] == ["b"]
    assert pol.next_wakeup_s(s) == pytest.approx(50.0)  # 100 GPU-s at 2 GPUs


def test_tiresias_respects_priority_over_attained_service() -> None:
    pol = TiresiasPolicy(thresholds=(100.0,))
    s = apply(cluster(1).with_arrivals([Job("vip", priority=3)]), [Start("vip", 1)])
    vip = s.running[0]
    s = s.with_time(0.0, [Job("vip", priority=3, placement=vip.placement, attained_gpu_s=1e6)])
    s = run(s.with_arrivals([Job("fresh", arrival_s=1.0)]), pol)
    assert sizes(s) == {"vip": 1}


def test_registry() -> None:
    assert (
        set(POLICIES) == {p.value for p in PolicyName} == {"static", "static-backfill", "elastic", "tiresias"}
    )
    assert make_policy(PolicyName.STATIC_BACKFILL).name == "static-backfill"
    assert make_policy("tiresias", 2.0).thresholds == (7200.0,)  # type: ignore[attr-defined]
    assert TiresiasPolicy().thresholds == (16 * 3600.0,)  # the Pollux artifact's 16 GPU-hours
    assert make_policy("elastic").name == "elastic"
    with pytest.raises(ElastrainError, match="unknown policy"):
        make_policy("nope")


def test_node_and_job_validation() -> None:
    with pytest.raises(InvalidDecision):
        Node("n", 2, 3)
    with pytest.raises(InvalidDecision):
        Job("j", 3, 2)
    with pytest.raises(InvalidDecision):
        Job("j", 1, 4, requested_workers=5)


def test_tiresias_candidate_order_with_three_queues() -> None:
    pol = TiresiasPolicy(thresholds=(100.0, 1000.0))
    queued = [
        Job("q2", arrival_s=0, attained_gpu_s=5000),
        Job("q1", arrival_s=1, attained_gpu_s=500),
        Job("q0", arrival_s=2),
    ]
    state = cluster(1).with_arrivals(queued)
    assert [j.id for j in rank_jobs((), state.queued, pol.thresholds, 0.0)] == ["q0", "q1", "q2"]
