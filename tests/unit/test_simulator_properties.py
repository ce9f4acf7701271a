"""Property tests of whole simulations on random small traces, for every policy.

A checking wrapper sits between the simulator and the policy. At every decision it applies the
policy's decisions itself and checks the result (no GPU double-booked, capacity never exceeded,
every running job within its min..max), and it integrates each job's progress *independently* from
the placements it saw (same speed function, same restart rule) to check that work is conserved
across resizes and preemptions: a job finishes exactly when its trace work is done.

SCHED_EXAMPLES=500 runs more examples (30 by default, to keep the unit suite fast).
"""

from __future__ import annotations

import math
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elastrain.scheduler.api import ClusterState, Decision, DecisionKind, Policy, apply, check_consistency
from elastrain.scheduler.registry import POLICIES, make_policy
from elastrain.scheduler.simulator import SimConfig, simulate
from elastrain.scheduler.throughput import job_speed
from elastrain.scheduler.trace import TraceJob

SETTINGS = settings(max_examples=int(os.environ.get("SCHED_EXAMPLES", "30")), deadline=None)


class Checked(Policy):
    """Wraps a policy; checks the inventory after each decision and integrates progress on its own."""

    def __init__(self, inner: Policy, trace: list[TraceJob], config: SimConfig) -> None:
        self.inner, self.name, self.config = inner, inner.name, config
        self.work = {t.job_id: t.duration_s for t in trace}
        self.done: dict[str, float] = {}
        self.stall_until: dict[str, float] = {}
        self.started: set[str] = set()
        self.finished: set[str] = set()
        self.last: ClusterState | None = None

    def decide(self, state: ClusterState) -> list[Decision]:
        now, gpn = state.now_s, self.config.gpus_per_node
        if self.last is not None:
            t0 = self.last.now_s
            for job in self.last.running:
                busy = now - max(t0, self.stall_until.get(job.id, -math.inf))
                if busy > 0:
                    base = job_speed(job, job.requested, -(-job.requested // gpn))
                    rate = job_speed(job, job.workers, job.nodes) / base
                    self.done[job.id] = self.done.get(job.id, 0.0) + busy * rate
            present = {j.id for j in state.running}
            for job in self.last.running:
                if job.id not in present:  # finished since: all of its work, no more
                    assert self.done[job.id] == pytest.approx(self.work[job.id], rel=1e-6, abs=1e-6)
                    self.finished.add(job.id)
        out = self.inner.decide(state)
        new = apply(state, out)
        check_consistency(new)
        assert sum(j.gpus for j in new.running) + new.free_gpus == new.total_gpus
        assert all(n.free >= 0 for n in new.nodes)
        for job in new.running:
            assert job.min_workers <= job.workers <= job.max_workers
        for d in out:
            if d.kind is DecisionKind.START:
                if d.job_id in self.started:
                    self.stall_until[d.job_id] = now + self.config.restart_cost_s
                self.started.add(d.job_id)
            elif d.kind not in (DecisionKind.WAIT, DecisionKind.PREEMPT):
                self.stall_until[d.job_id] = now + self.config.restart_cost_s
        self.last = new
        return out

    def next_wakeup_s(self, state: ClusterState) -> float | None:
        return self.inner.next_wakeup_s(state)


@st.composite
def traces(draw: st.DrawFn) -> tuple[list[TraceJob], SimConfig]:
    per_node = draw(st.sampled_from([1, 2, 4]))
    gpus = per_node * draw(st.integers(1, 3))
    n = draw(st.integers(1, 8))
    jobs = []
    for i in range(n):
        g = draw(st.integers(1, gpus))
        low = draw(st.sampled_from([0, 1, g]))
        high = draw(st.sampled_from([0, g, g + 2]))
        jobs.append(
            TraceJob(
                f"j{i}",
                float(draw(st.integers(0, 3000))),
                g,
                float(draw(st.integers(1, 20000))),
                min_gpus=low,
                max_gpus=high,
            )
        )
    restart = float(draw(st.sampled_from([0, 30])))
    return jobs, SimConfig(gpus=gpus, gpus_per_node=per_node, restart_cost_s=restart)


@SETTINGS
@given(case=traces(), name=st.sampled_from(sorted(POLICIES)))
def test_simulations_keep_the_inventory_and_conserve_work(case, name) -> None:
    jobs, config = case
    checked = Checked(make_policy(name), jobs, config)
    res = simulate(jobs, checked, config)
    assert len(res.jct_s) == len(jobs)  # every job finishes
    # the simulator decides once more after the last completions: every job's work was checked
    assert checked.finished == {j.job_id for j in jobs}
    for jct, dur, wait in zip(res.jct_s, res.duration_s, res.wait_s):
        assert wait >= -1e-9 and jct >= wait - 1e-9
        assert dur >= 0
    assert res.gpu_seconds <= config.gpus * (res.last_finish_s - res.first_submit_s) + 1e-6
    assert res.work_gpu_seconds == pytest.approx(sum(j.duration_s * j.num_gpus for j in jobs))
