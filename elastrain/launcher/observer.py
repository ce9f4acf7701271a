"""The launcher's view of the job's generations, for scripts that report nothing themselves.

`GenerationObserver` follows the coordinator's incident log from the launcher's wait loop (never under
the coordinator's lock): every generation formed, and (native mode) its first step done. It hands them
to the TensorBoard writer, if any, and, in restart mode, to the control plane: a torchrun-style script
does not use elastrain's API, so the launcher reports its world size (a progress report) and each
incident (scripts restarted) for it. In native mode rank 0 reports progress and the coordinator
reports each incident at the generation's first step (`Launcher` wires ``on_incident``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from elastrain.rendezvous.api import Cause
from elastrain.runtime.progress import IncidentReporter, OrderedPoster

if TYPE_CHECKING:
    from elastrain.launcher.tensorboard import TensorBoardWriter
    from elastrain.rendezvous.incidents import IncidentLog


class GenerationObserver:
    """Turns new incidents of `log` into TensorBoard scalars and (restart mode) control-plane reports."""

    def __init__(
        self,
        log: IncidentLog,
        native: bool,
        writer: TensorBoardWriter | None = None,
        environ: Mapping[str, str] | None = None,
        incidents: IncidentReporter | None = None,
    ) -> None:
        self._log = log
        self.native = native
        self.writer = writer
        self._progress = OrderedPoster("progress", environ) if not native else None
        self._incidents = incidents if not native else None
        self._formed = 0  # incidents of the log already seen formed
        self._recovered: set[int] = set()  # generations whose first step was seen
        self.incident_count = 0  # generation changes after the start
        self.restart_count = 0  # restart mode: generations that restarted the scripts

    @property
    def reports(self) -> bool:
        """Does it report to the control plane (restart mode inside a control-plane job)?"""
        return self._progress is not None and self._progress.enabled

    def poll(self) -> None:
        """Handle what happened since the last call (cheap; call it a few times a second)."""
        incidents = list(self._log.incidents)  # appended to by the coordinator's thread
        for incident in incidents[self._formed :]:
            self._on_formed(incident.to_dict())
            self._formed += 1
        if self.writer is None or not self.native:
            return
        for incident in incidents:
            if incident.first_step_at is not None and incident.generation not in self._recovered:
                self._recovered.add(incident.generation)
                self.writer.recovered(incident.to_dict(), native=True)

    def _on_formed(self, incident: dict[str, Any]) -> None:
        if incident["cause"] != Cause.START.value:
            self.incident_count += 1
        restarted = not self.native and self._formed > 0  # the scripts of an earlier generation ran
        if restarted:
            self.restart_count += 1
        if self.writer is not None:
            restarts = None if self.native else self.restart_count
            self.writer.generation(incident, self.incident_count, restarts, self.native)
        if self._progress is not None:
            self._progress.report({"world_size": incident["world_size"]})
        if self._incidents is not None:
            self._incidents.report({**_wire(incident), "restarted": restarted})

    def flush(self, timeout_s: float) -> bool:
        """Deliver what is queued for the control plane (up to `timeout_s`); True when all was."""
        return self._progress is None or self._progress.flush(timeout_s)


def _wire(incident: dict[str, Any]) -> dict[str, Any]:
    """The incident as the control plane's `JobIncident` takes it (absent values left out; restart
    mode's start step is -1, elastrain does not know the scripts' steps: sent as 0)."""
    wire = {k: v for k, v in incident.items() if v is not None}
    wire["start_step"] = max(0, int(wire.get("start_step", 0)))
    return wire
