"""Which worker's state a new generation starts from: never a claim the coordinator cannot back.

A worker says which step it has committed when it joins; that is a self-report, and the most
advanced worker becomes the broadcast source. A peer holding the job token could claim a huge step
to become the source. The coordinator therefore vets each claim against what it knows itself:

* a joiner (not a member of the generation the coordinator formed last) holds no state of this job
  in memory: its claim counts as at most 0 and it is the source only when nobody stays;
* the members that stay trained in lockstep since the generation started (every step ends in a
  collective), so their honest steps differ by at most one: a claim below the step the generation
  started at (from the coordinator's own record) or above the lower median of the plausible claims
  plus one is impossible, and that worker is not a source candidate (it receives the state).

A member that lies can thus still pick a step the others corroborate, but never win the source on
its word alone; and whoever is the source, the state is loaded with ``weights_only=True``.
"""

from __future__ import annotations

import logging

from elastrain.rendezvous.api import Generation

log = logging.getLogger("elastrain.coordinator")

LOCKSTEP_SLACK = 1  # one step: a collective that completed on some members and failed on others


def start_step(generation: Generation | None) -> int:
    """The step every member of `generation` had when it began, as the coordinator recorded it."""
    if generation is None or not generation.members:
        return 0
    steps = [m.committed_step for m in generation.members]
    # synced: everyone got the source's (vetted) step; not synced (incl. adopted): the lowest report
    return max(0, max(steps) if generation.sync_state else min(steps))


def vetted_steps(stay: list[tuple[str, int]], joiners: list[tuple[str, int]], floor: int) -> list[int]:
    """The committed steps of ``stay + joiners`` (worker id, claim) as the coordinator accepts them.

    A rejected claim becomes -1 (the worker is sent the state, never sends it).
    """
    joined = [min(step, 0) for _, step in joiners]
    if not stay:
        return joined
    plausible = sorted(step for _, step in stay if step >= floor)
    if not plausible:  # nothing to cross-check against (e.g. a script that never commits)
        return [min(step, floor) for _, step in stay] + joined
    ceiling = plausible[(len(plausible) - 1) // 2] + LOCKSTEP_SLACK
    out = []
    for wid, step in stay:
        if floor <= step <= ceiling:
            out.append(step)
            continue
        if step > ceiling:
            log.warning(
                "worker %s claims step %d, beyond what the other members corroborate (%d); "
                "it will not be the state source",
                wid,
                step,
                ceiling,
            )
        out.append(-1)
    return out + joined
