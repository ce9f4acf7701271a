"""Property tests: no decision sequence breaks the inventory; policies only emit valid decisions.

SCHED_EXAMPLES=2000 runs more examples (80 by default, to keep the unit suite fast).
"""

from __future__ import annotations

import os
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

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
from elastrain.scheduler.static import StaticBackfillPolicy, StaticPolicy
from elastrain.scheduler.throughput import model_names
from elastrain.scheduler.tiresias import TiresiasPolicy

SETTINGS = settings(max_examples=int(os.environ.get("SCHED_EXAMPLES", "80")), deadline=None)


@st.composite
def clusters(draw: st.DrawFn) -> ClusterState:
    sizes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    return ClusterState(nodes=tuple(Node(f"n{i}", g, g) for i, g in enumerate(sizes)))


@st.composite
def jobs(draw: st.DrawFn, idx: int) -> Job:
    lo = draw(st.integers(1, 3))
    hi = draw(st.integers(lo, lo + 3))
    return Job(
        id=f"j{idx}",
        min_workers=lo,
        max_workers=hi,
        requested_workers=draw(st.integers(lo, hi)),
        gpus_per_worker=draw(st.sampled_from([1, 1, 2])),
        priority=draw(st.integers(0, 2)),
        arrival_s=float(draw(st.integers(0, 20))),
        model=draw(st.sampled_from(("", *model_names()))),
        attained_gpu_s=float(draw(st.sampled_from([0, 0, 50, 5000]))),
    )


@st.composite
def job_lists(draw: st.DrawFn) -> list[Job]:
    n = draw(st.integers(1, 7))
    return [draw(jobs(i)) for i in range(n)]


def decisions(ids: list[str]) -> st.SearchStrategy:
    job_id = st.sampled_from([*ids, "ghost"])
    workers = st.integers(0, 7)
    return st.one_of(
        st.builds(Start, job_id, workers),
        st.builds(Grow, job_id, workers),
        st.builds(Shrink, job_id, workers),
        st.builds(PreemptToMin, job_id),
        st.builds(Preempt, job_id),
        st.builds(Wait, job_id),
        st.builds(Finish, job_id),
    )


def gpus_accounted(state: ClusterState) -> bool:
    used = sum(j.gpus for j in state.running)
    return used + state.free_gpus == state.total_gpus and all(
        j.min_workers <= j.workers <= j.max_workers for j in state.running
    )


@SETTINGS
@given(data=st.data(), base=clusters(), js=job_lists())
def test_any_decision_sequence_keeps_the_inventory_consistent(data, base, js) -> None:
    state = base.with_arrivals(js)
    batches = data.draw(st.lists(st.lists(decisions([j.id for j in js]), max_size=4), max_size=12))
    for batch in batches:
        try:
            new = apply(state, batch)
        except InvalidDecision:
            continue  # refused as a whole; `state` is immutable and still valid
        check_consistency(new)
        assert gpus_accounted(new)
        state = new


POLICIES = (
    StaticPolicy,
    StaticBackfillPolicy,
    lambda: ElasticPolicy(min_gain=0.0),
    ElasticPolicy,
    lambda: ElasticPolicy(preemptive=False),
    TiresiasPolicy,
)


@SETTINGS
@given(data=st.data(), base=clusters(), js=job_lists())
def test_policies_emit_only_valid_decisions_in_a_closed_loop(data, base, js) -> None:
    """Random arrivals, completions and service growth; every policy's decisions apply cleanly."""
    make = data.draw(st.sampled_from(POLICIES))
    policy = make()
    state = base
    pending = list(js)
    for _ in range(data.draw(st.integers(1, 8))):
        arrive = data.draw(st.integers(0, len(pending)))
        state = state.with_arrivals(pending[:arrive])
        pending = pending[arrive:]
        if state.running and data.draw(st.booleans()):
            victim = data.draw(st.sampled_from(state.running))
            state = apply(state, [Finish(victim.id)])
        aged = [replace(j, attained_gpu_s=j.attained_gpu_s + 1000.0) for j in state.running]
        state = state.with_time(state.now_s + 60.0, aged)
        before = {j.id: j.workers for j in state.running}
        out = policy.decide(state)
        if isinstance(policy, ElasticPolicy) and not policy.preemptive:
            assert all(d.kind is not DecisionKind.PREEMPT for d in out)
        state = apply(state, out)  # raises if the policy produced an invalid decision
        check_consistency(state)
        assert gpus_accounted(state)
        for job in state.running:  # never below the minimum, and static/tiresias never resize
            assert job.workers >= job.min_workers
            if not isinstance(policy, ElasticPolicy):
                assert job.workers == job.requested
            elif job.id in before and job.workers < before[job.id]:
                assert job.reason.startswith("shrunk")
