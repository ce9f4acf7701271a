"""``static``: FIFO gang scheduling at the requested size, never resized (today's fixed allocation).

Jobs start in queue order (priority, then arrival) with exactly ``requested`` workers once that many
fit; the head of the queue blocks everything behind it (no backfilling), and nothing is preempted.
"""

from __future__ import annotations

from elastrain.scheduler.api import ClusterState, Decision, Policy, Start, Wait


class StaticPolicy(Policy):
    """Strict FIFO gang at the requested size; no grow, shrink or preemption."""

    name = "static"

    def decide(self, state: ClusterState) -> list[Decision]:
        """Start queued jobs in order while their requested gang fits; ``Wait`` on the first that does not."""
        inv = state.inventory()
        out: list[Decision] = []
        for job in state.queued:
            n = job.requested
            if inv.capacity(job.gpus_per_worker) < n:
                free = sum(inv.free.values())
                out.append(Wait(job.id, reason=f"waiting for {n * job.gpus_per_worker} GPUs ({free} free)"))
                break
            inv.add(job.id, job.gpus_per_worker, n)
            out.append(Start(job.id, n, reason=f"started at its requested {n} worker(s)"))
        return out
