"""Adopting a running job after a coordinator restart.

A restarted coordinator (``elastrain run --rejoin``) knows nothing; the agents and workers that kept
training reconnect and say which generation they are in, with what rank and committed step. When
every member of the newest generation they report is back (or the grace period ends), the
coordinator takes that generation as its own: training never stopped. Members that did not come
back are presumed dead, and a new generation is announced without them.
"""

from __future__ import annotations

from dataclasses import replace

from elastrain.rendezvous.api import Cause, Generation
from elastrain.rendezvous.messages import Rejoin


def newest_generation(reports: list[Rejoin]) -> Generation | None:
    """The newest generation among the workers' `rejoin` reports."""
    generations = [r.generation for r in reports]
    return max(generations, key=lambda g: g.number) if generations else None


def adopted(generation: Generation, committed: dict[str, int], store_address: str) -> Generation:
    """`generation` as the new coordinator records it: same number and ranks, the steps reported now."""
    members = tuple(
        replace(m, committed_step=committed.get(m.worker_id, m.committed_step)) for m in generation.members
    )
    return replace(
        generation,
        members=members,
        cause=Cause.COORDINATOR_RESTART,
        store_address=store_address,
        sync_state=False,
    )


def missing_members(generation: Generation, present: set[str]) -> list[str]:
    """Members of `generation` that have not reconnected."""
    return [m.worker_id for m in generation.members if m.worker_id not in present]
