"""A job's resizes (``GET /jobs/{id}`` -> ``resizes``), from the generation changes it reported.

Every ``job.incident`` event after the start is one: from the previous generation's world size to this
one's, when the coordinator decided it, the pause until the first step at the new size, and how many
of the job's processes started again for it (all of the new world in restart mode, none in place).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

from elastrain.rendezvous.api import Cause
from elastrain.server.job_schemas import JobResize


def _when(value: object, fallback: dt.datetime) -> dt.datetime:
    """An incident time (epoch seconds as reported, or RFC 3339 as stored), else `fallback`."""
    if isinstance(value, int | float):
        return dt.datetime.fromtimestamp(float(value), dt.UTC)
    if isinstance(value, str):
        try:
            return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            pass
    return fallback


def resizes_from(incidents: Iterable[tuple[dt.datetime, dict[str, Any]]]) -> list[JobResize]:
    """The resizes of a job whose incidents (stored time, detail) are `incidents`, oldest first."""
    out: list[JobResize] = []
    world: int | None = None
    for stored_at, detail in sorted(incidents, key=lambda item: int(item[1].get("generation", 0))):
        to_world = int(detail.get("world_size", 0))
        try:
            cause = Cause(detail.get("cause"))
        except ValueError:
            continue  # written by another version: not a generation change this one knows
        if cause != Cause.START and world is not None:
            pause = detail.get("recover_s")
            out.append(
                JobResize(
                    at=_when(detail.get("detected_at") or detail.get("formed_at"), stored_at),
                    from_world=world,
                    to_world=to_world,
                    cause=cause,
                    pause_s=float(pause) if isinstance(pause, int | float) else None,
                    restarted_processes=to_world if detail.get("restarted") else 0,
                )
            )
        world = to_world
    return out
