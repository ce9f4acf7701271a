"""The coordinator machine's inputs (events), outputs (effects) and clock, all plain data.

`machine.CoordinatorMachine.handle(event)` returns the effects the shell (`coordinator.Coordinator`)
carries out: replies and pushes to peers, agents to start, records to append to events.jsonl, an
incident to report, the job's end. A peer is an opaque handle (`PeerRef`): the machine compares (==) and
stores it, never calls it; the shell passes its `wire.Peer` objects, tests pass strings.
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, Protocol

from elastrain.rendezvous.messages import Push, ReplyBody, Request
from elastrain.rendezvous.records import Outcome

PeerRef = Hashable


class Clock(Protocol):
    """Where the machine reads the time: wall clock for records, monotonic for timeouts."""

    def time(self) -> float:
        """Seconds since the epoch."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back."""


class SystemClock:
    """The real clocks."""

    def time(self) -> float:
        """`time.time()`."""
        return time.time()

    def monotonic(self) -> float:
        """`time.monotonic()`."""
        return time.monotonic()


class FakeClock:
    """A clock that moves only when told to (tests): `advance(s)` moves both clocks."""

    def __init__(self, wall: float = 1_000_000.0, mono: float = 100.0) -> None:
        self.wall = wall
        self.mono = mono

    def time(self) -> float:
        """The fake wall clock."""
        return self.wall

    def monotonic(self) -> float:
        """The fake monotonic clock."""
        return self.mono

    def advance(self, seconds: float) -> None:
        """Let `seconds` pass."""
        self.wall += seconds
        self.mono += seconds


# ----- events (inputs) ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Identity:
    """Who a connection is, from its hello (the server keeps it with the connection)."""

    role: str = ""
    host: str = ""
    worker_id: str = ""
    address: str = ""

    @classmethod
    def from_info(cls, info: dict[str, Any], address: str = "") -> Identity:
        """From `wire.Peer.info` (the hello's fields)."""
        return cls(
            str(info.get("role", "")), str(info.get("host", "")), str(info.get("worker_id", "")), address
        )


@dataclass(frozen=True)
class Received:
    """`peer` (`who`) sent `message`."""

    peer: PeerRef
    who: Identity
    message: Request


@dataclass(frozen=True)
class Closed:
    """`peer`'s connection ended (however it ended)."""

    peer: PeerRef
    who: Identity


@dataclass(frozen=True)
class Tick:
    """Time passed (the shell sends one every 100 ms)."""


@dataclass(frozen=True)
class HostsChanged:
    """The host list is now `slots` (host -> slot count)."""

    slots: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Abort:
    """End the job as failed (the launcher was interrupted)."""

    message: str


Event = Received | Closed | Tick | HostsChanged | Abort


# ----- effects (outputs) --------------------------------------------------------------------------
@dataclass(frozen=True)
class Reply:
    """Answer request `request_id` of `peer`."""

    peer: PeerRef
    request_id: int | None
    body: ReplyBody


@dataclass(frozen=True)
class Send:
    """Push `message` to `peer` (an agent or a worker)."""

    peer: PeerRef
    message: Push


@dataclass(frozen=True)
class StartAgent:
    """Start the agent of `host`."""

    host: str


@dataclass(frozen=True)
class RecordEvent:
    """Append `record` to events.jsonl."""

    record: dict[str, Any]


@dataclass(frozen=True)
class ReportIncident:
    """A generation completed its first step: report the incident (the launcher's `on_incident`)."""

    incident: dict[str, Any]


@dataclass(frozen=True)
class Finish:
    """The job ended with `outcome`."""

    outcome: Outcome


Effect = Reply | Send | StartAgent | RecordEvent | ReportIncident | Finish
