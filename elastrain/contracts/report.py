"""The reports a job's rank 0 posts to the control plane (``/api/v1/jobs/{id}/progress``).

The wire format is a JSON object; the server's `JobProgress` schema reads it (every field optional).
Absent values are left out, not sent as null. `REPORT_VERSION` is not sent: the format only grows
with optional fields, and a change that is not backward compatible bumps it and the route's version.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

REPORT_VERSION = 1


@dataclass(frozen=True)
class ProgressReport:
    """Step, epoch, world size and throughput of a running job; `loss` and `hosts` when known."""

    step: int
    epoch: int
    world_size: int
    samples_per_s: float
    loss: float | None = None
    hosts: list[str] | None = None

    def to_wire(self) -> dict[str, Any]:
        """The JSON body (absent values left out)."""
        body: dict[str, Any] = {
            "step": self.step,
            "epoch": self.epoch,
            "world_size": self.world_size,
            "samples_per_s": self.samples_per_s,
        }
        if self.loss is not None:
            body["loss"] = float(self.loss)
        if self.hosts is not None:
            body["hosts"] = self.hosts
        return body


@dataclass(frozen=True)
class CheckpointReport:
    """A checkpoint was published: where (as the container sees it), at which step, how big."""

    path: str
    step: int
    epoch: int
    world_size: int
    size: int
    write_s: float

    def to_wire(self) -> dict[str, Any]:
        """The JSON body: ``{"checkpoint": {...}}`` on the progress route."""
        return {
            "checkpoint": {
                "path": self.path,
                "step": self.step,
                "epoch": self.epoch,
                "world_size": self.world_size,
                "bytes": self.size,
                "write_s": self.write_s,
            }
        }
