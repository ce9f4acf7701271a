"""One cluster's hanging reconcile step never stalls the others: each cluster's steps of a pass run in
a thread of their own with a deadline, and a cluster whose steps hang is shown ``Degraded``.

A pass waits for its clusters' steps together, at most `STEP_DEADLINE_S`. A cluster whose steps are
still running (past the deadline: a backend call blocked on something its tenant controls) is left
out of later passes until they return; meanwhile it is shown Degraded with why, and its trail gets a
``cluster.degraded`` event. Other sources of trouble (e.g. the job monitor finding a job's log is a
FIFO) report clusters the same way. When the steps return and no source reports the cluster, the
policy's own state decision (Running or Pending) applies again: it recovers without anyone acting.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from elastrain.db.models import ClusterState
from elastrain.server.bounded import BoundedCalls, Overloaded, Pending, TimedOut
from elastrain.server.policy import Action, ClusterView, Decision

log = logging.getLogger("elastrain.reconciler")
STEP_DEADLINE_S = 20.0  # podman starting a container on a loaded machine takes a few seconds
T = TypeVar("T")
Troubles = Callable[[], Mapping[str, str]]


class ClusterSteps:
    """Runs each cluster's steps off the reconcile thread, with a deadline, one run per cluster at once."""

    def __init__(self, deadline_s: float = STEP_DEADLINE_S, wake: Callable[[], None] | None = None) -> None:
        self.deadline_s = deadline_s
        self.calls = BoundedCalls(
            "reconcile steps", deadline_s, per_key=1, total=256, on_done=lambda _key: wake and wake()
        )
        self.troubles: list[Troubles] = []  # other sources of clusters to show Degraded (name -> why)

    def busy(self, cluster: str) -> bool:
        """An earlier run of `cluster`'s steps has not returned yet."""
        return self.calls.busy(cluster)

    def run(self, groups: Mapping[str, Callable[[], T]]) -> dict[str, T]:
        """Start every cluster's steps at once (not a cluster still busy) and wait for them together, at
        most the deadline; the results of those that returned."""
        started: dict[str, Pending[T]] = {}
        for cluster, steps in groups.items():
            try:
                started[cluster] = self.calls.submit(cluster, steps)
            except Overloaded:
                continue  # its earlier steps still run
        end = time.monotonic() + self.deadline_s
        results: dict[str, T] = {}
        for cluster, pending in started.items():
            try:
                results[cluster] = pending.wait(end - time.monotonic())
            except TimedOut:
                log.warning("reconcile steps of cluster %s still run after %g s", cluster, self.deadline_s)
        return results

    def degraded(self) -> dict[str, str]:
        """Each cluster to show Degraded now, and why."""
        found: dict[str, str] = {}
        for source in self.troubles:
            try:
                found.update(source())
            except Exception:  # a broken source must not stop the pass
                log.exception("a source of cluster troubles failed")
        for cluster in self.calls.overdue():
            found[cluster] = (
                f"a reconcile step has run past its {self.deadline_s:g} s deadline (something in the "
                "cluster blocks it); the cluster waits for it, the other clusters go on"
            )
        return found


def with_degraded(
    decisions: Sequence[Decision], views: Sequence[ClusterView], degraded: Mapping[str, str]
) -> tuple[list[Decision], list[Decision]]:
    """(state decisions showing the `degraded` clusters Degraded, the other decisions without the
    policy's own state decisions for those clusters)."""
    now = {view.name: (view.state, view.reason) for view in views}
    marks = [
        Decision(Action.set_cluster_state, name, state=ClusterState.Degraded, reason=why)
        for name, why in degraded.items()
        if name in now
        and now[name] != (ClusterState.Degraded, why)
        and now[name][0] != ClusterState.Terminating
    ]
    rest = [d for d in decisions if not (d.action == Action.set_cluster_state and d.cluster in degraded)]
    return marks, rest
