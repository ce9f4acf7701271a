"""A short trace the control plane and the simulator must schedule alike (issue 28, "one scheduler"),
and the simulator's decisions on it, as ``(kind, job, workers after)``.

Used by the in-process test (reconciler + fake backend) and the end-to-end one (a real server)."""

from __future__ import annotations

from elastrain.scheduler.api import ClusterState, Decision, DecisionKind, Policy
from elastrain.scheduler.registry import make_policy
from elastrain.scheduler.simulator import SimConfig, simulate
from elastrain.scheduler.trace import TraceJob

GPUS = 6
# (id, submit s, GPUs asked, min, max, duration s, the job's elastrain run range)
TRACE = (
    ("a", 0.0, 4, 2, 4, 1e6, "--min-np 2 --max-np 4"),
    ("b", 100.0, 2, 2, 2, 200.0, "-np 2"),
    ("c", 200.0, 2, 2, 2, 200.0, "-np 2"),
    ("d", 500.0, 2, 2, 2, 1e6, "-np 2"),
)
STEPS = ("+a", "+b", "+c", "-b", "-c", "+d")  # the trace's events in time order (arrival +, end -)
DECISIONS_AFTER = {"+a": 1, "+b": 2, "+c": 4, "-b": 5, "-c": 5, "+d": 6}  # decisions made by each step
Decided = tuple[str, str, int]


class Recording(Policy):
    """A policy with every start, resize and preemption it decides noted as (kind, job, workers after)."""

    name = "elastic"

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.log: list[Decided] = []

    def decide(self, state: ClusterState) -> list[Decision]:
        """``inner``'s decisions, noted."""
        decisions = self.inner.decide(state)
        for d in decisions:
            if d.kind in (DecisionKind.START, DecisionKind.GROW, DecisionKind.SHRINK):
                self.log.append((d.kind.value, d.job_id, getattr(d, "workers", 0)))
            elif d.kind is DecisionKind.PREEMPT:
                self.log.append(("preempt", d.job_id, 0))
        return decisions

    def next_wakeup_s(self, state: ClusterState) -> float | None:
        """``inner``'s."""
        return self.inner.next_wakeup_s(state)


def simulator_decisions() -> list[Decided]:
    """What ``elastrain simulate --compare elastic``'s policy decides on `TRACE` (one node, no
    restart cost: the control plane's clusters resize without a modelled stall)."""
    trace = [TraceJob(j, t, n, dur, min_gpus=lo, max_gpus=hi) for j, t, n, lo, hi, dur, _ in TRACE]
    policy = Recording(make_policy("elastic"))
    simulate(trace, policy, SimConfig(gpus=GPUS, gpus_per_node=GPUS, restart_cost_s=0.0))
    return policy.log


def event_decision(action: str, name: str, before: int, after: int) -> Decided:
    """A scheduler event of the control plane as a decision of `Recording`'s form."""
    kind = {"cluster.admitted": "start", "cluster.preempted": "preempt"}.get(action)
    return (kind or ("grow" if after > before else "shrink"), name, after)
