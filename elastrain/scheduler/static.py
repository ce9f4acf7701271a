"""``static`` and ``static-backfill``: FIFO gangs at the requested size, never resized or preempted.

* ``static`` (today's fixed allocation): jobs start in queue order (priority, then arrival) with
  exactly ``requested`` workers once that many fit; the head of the queue blocks everything behind it.
* ``static-backfill``: the same, but a job that does not fit is skipped and later jobs that fit
  start (first-fit backfilling; no reservation, since the scheduler does not know run times).
"""

from __future__ import annotations

from elastrain.scheduler.api import ClusterState, Decision, Policy, Start, Wait

MAX_WAITS = 16  # Wait decisions per pass when backfilling (informational)


class StaticPolicy(Policy):
    """Strict FIFO gang at the requested size; no grow, shrink or preemption."""

    name = "static"
    backfill = False

    def decide(self, state: ClusterState) -> list[Decision]:
        """Start queued jobs in order while their requested gang fits; ``Wait`` on those that do not
        (the first one ends the pass unless backfilling)."""
        inv = state.inventory()
        out: list[Decision] = []
        waits = 0
        for job in state.queued:
            if not any(inv.free.values()):
                break
            n = job.requested
            if inv.capacity(job.gpus_per_worker) < n:
                if waits < MAX_WAITS:
                    free = sum(inv.free.values())
                    out.append(
                        Wait(job.id, reason=f"waiting for {n * job.gpus_per_worker} GPUs ({free} free)")
                    )
                waits += 1
                if not self.backfill:
                    break
                continue
            inv.add(job.id, job.gpus_per_worker, n)
            out.append(Start(job.id, n, reason=f"started at its requested {n} worker(s)"))
        if not out and state.queued and not self.backfill:
            job = state.queued[0]
            free = sum(inv.free.values())
            out.append(
                Wait(job.id, reason=f"waiting for {job.requested * job.gpus_per_worker} GPUs ({free} free)")
            )
        return out


class StaticBackfillPolicy(StaticPolicy):
    """FIFO gangs at the requested size, skipping jobs that do not fit (first-fit backfill)."""

    name = "static-backfill"
    backfill = True
