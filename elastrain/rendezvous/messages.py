"""The coordinator's wire vocabulary, defined once: every message kind, role and payload, versioned.

Agents and workers send the coordinator requests and notifications (`Hello`, `Heartbeat`, `Progress`,
`WorkerStarted`, `WorkerExited`, `Join`, `Leave`, `Done`, `UserError`); it answers requests (`Ok`,
`Refused`, `JoinReply`) and pushes (`PendingPush`, `FencedPush`, `SpawnPush`, `StopPush`, `ExitPush`).
`schema.validate` checks a frame's shape before `parse` turns it into one of these dataclasses.
The enums are str-valued, so they compare equal to, and encode as, the strings on the wire.

`PROTOCOL_VERSION` is what peers announce in their hello (``protocol``); a coordinator refuses a
hello that announces another version (a hello without one is taken as this version).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, ClassVar

from elastrain.rendezvous.api import Cause, Generation, JoinOutcome

Message = dict[str, Any]  # a decoded frame

PROTOCOL_VERSION = 1

__all__ = [
    "PROTOCOL_VERSION",
    "Cause",
    "Done",
    "ExitPush",
    "FencedPush",
    "Heartbeat",
    "Hello",
    "Join",
    "JoinOutcome",
    "JoinReply",
    "Kind",
    "Leave",
    "Message",
    "Ok",
    "PendingPush",
    "Progress",
    "Push",
    "Refused",
    "Rejoin",
    "ReplyBody",
    "Request",
    "Role",
    "SpawnPush",
    "SpawnSpec",
    "StopPush",
    "Unknown",
    "UserError",
    "WireEnum",
    "WorkerExited",
    "WorkerStarted",
    "parse",
]


class WireEnum(str, enum.Enum):
    """A str-valued enum: equal to its value, and formatted as it on every Python version."""

    def __str__(self) -> str:
        return str(self.value)


class Kind(WireEnum):
    """The ``type`` of a message."""

    # peer -> coordinator
    HELLO = "hello"
    HEARTBEAT = "heartbeat"
    PROGRESS = "progress"
    WORKER_STARTED = "worker_started"
    WORKER_EXITED = "worker_exited"
    JOIN = "join"
    LEAVE = "leave"
    DONE = "done"
    USER_ERROR = "user_error"
    # coordinator -> peer (pushes)
    PENDING = "pending"
    FENCED = "fenced"
    SPAWN = "spawn"
    STOP = "stop"
    EXIT = "exit"


class Role(WireEnum):
    """Who a connection speaks for (its hello's ``role``)."""

    AGENT = "agent"
    WORKER = "worker"


# ----- peer -> coordinator ------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Request:
    """A message from an agent or worker; `id` is set when it expects a reply."""

    kind: ClassVar[Kind]
    id: int | None = None


@dataclass(frozen=True)
class Rejoin:
    """A worker's report, after a coordinator restart, of the generation it is training in."""

    generation: Generation
    committed_step: int

    def to_wire(self) -> Message:
        """Encode for the hello."""
        return {"generation": self.generation.to_wire(), "committed_step": self.committed_step}

    @classmethod
    def from_wire(cls, data: Any) -> Rejoin | None:
        """Decode a validated ``rejoin`` field (falsy: not a rejoin)."""
        if not data:
            return None
        return cls(Generation.from_wire(data["generation"]), int(data.get("committed_step", -1)))


@dataclass(frozen=True, kw_only=True)
class Hello(Request):
    """The first message of every connection (the token is checked, then dropped, by the server)."""

    kind: ClassVar[Kind] = Kind.HELLO
    role: str
    host: str = ""
    worker_id: str = ""
    local_rank: int = 0
    pid: int = 0
    run_id: str = ""
    rejoin: Rejoin | None = None
    protocol: int = PROTOCOL_VERSION


@dataclass(frozen=True, kw_only=True)
class Heartbeat(Request):
    """A worker is alive."""

    kind: ClassVar[Kind] = Kind.HEARTBEAT


@dataclass(frozen=True, kw_only=True)
class Progress(Request):
    """Rank 0 completed the first step of `generation` at `at` (wall clock)."""

    kind: ClassVar[Kind] = Kind.PROGRESS
    generation: int = -1
    at: float | None = None


@dataclass(frozen=True, kw_only=True)
class WorkerStarted(Request):
    """An agent started a worker process."""

    kind: ClassVar[Kind] = Kind.WORKER_STARTED
    worker_id: str
    pid: int = 0


@dataclass(frozen=True, kw_only=True)
class WorkerExited(Request):
    """A worker process exited (negative `returncode`: killed by that signal)."""

    kind: ClassVar[Kind] = Kind.WORKER_EXITED
    worker_id: str
    returncode: int = 0
    tail: str = ""


@dataclass(frozen=True, kw_only=True)
class Join(Request):
    """A worker asks for the next generation (held until it forms)."""

    kind: ClassVar[Kind] = Kind.JOIN
    committed_step: int = -1
    port: int = 0
    pid: int = 0


@dataclass(frozen=True, kw_only=True)
class Leave(Request):
    """A worker asks to leave at its next commit (SIGTERM); from an agent: every worker of its host
    leaves, and none is started there again (the agent was told to stop)."""

    kind: ClassVar[Kind] = Kind.LEAVE


@dataclass(frozen=True, kw_only=True)
class Done(Request):
    """A worker's training function returned."""

    kind: ClassVar[Kind] = Kind.DONE


@dataclass(frozen=True, kw_only=True)
class UserError(Request):
    """A worker failed with an ordinary exception: the job ends."""

    kind: ClassVar[Kind] = Kind.USER_ERROR
    traceback: str = ""


@dataclass(frozen=True, kw_only=True)
class Unknown(Request):
    """A message of a kind this coordinator does not know (answered "unknown message")."""

    type: Any = None  # what was sent as ``type``


_SIMPLE: dict[str, type[Request]] = {
    Kind.HEARTBEAT: Heartbeat,
    Kind.PROGRESS: Progress,
    Kind.WORKER_STARTED: WorkerStarted,
    Kind.WORKER_EXITED: WorkerExited,
    Kind.JOIN: Join,
    Kind.LEAVE: Leave,
    Kind.DONE: Done,
    Kind.USER_ERROR: UserError,
}
_FIELDS: dict[str, tuple[str, ...]] = {
    Kind.HEARTBEAT: (),
    Kind.PROGRESS: ("generation", "at"),
    Kind.WORKER_STARTED: ("worker_id", "pid"),
    Kind.WORKER_EXITED: ("worker_id", "returncode", "tail"),
    Kind.JOIN: ("committed_step", "port", "pid"),
    Kind.LEAVE: (),
    Kind.DONE: (),
    Kind.USER_ERROR: ("traceback",),
}


def parse(msg: Message) -> Request:
    """The typed form of a frame that `schema.validate` accepted (unknown kinds: `Unknown`)."""
    kind = msg.get("type")
    rid = msg.get("id")
    if kind == Kind.HELLO:
        return Hello(
            id=rid,
            role=str(msg.get("role")),
            host=str(msg.get("host", "")),
            worker_id=str(msg.get("worker_id", "")),
            local_rank=int(msg.get("local_rank", 0)),
            pid=int(msg.get("pid", 0)),
            run_id=str(msg.get("run_id", "") or ""),
            rejoin=Rejoin.from_wire(msg.get("rejoin")),
            protocol=int(msg.get("protocol", PROTOCOL_VERSION)),
        )
    cls = _SIMPLE.get(kind) if isinstance(kind, str) else None
    if cls is None or not isinstance(kind, str):
        return Unknown(id=rid, type=kind)
    fields = {name: msg[name] for name in _FIELDS[kind] if name in msg and msg[name] is not None}
    if "at" in fields:
        fields["at"] = float(fields["at"])
    return cls(id=rid, **fields)


# ----- coordinator -> peer: replies ---------------------------------------------------------------
class ReplyBody:
    """The fields of a reply (the server adds ``reply_to``)."""

    def to_wire(self) -> Message:
        """The reply's fields, in wire order."""
        raise NotImplementedError


@dataclass(frozen=True)
class Ok(ReplyBody):
    """A request was accepted."""

    def to_wire(self) -> Message:
        """``{"ok": true}``."""
        return {"ok": True}


@dataclass(frozen=True)
class Refused(ReplyBody):
    """A request was refused, with the reason."""

    error: str

    def to_wire(self) -> Message:
        """``{"ok": false, "error": ...}``."""
        return {"ok": False, "error": self.error}


@dataclass(frozen=True)
class JoinReply(ReplyBody):
    """The answer to a `Join`: admitted to `generation`, told to leave, or the job is over."""

    outcome: JoinOutcome
    reason: str = ""
    generation: Generation | None = None

    def to_wire(self) -> Message:
        """``{"outcome": ..., "generation": ...}`` when admitted, else ``{"outcome", "reason"}``."""
        if self.outcome == JoinOutcome.ADMITTED and self.generation is not None:
            return {"outcome": self.outcome.value, "generation": self.generation.to_wire()}
        return {"outcome": self.outcome.value, "reason": self.reason}


# ----- coordinator -> peer: pushes ----------------------------------------------------------------
class Push:
    """An unsolicited message to an agent or worker."""

    kind: ClassVar[Kind]

    def fields(self) -> Message:
        """The push's fields (without ``type``), in wire order."""
        raise NotImplementedError

    def to_wire(self) -> Message:
        """The whole frame."""
        return {"type": self.kind.value, **self.fields()}


@dataclass(frozen=True)
class PendingPush(Push):
    """To the members of the current generation: generation `generation` is pending (stop at a commit)."""

    kind: ClassVar[Kind] = Kind.PENDING
    generation: int
    cause: Cause

    def fields(self) -> Message:
        """``generation``, ``cause``."""
        return {"generation": self.generation, "cause": self.cause.value}


@dataclass(frozen=True)
class FencedPush(Push):
    """To a member declared dead: it is out of its generation and may rejoin `generation` as a newcomer."""

    kind: ClassVar[Kind] = Kind.FENCED
    reason: str
    generation: int

    def fields(self) -> Message:
        """``reason``, ``generation``."""
        return {"reason": self.reason, "generation": self.generation}


@dataclass(frozen=True)
class SpawnSpec:
    """One worker an agent must start."""

    worker_id: str
    local_rank: int


@dataclass(frozen=True)
class SpawnPush(Push):
    """To an agent: start these workers."""

    kind: ClassVar[Kind] = Kind.SPAWN
    workers: tuple[SpawnSpec, ...] = field(default_factory=tuple)

    def fields(self) -> Message:
        """``workers``: a list of ``{"worker_id", "local_rank"}``."""
        return {"workers": [{"worker_id": w.worker_id, "local_rank": w.local_rank} for w in self.workers]}

    @classmethod
    def from_wire(cls, msg: Message) -> SpawnPush:
        """Decode (the agent's side)."""
        return cls(
            tuple(SpawnSpec(str(w["worker_id"]), int(w["local_rank"])) for w in msg.get("workers", []))
        )


@dataclass(frozen=True)
class StopPush(Push):
    """To an agent: stop these workers (SIGTERM: a graceful leave)."""

    kind: ClassVar[Kind] = Kind.STOP
    worker_ids: tuple[str, ...] = ()

    def fields(self) -> Message:
        """``worker_ids``."""
        return {"worker_ids": list(self.worker_ids)}


@dataclass(frozen=True)
class ExitPush(Push):
    """To an agent: the job is over (or its host left); exit once its workers are gone."""

    kind: ClassVar[Kind] = Kind.EXIT
    success: bool = True

    def fields(self) -> Message:
        """``success``."""
        return {"success": self.success}
