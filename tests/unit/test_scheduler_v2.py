"""Scheduler v2: hand-computed small traces per policy (exact JCTs) and the policies' new rules.

Speeds in the hand-computed traces are simple closed forms passed as ``speed=`` to both the policy
and the simulator (the same function drives both), so every JCT below can be checked on paper.
"""

from __future__ import annotations

import pytest

from elastrain.scheduler.api import ClusterState, DecisionKind, Job, Node, Start, apply, check_consistency
from elastrain.scheduler.elastic import ElasticPolicy
from elastrain.scheduler.simulator import SimConfig, simulate
from elastrain.scheduler.static import StaticBackfillPolicy, StaticPolicy
from elastrain.scheduler.throughput import job_speed, speedup
from elastrain.scheduler.tiresias import TiresiasPolicy
from elastrain.scheduler.trace import TraceJob


def linear(job: Job, w: int, nodes: int = 1) -> float:
    """Perfect scaling, placement-blind."""
    return float(w)


def node_penalty(job: Job, w: int, nodes: int = 1) -> float:
    """Perfect scaling on one node; every extra node halves the speed."""
    return w / 2.0 ** (nodes - 1)


def jcts(trace, policy, gpus, per_node=8, restart=0.0, speed=linear) -> dict[str, float]:
    cfg = SimConfig(gpus=gpus, gpus_per_node=per_node, restart_cost_s=restart)
    res = simulate(trace, policy, cfg, speed=speed)
    order = sorted(trace, key=lambda t: t.submit_s)
    # per-job JCTs: match finish order back to ids through submit + jct (ids are unique here)
    out: dict[str, float] = {}
    pending = {t.job_id: t for t in order}
    for jct, dur in zip(res.jct_s, res.duration_s):
        tj = next(t for t in pending.values() if t.duration_s == dur)
        out[tj.job_id] = jct
        del pending[tj.job_id]
    return out


# ------------------------------------------------------------------ hand-computed traces


BACKFILL = [TraceJob("a", 0, 1, 100), TraceJob("b", 10, 2, 50), TraceJob("c", 20, 1, 30)]


def test_static_blocks_and_static_backfill_skips() -> None:
    # 2 GPUs. static: a 0..100; b (2 GPUs) waits for a: 100..150; c waits behind b: 150..180
    assert jcts(BACKFILL, StaticPolicy(), 2) == pytest.approx({"a": 100, "b": 140, "c": 160})
    # backfill: c takes the free GPU at 20 and ends at 50; b still starts at 100
    assert jcts(BACKFILL, StaticBackfillPolicy(), 2) == pytest.approx({"a": 100, "b": 140, "c": 30})


def test_tiresias_preempts_at_the_threshold_and_resumes_with_the_restart_cost() -> None:
    trace = [TraceJob("long", 0, 2, 1000), TraceJob("short", 100, 1, 50)]
    pol = TiresiasPolicy(thresholds=(100.0,))
    # 2 GPUs. long reaches 100 GPU-s at t=50 (queue 1). short arrives at 100 in queue 0 and needs 1
    # GPU; long's gang of 2 no longer fits -> preempted with 100 s of work done. short 100..150
    # (JCT 50); long resumes at 150 with 900 s left: ends 1050 (no restart cost) or 1080 (30 s).
    assert jcts(trace, pol, 2) == pytest.approx({"long": 1050, "short": 50})
    assert jcts(trace, pol, 2, restart=30.0) == pytest.approx({"long": 1080, "short": 50})


def test_tiresias_places_on_the_nodes_with_the_most_free_gpus_and_pays_for_spreading() -> None:
    # 2 nodes of 2 GPUs. one (1 GPU, 100 s) lands on n000; spread (2 GPUs, 100 s, arriving at 10)
    # gets the free node n001 whole: 1 node, full speed -> JCT 100. With a 1-GPU job on each node
    # first, a 2-GPU gang must span both nodes and runs at half speed (node_penalty): 200 s.
    packed = [TraceJob("one", 0, 1, 100), TraceJob("gang", 10, 2, 100)]
    assert jcts(packed, TiresiasPolicy(), 4, per_node=2, speed=node_penalty)["gang"] == pytest.approx(100)
    spread = [TraceJob("x", 0, 1, 1000), TraceJob("y", 1, 1, 1000), TraceJob("gang", 10, 2, 100)]
    got = jcts(spread, TiresiasPolicy(), 4, per_node=2, speed=node_penalty)
    assert got["gang"] == pytest.approx(200) and got["x"] == pytest.approx(1000)


def test_elastic_hand_computed_shrink_to_admit_then_grow_back() -> None:
    # 4 GPUs on one node, linear speed, default bounds: min 1, max max(1, 4 per node) = 4.
    trace = [TraceJob("a", 0, 1, 400), TraceJob("b", 50, 1, 100)]
    # No restart cost. a starts at 4 GPUs (rate 4): 200 s of work done by t=50. b arrives: ranked
    # after a (same level, later), gets its minimum 1 by shrinking a to 3: a's 200 s left take
    # 66.67 s -> ends 116.67. b has done 66.67 of 100 by then, grows to 4: 33.33 / 4 = 8.33 s more
    # -> ends 125, JCT 75.
    assert jcts(trace, ElasticPolicy(speed=linear), 4, per_node=4) == pytest.approx(
        {"a": 116.6667, "b": 75.0}
    )
    # 30 s per resize: a stalls 50..80, then 200 s / 3 = 66.67 -> ends 146.67. b (first start free)
    # has done 96.67 by then; it grows to 4 and stalls 146.67..176.67, then 3.33 / 4 = 0.83 s:
    # ends 177.5, JCT 127.5.
    got = jcts(trace, ElasticPolicy(speed=linear), 4, per_node=4, restart=30.0)
    assert got == pytest.approx({"a": 146.6667, "b": 127.5})


def test_elastic_preempts_the_most_served_job_when_jobs_outnumber_gpus() -> None:
    # 1 GPU. old (1 GPU, 10,000 s) has 2 GPU-h of service at t=7200 (level 1 of the default 2 h
    # threshold); new (1 GPU, 100 s) arrives then at level 0 and takes the GPU: 7200..7300, JCT 100.
    # old resumes at 7300 with 2,800 s left (restart cost 0): ends 10,100.
    trace = [TraceJob("old", 0, 1, 10_000), TraceJob("new", 7200, 1, 100)]
    got = jcts(trace, ElasticPolicy(speed=linear), 1)
    assert got == pytest.approx({"old": 10_100, "new": 100})


# ------------------------------------------------------------------ policy rules


def cluster(gpus: int, per_node: int = 8) -> ClusterState:
    return ClusterState.empty(gpus, per_node)


def test_tiresias_skips_a_job_that_does_not_fit_instead_of_blocking() -> None:
    s = cluster(4).with_arrivals([Job("big", 8, 8, arrival_s=0), Job("small", 1, 1, arrival_s=1)])
    s = apply(cluster(8).with_arrivals([Job("hog", 6, 6)]), [Start("hog", 6)]).with_arrivals(
        [Job("big", 4, 4, arrival_s=1), Job("small", 1, 1, arrival_s=2)]
    )
    out = TiresiasPolicy().decide(s)
    assert [(d.kind, d.job_id) for d in out if d.kind is not DecisionKind.WAIT] == [
        (DecisionKind.START, "small")
    ]
    assert any(d.kind is DecisionKind.WAIT and d.job_id == "big" for d in out)


def test_elastic_skips_a_blocked_minimum_and_the_starvation_guard_promotes_it() -> None:
    pol = ElasticPolicy(speed=linear, starvation_s=100.0)
    base = apply(cluster(8).with_arrivals([Job("hog", 2, 2)]), [Start("hog", 2)])
    # big needs 8 (min 8), only 6 free: skipped; small behind it starts
    s = base.with_arrivals([Job("big", 8, 8, arrival_s=1), Job("small", 1, 1, arrival_s=2)])
    s = apply(s, pol.decide(s))
    check_consistency(s)
    assert {j.id for j in s.running} == {"hog", "small"} and [j.id for j in s.queued] == ["big"]
    # 100 s later big has starved: it goes first, the lower-ranked running jobs make room
    s = s.with_time(200.0)
    out = pol.decide(s)
    s = apply(s, out)
    assert [j.id for j in s.running] == ["big"] and {j.id for j in s.queued} == {"hog", "small"}
    assert pol.next_wakeup_s(s) is not None


def test_elastic_growth_accounts_for_the_node_a_step_would_add() -> None:
    # 2 nodes of 4 GPUs; a job on one node with node_penalty speed: a 5th GPU on the second node
    # would halve its speed, so it stops at 4 -- and with a job already on the other node, too.
    s = cluster(8, 4).with_arrivals([Job("a", 1, 8)])
    s = apply(s, ElasticPolicy(speed=node_penalty).decide(s))
    assert [(j.workers, j.nodes) for j in s.running] == [(4, 1)]
    # with placement-blind speeds the same job would take all 8
    s2 = cluster(8, 4).with_arrivals([Job("a", 1, 8)])
    s2 = apply(s2, ElasticPolicy(speed=linear).decide(s2))
    assert [(j.workers, j.nodes) for j in s2.running] == [(8, 2)]


def test_throughput_model_uses_the_placements_node_count() -> None:
    # 8 GPUs of bert: on one 8-GPU node clearly faster than spread over two nodes
    assert speedup("bert", 8, 1) > 1.5 * speedup("bert", 8, 2)
    job = Job("j", 1, 8, model="bert")
    assert job_speed(job, 8, 1) == speedup("bert", 8, 1) and job_speed(job, 8, 2) == speedup("bert", 8, 2)
    assert speedup("bert", 1, 5) == 1.0  # one GPU spans one node whatever it is told


def test_elastic_keeps_higher_priority_extras_from_lower_priority_minimums() -> None:
    s = apply(cluster(4).with_arrivals([Job("vip", 1, 4, priority=2)]), [Start("vip", 4)])
    s = s.with_arrivals([Job("low", 1, 1, arrival_s=1)])
    assert [d.kind for d in ElasticPolicy(speed=linear).decide(s)] == [DecisionKind.WAIT]


def test_elastic_never_preempts_a_better_ranked_job() -> None:
    nodes = (Node("n0", 2, 2),)
    s = ClusterState(nodes=nodes).with_arrivals([Job("a", 1, 1, arrival_s=0), Job("b", 1, 1, arrival_s=1)])
    s = apply(s, [Start("a", 1), Start("b", 1)])
    s = s.with_arrivals([Job("c", 1, 1, arrival_s=2)])  # same level, later: waits
    out = ElasticPolicy(speed=linear).decide(s)
    assert [(d.kind, d.job_id) for d in out] == [(DecisionKind.WAIT, "c")]
