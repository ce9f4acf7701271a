"""The queue indexes a cluster state keeps between decisions (elastrain.scheduler.queue_index).

Invariant: after any sequence of arrivals, starts, preemptions and finishes, the incrementally kept
ranking equals a full re-sort of the queue, and the policies decide exactly what a full re-rank of
every job decides. SCHED_EXAMPLES=2000 runs more examples.
"""

from __future__ import annotations

import bisect
import os
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from elastrain.scheduler.api import (
    ClusterState,
    Decision,
    Finish,
    InvalidDecision,
    Job,
    Node,
    Policy,
    Preempt,
    Start,
    Wait,
    apply,
    check_consistency,
)
from elastrain.scheduler.elastic import ElasticPolicy
from elastrain.scheduler.queue_index import NeedKind, QueueRanking, need_of
from elastrain.scheduler.ranking import rank_jobs
from elastrain.scheduler.tiresias import MAX_WAITS, TiresiasPolicy

SETTINGS = settings(max_examples=int(os.environ.get("SCHED_EXAMPLES", "80")), deadline=None)
THRESHOLDS = (100.0, 2000.0)


@st.composite
def clusters(draw: st.DrawFn) -> ClusterState:
    sizes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    return ClusterState(nodes=tuple(Node(f"n{i}", g, g) for i, g in enumerate(sizes)))


@st.composite
def jobs(draw: st.DrawFn, idx: int) -> Job:
    lo = draw(st.integers(1, 3))
    hi = draw(st.integers(lo, lo + 3))
    return Job(
        id=f"j{idx:02d}",
        min_workers=lo,
        max_workers=hi,
        requested_workers=draw(st.integers(lo, hi)),
        gpus_per_worker=draw(st.sampled_from([1, 1, 2])),
        priority=draw(st.integers(0, 2)),
        arrival_s=float(draw(st.integers(0, 20))),
        attained_gpu_s=float(draw(st.sampled_from([0, 0, 50, 500, 5000]))),
    )


@st.composite
def job_lists(draw: st.DrawFn) -> list[Job]:
    return [draw(jobs(i)) for i in range(draw(st.integers(1, 14)))]


def full_rank(state: ClusterState, kind: NeedKind) -> list[Job]:
    """The queue re-sorted from scratch by (priority, level, arrival, id)."""

    def key(j: Job) -> tuple[int, int, float, str]:
        return (-j.priority, bisect.bisect_right(THRESHOLDS, j.attained_gpu_s), j.arrival_s, j.id)

    return sorted(state.queued, key=key)


def assert_ranking_matches(state: ClusterState, data: st.DataObject) -> None:
    for kind in NeedKind:
        ranking = state.queue_ranking(THRESHOLDS, kind)
        expected = full_rank(state, kind)
        assert [j.id for j in ranking.ranked()] == [j.id for j in expected]
        # a cursor with a shrinking bound: the jobs within the bound at the time, in rank order
        cursor, walked, want = ranking.cursor(), [], []
        bound = data.draw(st.integers(1, 8))
        rest = list(expected)
        while (entry := cursor.peek(bound)) is not None:
            want.append(next(j for j in rest if need_of(j, kind) <= bound))
            rest = rest[rest.index(want[-1]) + 1 :]
            walked.append(entry[-1])
            cursor.advance()
            bound -= data.draw(st.integers(0, 2))
        if bound >= 1:
            want.extend(j for j in rest if need_of(j, kind) <= bound)
        assert [j.id for j in walked] == [j.id for j in want]
        multi = [j.waiting_since() for j in state.queued if need_of(j, kind) > 1]
        assert ranking.earliest_multi_gpu_wait() == (min(multi) if multi else None)
    for job in state.queued:
        assert state.queued_job(job.id) is job
    assert state.queued_job("ghost") is None


@SETTINGS
@given(data=st.data(), base=clusters(), js=job_lists())
def test_the_kept_ranking_equals_a_full_resort_after_random_changes(data, base, js) -> None:
    state = base
    pending = list(js)
    state.queue_ranking(THRESHOLDS, NeedKind.MINIMUM)  # built once, then only handed over
    for _ in range(data.draw(st.integers(1, 10))):
        kept = state.queue_ranking(THRESHOLDS, NeedKind.MINIMUM)
        arrive = data.draw(st.integers(0, len(pending)))
        state = state.with_arrivals(pending[:arrive])
        pending = pending[arrive:]
        ops: list[Decision] = []
        queued_ids = [j.id for j in state.queued]
        for jid in data.draw(st.lists(st.sampled_from(queued_ids), unique=True)) if queued_ids else []:
            job = state.queued_job(jid)
            assert job is not None
            ops.append(data.draw(st.sampled_from([Start(jid, job.min_workers), Finish(jid), Wait(jid)])))
        for job in state.running:
            ops.append(data.draw(st.sampled_from([Preempt(job.id), Finish(job.id), Wait(job.id)])))
        try:
            new = apply(state, ops)
        except InvalidDecision:  # a start that does not fit: the whole batch is refused
            new = apply(state, [d for d in ops if not isinstance(d, Start)])
        aged = [replace(j, attained_gpu_s=j.attained_gpu_s + 700.0) for j in new.running]
        state = new.with_time(new.now_s + 60.0, aged)
        check_consistency(state)
        assert state.queue_ranking(THRESHOLDS, NeedKind.MINIMUM) is kept  # updated, not rebuilt
        assert_ranking_matches(state, data)


def test_a_state_derived_twice_still_answers_correctly() -> None:
    base = ClusterState.empty(4).with_arrivals([Job("a", 1, 1, arrival_s=1), Job("b", 2, 2, arrival_s=0)])
    ranking = base.queue_ranking(THRESHOLDS, NeedKind.REQUESTED)
    one = base.with_arrivals([Job("c", 1, 1, arrival_s=2)])  # takes the ranking over
    two = base.with_arrivals([Job("d", 1, 1, arrival_s=3)])  # the parent's is stale: rebuilt
    assert one.queue_ranking(THRESHOLDS, NeedKind.REQUESTED) is ranking
    assert [j.id for j in one.queue_ranking(THRESHOLDS, NeedKind.REQUESTED).ranked()] == ["b", "a", "c"]
    assert [j.id for j in two.queue_ranking(THRESHOLDS, NeedKind.REQUESTED).ranked()] == ["b", "a", "d"]
    assert [j.id for j in base.queue_ranking(THRESHOLDS, NeedKind.REQUESTED).ranked()] == ["b", "a"]
    assert isinstance(base.queue_ranking(THRESHOLDS, NeedKind.REQUESTED), QueueRanking)


def tiresias_full_rerank(policy: TiresiasPolicy, state: ClusterState) -> list[Decision]:
    """Tiresias as it was written before the incremental queue: re-rank every job, walk them all."""
    now = state.now_s
    ranked = rank_jobs(state.running, state.queued, policy.thresholds, now)
    budget, kept, last = state.total_gpus, set(), -1
    for i, job in enumerate(ranked):
        need = job.requested * job.gpus_per_worker
        if need <= budget:
            kept.add(job.id)
            budget -= need
            last = i
            if budget <= 0:
                break
    inv = state.inventory()
    out: list[Decision] = []
    for job in state.running:
        if job.id not in kept:
            inv.remove_all(job.id, job.gpus_per_worker)
            reason = f"preempted (queue {policy.level(job, now)} after {job.attained_at(now):.0f} GPU-s)"
            out.append(Preempt(job.id, reason=reason))
    waits: list[Decision] = []
    for i, job in enumerate(ranked):
        if i > last and len(waits) >= MAX_WAITS:
            break
        if job.placement:
            continue
        n, gpw = job.requested, job.gpus_per_worker
        if job.id in kept and inv.capacity(gpw) >= n:
            inv.add(job.id, gpw, n)
            out.append(Start(job.id, n, reason=f"queue {policy.level(job, now)}: started at {n} worker(s)"))
        elif len(waits) < MAX_WAITS:
            waits.append(Wait(job.id, reason=f"queue {policy.level(job, now)}: waiting for {n * gpw} GPUs"))
    return out + waits


class FullRankElastic(ElasticPolicy):
    """The elastic policy always on its full-ranking path (what it did before the incremental queue)."""

    def _may_starve(self, queue: QueueRanking, now_s: float) -> bool:
        return True


def closed_loop(data: st.DataObject, base: ClusterState, js: list[Job], policy: Policy, reference) -> None:
    state, pending = base, list(js)
    for _ in range(data.draw(st.integers(1, 10))):
        arrive = data.draw(st.integers(0, len(pending)))
        state = state.with_arrivals(pending[:arrive])
        pending = pending[arrive:]
        if state.running and data.draw(st.booleans()):
            state = apply(state, [Finish(data.draw(st.sampled_from(state.running)).id)])
        aged = [replace(j, attained_gpu_s=j.attained_gpu_s + 900.0) for j in state.running]
        state = state.with_time(state.now_s + data.draw(st.sampled_from([60.0, 3600.0])), aged)
        out = policy.decide(state)
        assert out == reference(state)
        assert policy.next_wakeup_s(state) == reference_policy_wakeup(policy, state)
        state = apply(state, out)


def reference_policy_wakeup(policy: Policy, state: ClusterState) -> float | None:
    """``next_wakeup_s`` recomputed on a copy of the state without its cached indexes."""
    return policy.next_wakeup_s(ClusterState(state.nodes, state.running, state.queued, state.now_s))


@SETTINGS
@given(data=st.data(), base=clusters(), js=job_lists())
def test_tiresias_decides_as_a_full_rerank(data, base, js) -> None:
    policy = TiresiasPolicy(thresholds=THRESHOLDS)
    closed_loop(data, base, js, policy, lambda s: tiresias_full_rerank(policy, s))


@SETTINGS
@given(
    data=st.data(),
    base=clusters(),
    js=job_lists(),
    preemptive=st.booleans(),
    starve=st.sampled_from([60.0, 3600.0, 6 * 3600.0]),
)
def test_elastic_decides_as_with_the_full_ranking(data, base, js, preemptive, starve) -> None:
    kw = {"thresholds": THRESHOLDS, "starvation_s": starve, "preemptive": preemptive}
    policy, full = ElasticPolicy(**kw), FullRankElastic(**kw)
    closed_loop(
        data, base, js, policy, lambda s: full.decide(ClusterState(s.nodes, s.running, s.queued, s.now_s))
    )
