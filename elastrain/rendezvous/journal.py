"""The coordinator's records (``events.jsonl``), defined once: one typed record per event kind.

Each line is a JSON object whose ``event`` is an `EventKind`, then the record's fields, then ``run``
(the run id) and ``v`` (`JOURNAL_VERSION`). `elastrain.report`, the chaos harness and the bench read
these lines; a reader must ignore fields it does not know.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from elastrain.rendezvous.messages import WireEnum

JOURNAL_VERSION = 1


class EventKind(WireEnum):
    """The ``event`` of an events.jsonl record."""

    AGENT = "agent"  # an agent connected
    WORKER_EXIT = "worker_exit"  # a worker process exited
    INCIDENT = "incident"  # a generation's first step completed (detection and recovery times)
    ADOPTED = "adopted"  # a restarted coordinator adopted the running generation
    GENERATION = "generation"  # a generation formed
    END = "end"  # the job ended


@dataclass(frozen=True)
class JournalRecord:
    """One events.jsonl record."""

    kind: ClassVar[EventKind]

    def to_dict(self, run: str) -> dict[str, Any]:
        """The JSON object written for this record in run `run`."""
        body = {f.name: getattr(self, f.name) for f in fields(self)}
        return {"event": self.kind.value, **body, "run": run, "v": JOURNAL_VERSION}


@dataclass(frozen=True)
class AgentConnected(JournalRecord):
    """The agent of `host` (process `pid`) connected."""

    kind: ClassVar[EventKind] = EventKind.AGENT
    host: str
    pid: int
    at: float


@dataclass(frozen=True)
class WorkerExit(JournalRecord):
    """Worker `worker_id` exited with `returncode`."""

    kind: ClassVar[EventKind] = EventKind.WORKER_EXIT
    worker_id: str
    returncode: int
    at: float


@dataclass(frozen=True)
class IncidentRecord(JournalRecord):
    """An incident (`incidents.Incident.to_dict()`) once its first step is known."""

    kind: ClassVar[EventKind] = EventKind.INCIDENT
    incident: dict[str, Any] = field(default_factory=dict)

    def to_dict(self, run: str) -> dict[str, Any]:
        """The incident's fields inline."""
        return {"event": self.kind.value, **self.incident, "run": run, "v": JOURNAL_VERSION}


@dataclass(frozen=True)
class Adopted(JournalRecord):
    """A restarted coordinator adopted `generation`; `missing` members did not come back."""

    kind: ClassVar[EventKind] = EventKind.ADOPTED
    generation: int
    present: list[str]
    missing: list[str]
    at: float


@dataclass(frozen=True)
class MemberRecord:
    """A member as a generation record lists it."""

    worker_id: str
    host: str
    pid: int


@dataclass(frozen=True)
class GenerationFormed(JournalRecord):
    """Generation `generation` formed."""

    kind: ClassVar[EventKind] = EventKind.GENERATION
    generation: int
    cause: str
    world_size: int
    members: list[MemberRecord]
    start_step: int
    requested_at: float
    formed_at: float

    def to_dict(self, run: str) -> dict[str, Any]:
        """Members as ``{"worker_id", "host", "pid"}`` objects."""
        data = super().to_dict(run)
        data["members"] = [{"worker_id": m.worker_id, "host": m.host, "pid": m.pid} for m in self.members]
        return data


@dataclass(frozen=True)
class JobEnded(JournalRecord):
    """The job ended."""

    kind: ClassVar[EventKind] = EventKind.END
    success: bool
    message: str
    at: float
