"""The workload both training scripts share: the MLP, the synthetic data, the step log, the stop file.

Everything here is identical for the elastrain and the torchrun script, so the only difference
between the two runs is the launcher and the runtime. The step log is one JSON line per record in
``<log_dir>/<pid>.jsonl`` (one file per process, so concurrent writers never interleave):

* ``{"k": "m", "name": ..., "t": ...}``: a start-up mark (``start``, ``import``, ``model``, ...);
* ``{"k": "s", "s": step, "ws": world, "r": rank, "g": generation, "t": ...}``: a completed step.

Every figure of the benchmark is computed from these lines (and elastrain's ledger), not by watching.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

IN_FEATURES = 512
HIDDEN = (1024, 1024, 512)
CLASSES = 10
SAMPLES = 8192
GLOBAL_BATCH = 64
SEED = 0
LOG_DIR_ENV = "BENCH_LOG_DIR"
STOP_FILE_ENV = "BENCH_STOP_FILE"


def build_model() -> nn.Module:
    """A 512-1024-1024-512-10 MLP: 2,104,842 parameters."""
    layers: list[nn.Module] = []
    width = IN_FEATURES
    for hidden in HIDDEN:
        layers += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    layers.append(nn.Linear(width, CLASSES))
    return nn.Sequential(*layers)


def make_data(seed: int = SEED) -> tuple[torch.Tensor, torch.Tensor]:
    """SAMPLES random inputs labelled by a fixed random linear teacher (learnable, deterministic)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(SAMPLES, IN_FEATURES, generator=gen)
    teacher = torch.randn(IN_FEATURES, CLASSES, generator=gen)
    y = (x @ teacher).argmax(dim=1)
    return x, y


def epoch_permutation(epoch: int, seed: int = SEED) -> list[int]:
    """The sample order of `epoch` (the same formula as elastrain's ElasticSampler)."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(SAMPLES, generator=gen).tolist()


def split_evenly(total: int, parts: int, part: int) -> tuple[int, int]:
    """The [lo, hi) share of `part` when `total` items are cut into `parts` near-equal pieces."""
    base, extra = divmod(total, parts)
    lo = part * base + min(part, extra)
    return lo, lo + base + (1 if part < extra else 0)


class StepLog:
    """Appends start-up marks and completed steps to ``<directory>/<pid>.jsonl`` (no-op without one)."""

    def __init__(self, directory: str | None, node: str) -> None:
        self.pid = os.getpid()
        self.node = node
        self._file = None
        if directory:
            Path(directory).mkdir(parents=True, exist_ok=True)
            self._file = open(Path(directory) / f"{self.pid}.jsonl", "a", buffering=1)  # noqa: SIM115

    def _write(self, record: dict[str, Any]) -> None:
        if self._file is not None:
            record["pid"] = self.pid
            record["node"] = self.node
            self._file.write(json.dumps(record, separators=(",", ":")) + "\n")

    def mark(self, name: str, t: float | None = None, **extra: Any) -> None:
        """A start-up milestone of this process (time.time() unless given)."""
        self._write({"k": "m", "name": name, "t": time.time() if t is None else t, **extra})

    def step(self, step: int, world: int, rank: int, generation: int) -> None:
        """Step `step` (0-based global index) completed on this process."""
        self._write({"k": "s", "t": time.time(), "s": step, "ws": world, "r": rank, "g": generation})

    def close(self) -> None:
        """Flush and close the file."""
        if self._file is not None:
            self._file.close()
            self._file = None


class StopFile:
    """When to stop: at `max_steps`, or at the step number the harness writes into `path`.

    The harness writes a step a little ahead of the job, so every rank reads it before getting there
    and all ranks stop at the same step (a rank that stopped alone would hang the others).
    """

    def __init__(self, path: str | None, max_steps: int) -> None:
        self.path = path
        self.max_steps = max_steps
        self.stop_at: int | None = None

    def should_stop(self, step: int) -> bool:
        """True when `step` (the next step to run) must not run. One stat() per call."""
        if self.stop_at is None and self.path and os.path.exists(self.path):
            try:
                self.stop_at = int(Path(self.path).read_text().strip() or "0")
            except ValueError:
                pass  # caught mid-write (the harness renames into place, so this should not happen)
        limit = self.max_steps if self.stop_at is None else min(self.max_steps, self.stop_at)
        return step >= limit


def common_args(parser: Any) -> None:
    """The flags both training scripts take (argparse parser)."""
    parser.add_argument("--log-dir", default=os.environ.get(LOG_DIR_ENV), help="step log directory")
    parser.add_argument(
        "--stop-file", default=os.environ.get(STOP_FILE_ENV), help="file holding the stop step"
    )
    parser.add_argument("--max-steps", type=int, default=1_000_000, help="stop after this many steps")
    parser.add_argument("--lr", type=float, default=0.02)
