"""Per-incident records: every generation change with its cause, detection and recovery times.

The coordinator adds one `Incident` per generation it forms; rank 0 reports the first step the new
generation completes. `summary()` is what `elastrain run` prints at the end.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from elastrain.rendezvous.api import Cause


@dataclass
class Incident:
    """One generation change."""

    generation: int
    cause: Cause
    world_size: int
    fault_at: float  # when the fault happened, as far as the coordinator can tell (last sign of life)
    detected_at: float  # when the coordinator decided a new generation was needed
    formed_at: float
    start_step: int
    steps_lost: int  # committed steps some member had that the new generation does not start from
    first_step_at: float | None = None

    @property
    def detect_s(self) -> float:
        """Fault to detection."""
        return max(0.0, self.detected_at - self.fault_at)

    @property
    def recover_s(self) -> float | None:
        """Detection to the first completed step of the new generation."""
        return None if self.first_step_at is None else max(0.0, self.first_step_at - self.detected_at)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (with the derived times)."""
        data = asdict(self)
        data["cause"] = self.cause.value
        data["detect_s"] = round(self.detect_s, 3)
        data["recover_s"] = None if self.recover_s is None else round(self.recover_s, 3)
        return data


class IncidentLog:
    """The incidents of one job, in order."""

    def __init__(self) -> None:
        self.incidents: list[Incident] = []

    def add(self, incident: Incident) -> None:
        """Record a newly formed generation."""
        self.incidents.append(incident)

    def first_step(self, generation: int, at: float) -> Incident | None:
        """Rank 0 completed the first step of `generation` at `at`; returns the updated incident."""
        for incident in reversed(self.incidents):
            if incident.generation == generation:
                if incident.first_step_at is None:
                    incident.first_step_at = at
                    return incident
                return None
        return None

    def summary(self) -> str:
        """A table of the incidents (the start generation included)."""
        if not self.incidents:
            return "no generation was formed"
        lines = ["generation  cause           world  detect_s  recover_s  steps_lost"]
        for i in self.incidents:
            recover = "-" if i.recover_s is None else f"{i.recover_s:.3f}"
            cells = f"{i.generation:>10}  {i.cause.value:<14}  {i.world_size:>5}  {i.detect_s:>8.3f}"
            lines.append(f"{cells}  {recover:>9}  {i.steps_lost:>10}")
        return "\n".join(lines)
