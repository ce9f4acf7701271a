"""Rendezvous boundary: who is in generation g, and the client contract workers use to get there."""

from __future__ import annotations

import abc
import enum
from dataclasses import dataclass, field
from typing import Any


class Cause(str, enum.Enum):
    """Why a generation started."""

    START = "start"
    SCALE_OUT = "scale_out"
    SCALE_IN = "scale_in"
    WORKER_FAILURE = "worker_failure"
    HEARTBEAT_LOSS = "heartbeat_loss"
    COORDINATOR_RESTART = "coordinator_restart"


class WorkerState(str, enum.Enum):
    """A worker's life as the coordinator sees it."""

    STARTING = "starting"  # spawned by its agent, not yet asking to join
    WAITING = "waiting"  # asked to join; not in the current generation (a standby)
    ACTIVE = "active"  # member of the current generation, training
    STOPPED = "stopped"  # member that has stopped at a commit and asked for the next generation
    LEAVING = "leaving"  # member that must leave at the next generation (scale-in, SIGTERM)
    LEFT = "left"
    DONE = "done"
    DEAD = "dead"


@dataclass(frozen=True)
class Member:
    """One rank of a generation."""

    worker_id: str
    host: str
    pid: int
    committed_step: int
    port: int = 0  # a free port on the member's host (restart mode: rank 0's becomes MASTER_PORT)
    address: str = ""  # the IP its connection came from: reachable even when `host` does not resolve


@dataclass(frozen=True)
class Generation:
    """Generation `number`: its ordered members (rank = index) and how to build its process group."""

    number: int
    members: tuple[Member, ...]
    cause: Cause
    store_address: str
    src_rank: int = 0
    sync_state: bool = True
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def world_size(self) -> int:
        """Number of ranks."""
        return len(self.members)

    def rank_of(self, worker_id: str) -> int:
        """The rank of `worker_id` in this generation."""
        for rank, member in enumerate(self.members):
            if member.worker_id == worker_id:
                return rank
        raise KeyError(worker_id)

    def to_wire(self) -> dict[str, Any]:
        """Encode for the wire."""
        return {
            "number": self.number,
            "members": [m.__dict__ for m in self.members],
            "cause": self.cause.value,
            "store_address": self.store_address,
            "src_rank": self.src_rank,
            "sync_state": self.sync_state,
        }

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> Generation:
        """Decode from the wire."""
        return cls(
            number=int(data["number"]),
            members=tuple(Member(**m) for m in data["members"]),
            cause=Cause(data["cause"]),
            store_address=str(data["store_address"]),
            src_rank=int(data["src_rank"]),
            sync_state=bool(data["sync_state"]),
        )


class JoinOutcome(str, enum.Enum):
    """What a join request ended in (the ``outcome`` of a join's reply on the wire)."""

    def __str__(self) -> str:
        return str(self.value)

    ADMITTED = "admitted"
    LEAVE = "leave"  # this worker is not in the next generation: exit 0
    JOB_OVER = "job_over"  # the job finished or failed: exit


@dataclass(frozen=True)
class JoinResult:
    """The answer to a join: an outcome and, when admitted, the generation."""

    outcome: JoinOutcome
    generation: Generation | None = None
    reason: str = ""


class Rendezvous(abc.ABC):
    """The worker's side of the rendezvous. Implementations: `client.CoordinatorRendezvous`.

    The runtime keeps `current` (its generation) and `committed_step` up to date, so a restarted
    coordinator can adopt the running job; `coordinator_gone` turns true when it never came back.
    """

    current: Generation | None = None
    committed_step: int = -1
    coordinator_gone: bool = False

    @abc.abstractmethod
    def join(self, committed_step: int) -> JoinResult:
        """Block until admitted to the next generation (or told to leave / that the job is over)."""

    @abc.abstractmethod
    def pending(self) -> bool:
        """True when the coordinator has announced a new generation. Must be nearly free to call."""

    @abc.abstractmethod
    def report_first_step(self, generation: int, at: float) -> None:
        """Rank 0 completed the first step of `generation` at time `at`."""

    @abc.abstractmethod
    def request_leave(self) -> None:
        """Ask to leave gracefully at the next commit (SIGTERM)."""

    @abc.abstractmethod
    def report_done(self) -> None:
        """Tell the coordinator this worker finished training."""

    @abc.abstractmethod
    def report_error(self, traceback_text: str) -> None:
        """Tell the coordinator this worker failed with an ordinary exception: the job must end."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the connection."""
