"""The decisions a policy returns (and :func:`elastrain.scheduler.api.apply` carries out).

Every decision names its job and carries a human-readable ``reason``; the kind is an Enum
(:class:`DecisionKind`), so callers dispatch on ``d.kind`` instead of ``isinstance``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import ClassVar

__all__ = [
    "Decision",
    "DecisionKind",
    "Finish",
    "Grow",
    "Preempt",
    "PreemptToMin",
    "Shrink",
    "Start",
    "Wait",
]


class DecisionKind(enum.Enum):
    """What a decision does."""

    START = "start"
    GROW = "grow"
    SHRINK = "shrink"
    PREEMPT_TO_MIN = "preempt-to-min"
    PREEMPT = "preempt"
    WAIT = "wait"
    FINISH = "finish"


@dataclass(frozen=True, slots=True)
class Decision:
    """Base of all decisions: the job it concerns and a human-readable reason."""

    kind: ClassVar[DecisionKind]
    job_id: str
    reason: str = field(default="", kw_only=True)


@dataclass(frozen=True, slots=True)
class Start(Decision):
    """Start a queued job as a gang of ``workers`` (min <= workers <= max)."""

    kind: ClassVar[DecisionKind] = DecisionKind.START
    workers: int = 0


@dataclass(frozen=True, slots=True)
class Grow(Decision):
    """Grow a running job to ``workers`` in total."""

    kind: ClassVar[DecisionKind] = DecisionKind.GROW
    workers: int = 0


@dataclass(frozen=True, slots=True)
class Shrink(Decision):
    """Shrink a running job to ``workers`` in total (never below its minimum); graceful."""

    kind: ClassVar[DecisionKind] = DecisionKind.SHRINK
    workers: int = 0


@dataclass(frozen=True, slots=True)
class PreemptToMin(Decision):
    """Shrink a running job straight to its minimum (for a higher-priority job)."""

    kind: ClassVar[DecisionKind] = DecisionKind.PREEMPT_TO_MIN


@dataclass(frozen=True, slots=True)
class Preempt(Decision):
    """Suspend a running job entirely (it commits, keeps its progress and is queued again)."""

    kind: ClassVar[DecisionKind] = DecisionKind.PREEMPT


@dataclass(frozen=True, slots=True)
class Wait(Decision):
    """Keep a queued job waiting; informational (the state does not change)."""

    kind: ClassVar[DecisionKind] = DecisionKind.WAIT


@dataclass(frozen=True, slots=True)
class Finish(Decision):
    """A job ended (emitted by the environment, never by a policy): release its GPUs, drop it."""

    kind: ClassVar[DecisionKind] = DecisionKind.FINISH
