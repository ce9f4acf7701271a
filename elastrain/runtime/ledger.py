"""The exactly-once ledger: each worker appends what it processed and what it committed.

One JSON line per record in ``<ledger_dir>/<worker_id>.jsonl``; the records are defined in
`elastrain.contracts.ledger`: processed (written before the gradient all-reduce, so a worker killed
after sending its gradients has left its indices behind), committed, generation joined.
`elastrain.report` turns the files of a job into per-epoch counts.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path

from elastrain.contracts.ledger import CommittedRecord, GenerationRecord, LedgerRecord, ProcessedRecord


class Ledger:
    """Append-only record of one worker's steps; a no-op when no directory is configured."""

    def __init__(self, directory: Path | None, worker_id: str, run_id: str = "") -> None:
        self._file = None
        self.run_id = run_id
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)
            safe = worker_id.replace("/", "_")
            self._file = open(directory / f"{safe}.jsonl", "a", buffering=1)  # noqa: SIM115
        self.worker_id = worker_id

    @property
    def enabled(self) -> bool:
        """True when records are written."""
        return self._file is not None

    def write(self, record: LedgerRecord) -> None:
        """Append `record`, stamped with the time and the run id."""
        if self._file is not None:
            line = record.to_json()
            line["t"] = time.time()
            line["run"] = self.run_id
            self._file.write(json.dumps(line, separators=(",", ":")) + "\n")

    def generation(self, generation: int, rank: int, world_size: int, start_step: int, cause: str) -> None:
        """This worker entered `generation` as `rank`, with the state of committed step `start_step`."""
        if self._file is not None:
            self.write(
                GenerationRecord(generation, rank, world_size, start_step, cause, os.getpid(), self.worker_id)
            )

    def processed(self, generation: int, epoch: int, step: int, indices: Sequence[int]) -> None:
        """This worker is about to contribute `indices` to step `step`."""
        if self._file is not None:
            self.write(ProcessedRecord(generation, epoch, step, indices))

    def committed(self, generation: int, epoch: int, step: int, world_size: int) -> None:
        """Step `step` completed on this worker."""
        if self._file is not None:
            self.write(CommittedRecord(generation, epoch, step, world_size))

    def close(self) -> None:
        """Flush and close."""
        if self._file is not None:
            self._file.close()
            self._file = None
