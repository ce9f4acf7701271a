"""ZeRO partitions on disk, beside elastrain's durable checkpoints: what a job resumes from when both
in-memory copies of a partition are gone (the whole job stopped, or two ring neighbours died at once).

With ``elastrain run --checkpoint-dir DIR --checkpoint-every N`` each rank writes its own partition at
every step that is a multiple of N, the steps at which rank 0 saves the rest of the state (model,
counters, sampler): ``DIR/zero/step-<step>/rank-<r>-of-<world>.pt``, a weights-only file (the piece's
JSON header and its tensor). A step's set is used only when every rank's file is there. Time-based
checkpoints (``--checkpoint-interval``) have no ZeRO set: a resume from one ends with `ZeroStateLost`.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import torch

from elastrain.deepspeed.pieces import Piece, piece_from_header
from elastrain.runtime.safe_load import safe_torch_load

ZERO_DIR = "zero"
KEEP_STEPS = 3  # step directories kept (the newest); older ones are removed by rank 0
_FILE = re.compile(r"rank-(\d+)-of-(\d+)\.pt")


def step_dir(root: Path, step: int) -> Path:
    """Where the pieces of `step` are written."""
    return root / ZERO_DIR / f"step-{step:09d}"


def write_piece(root: Path, piece: Piece) -> Path:
    """Write `piece` (atomically: a reader never sees half a file)."""
    where = step_dir(root, piece.step)
    where.mkdir(parents=True, exist_ok=True)
    path = where / f"rank-{piece.rank:05d}-of-{piece.world:05d}.pt"
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    torch.save({"header": piece.header_bytes().decode(), "flat": piece.flat}, tmp)
    os.replace(tmp, path)
    return path


def read_pieces(root: Path, step: int) -> list[Piece] | None:
    """Every rank's piece of `step` of one layout (a complete set), in rank order, or None."""
    where = step_dir(root, step)
    layouts: dict[int, dict[int, Path]] = {}  # world -> rank -> file (a resumed job rewrites the step)
    for path in where.glob("rank-*-of-*.pt") if where.is_dir() else []:
        match = _FILE.fullmatch(path.name)
        if match:
            layouts.setdefault(int(match[2]), {})[int(match[1])] = path
    world = next((w for w, found in sorted(layouts.items()) if sorted(found) == list(range(w))), 0)
    if not world:
        return None
    pieces = []
    for rank in range(world):
        path = layouts[world][rank]
        data = safe_torch_load(
            path, f"the ZeRO partition {path}", "remove that step's directory to resume from another"
        )
        pieces.append(piece_from_header(str(data["header"]).encode(), data["flat"]))
    return pieces


def prune(root: Path, keep: int = KEEP_STEPS) -> None:
    """Remove all but the newest `keep` step directories."""
    base = root / ZERO_DIR
    steps = sorted(p for p in base.glob("step-*") if p.is_dir()) if base.is_dir() else []
    for old in steps[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


__all__ = ["ZERO_DIR", "prune", "read_pieces", "step_dir", "write_piece"]
