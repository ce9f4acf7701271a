"""The exactly-once ledger records: one JSON object per line in ``<ledger_dir>/<worker_id>.jsonl``.

Short keys keep the files small (a ``processed`` record is written every step): ``k`` the
`RecordKind`, ``g`` generation, ``e`` epoch, ``s`` step, ``t`` time, ``run`` the launcher run id.
`elastrain.report` and the chaos checks read them back. `LEDGER_VERSION` names this layout.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

LEDGER_VERSION = 1


class RecordKind(enum.StrEnum):
    """The ``k`` field of a record."""

    GENERATION = "g"  # the worker entered a generation (after the state sync)
    PROCESSED = "p"  # about to contribute these sample indices to a step (before the all-reduce)
    COMMITTED = "c"  # the step completed on this worker


@dataclass(frozen=True)
class GenerationRecord:
    """This worker entered `generation` as `rank`, with the state of committed step `start_step`."""

    generation: int
    rank: int
    world_size: int
    start_step: int
    cause: str
    pid: int
    worker_id: str

    def to_json(self) -> dict[str, Any]:
        """The record's fields (without ``t`` and ``run``, which the ledger adds)."""
        return {
            "k": RecordKind.GENERATION.value,
            "g": self.generation,
            "r": self.rank,
            "ws": self.world_size,
            "s": self.start_step,
            "cause": self.cause,
            "pid": self.pid,
            "w": self.worker_id,
        }


@dataclass(frozen=True)
class ProcessedRecord:
    """This worker is about to contribute `indices` to step `step`."""

    generation: int
    epoch: int
    step: int
    indices: Sequence[int]

    def to_json(self) -> dict[str, Any]:
        """The record's fields (without ``t`` and ``run``)."""
        return {
            "k": RecordKind.PROCESSED.value,
            "g": self.generation,
            "e": self.epoch,
            "s": self.step,
            "i": list(self.indices),
        }


@dataclass(frozen=True)
class CommittedRecord:
    """Step `step` completed on this worker, in a world of `world_size`."""

    generation: int
    epoch: int
    step: int
    world_size: int

    def to_json(self) -> dict[str, Any]:
        """The record's fields (without ``t`` and ``run``)."""
        return {
            "k": RecordKind.COMMITTED.value,
            "g": self.generation,
            "e": self.epoch,
            "s": self.step,
            "ws": self.world_size,
        }


LedgerRecord = GenerationRecord | ProcessedRecord | CommittedRecord
