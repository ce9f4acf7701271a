"""Why a job whose ranks have begun to finish cannot go on: the one-line failures the user reads."""

from __future__ import annotations

from elastrain.rendezvous.api import Cause, WorkerState
from elastrain.rendezvous.records import WorkerRecord


def cannot_start(done: list[WorkerRecord], live: int, min_np: int) -> str:
    """A worker finished (`done`) before the first generation formed and `live` are left."""
    left = f", leaving {live} of the --min-np {min_np} workers needed" if live else ""
    never = [w.worker_id for w in done if not w.joined]
    if never:
        who = f"worker {never[0]}" if len(never) == 1 else f"workers {', '.join(never[:3])}"
        return (
            f"{who} exited 0 without joining the job (the command does not use elastrain) and "
            f"{'is' if len(never) == 1 else 'are'} not replaced{left}: run a torchrun-style script "
            "with --mode restart"
        )
    return f"worker {done[0].worker_id} finished (exit 0) before the job started and is not replaced{left}"


def cannot_restart(members: list[WorkerRecord], pending: Cause | None, min_np: int) -> str:
    """A change (`pending`) needs the ranks restarted, but some `members` had finished."""
    done = [str(rank) for rank, w in enumerate(members) if w.state == WorkerState.DONE]
    who = (f"rank {done[0]}" if len(done) == 1 else f"ranks {', '.join(done)}") if done else "a worker"
    cause = pending.value.replace("_", " ") if pending is not None else "change"
    return (
        f"{who} had finished (exit 0) when a {cause} needed the other ranks restarted, and fewer "
        f"than --min-np {min_np} would be left: a job whose ranks have begun to finish "
        "cannot restart (see the output above)"
    )
