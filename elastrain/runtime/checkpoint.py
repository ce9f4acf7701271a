"""Durable checkpoints: snapshot in memory, write in the background, publish atomically.

A checkpoint is a directory ``ckpt-<step>`` holding ``state.pt`` (the `State`'s state_dict) and
``manifest.json`` (format version, step, epoch, sampler cursor, world size, SHA-256 and size of
``state.pt``). It is written as ``.tmp-*`` and renamed into place, so a reader sees whole
checkpoints only; the last `keep` are kept. Training is blocked only for the copy of the state to
host memory; the write happens on a background thread. On start, the newest checkpoint that
verifies is used; a torn or corrupt one is skipped with a warning naming it.

``state.pt`` holds tensors, numbers, strings and containers only and is read with
``torch.load(weights_only=True)`` (format 2: numpy values in counters are stored as tagged tensors,
see `elastrain.runtime.safe_load`). A file that needs an unsafe, code-running unpickling is refused.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from elastrain.errors import CheckpointError
from elastrain.runtime.safe_load import safe_torch_load

log = logging.getLogger("elastrain.checkpoint")

FORMAT_VERSION = 2  # 2: loaded with weights_only=True; numpy counters stored as tagged tensors
MANIFEST = "manifest.json"
STATE_FILE = "state.pt"
_NAME = re.compile(r"^ckpt-(\d+)$")


@dataclass(frozen=True)
class CheckpointPolicy:
    """Where and how often to checkpoint."""

    directory: Path
    every_steps: int | None = 100
    every_seconds: float | None = None
    keep: int = 3


@dataclass(frozen=True)
class Manifest:
    """What a checkpoint says about itself."""

    format_version: int
    step: int
    epoch: int
    cursor: int
    world_size: int
    sha256: str
    size: int
    created_at: float


@dataclass
class CheckpointStats:
    """Seconds the training loop was blocked per save, and seconds each background write took."""

    stalls_s: list[float] = field(default_factory=list)
    writes_s: list[float] = field(default_factory=list)
    skipped: int = 0
    failed: int = 0


def snapshot(obj: Any, buffers: dict[str, torch.Tensor] | None = None, path: str = "") -> Any:
    """A deep copy of a state_dict with every tensor copied to host memory.

    With `buffers` (kept between saves), tensors are copied into the host buffers of the previous
    snapshot when shapes match: no fresh allocation, so no page faults on the training thread.
    """
    if isinstance(obj, torch.Tensor):
        src = obj.detach()
        if buffers is not None:
            buf = buffers.get(path)
            if buf is None or buf.shape != src.shape or buf.dtype != src.dtype:
                buf = buffers[path] = torch.empty(src.shape, dtype=src.dtype, device="cpu")
            return buf.copy_(src)
        return src.to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: snapshot(v, buffers, f"{path}/{k}") for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(snapshot(v, buffers, f"{path}/{i}") for i, v in enumerate(obj))
    return obj


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Checkpointer:
    """Saves `State` snapshots under a `CheckpointPolicy`; at most one write in flight."""

    def __init__(self, policy: CheckpointPolicy) -> None:
        self.policy = policy
        self.stats = CheckpointStats()
        self._thread: threading.Thread | None = None
        self._buffers: dict[str, torch.Tensor] = {}
        self._last_step = 0
        self._last_time = time.monotonic()
        # called on the writer thread after each publish: (directory, manifest, seconds the write took)
        self.on_published: Callable[[Path, Manifest, float], None] | None = None

    def due(self, step: int) -> bool:
        """Is a save due after committed step count `step`?"""
        by_steps = self.policy.every_steps and step - self._last_step >= self.policy.every_steps
        by_time = (
            self.policy.every_seconds and time.monotonic() - self._last_time >= self.policy.every_seconds
        )
        return bool(by_steps or by_time)

    @property
    def writing(self) -> bool:
        """True while a background write is in flight."""
        return self._thread is not None and self._thread.is_alive()

    def save(self, state_dict: dict[str, Any], world_size: int, background: bool = True) -> bool:
        """Snapshot `state_dict` now and write it (in the background unless told otherwise)."""
        if self.writing:
            if background:
                self.stats.skipped += 1  # the previous write is still going: do not queue up copies
                return False
            self.wait()
        started = time.perf_counter()
        snap = snapshot(state_dict, self._buffers)  # the previous write is done: its buffers are free
        self.stats.stalls_s.append(time.perf_counter() - started)
        step = int(snap["step"])
        self._last_step, self._last_time = step, time.monotonic()
        if background:
            self._thread = threading.Thread(
                target=self._write, args=(snap, world_size), daemon=True, name="elastrain-checkpoint"
            )
            self._thread.start()
        else:
            self._write(snap, world_size)
        return True

    def wait(self) -> None:
        """Block until the write in flight (if any) is published."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _write(self, snap: dict[str, Any], world_size: int) -> None:
        started = time.perf_counter()
        directory = self.policy.directory
        step = int(snap["step"])
        tmp = directory / f".tmp-ckpt-{step}-{os.getpid()}"
        final = directory / f"ckpt-{step:010d}"
        try:
            directory.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            state_path = tmp / STATE_FILE
            with open(state_path, "wb") as f:
                torch.save(snap, f)
                f.flush()
                os.fsync(f.fileno())
            sampler = snap.get("sampler") or {}
            manifest = Manifest(
                format_version=FORMAT_VERSION,
                step=step,
                epoch=int(sampler.get("epoch", 0)),
                cursor=int(sampler.get("cursor", 0)),
                world_size=world_size,
                sha256=_sha256(state_path),
                size=state_path.stat().st_size,
                created_at=time.time(),
            )
            with open(tmp / MANIFEST, "w") as f:
                json.dump(asdict(manifest), f)
                f.flush()
                os.fsync(f.fileno())
            if final.exists():
                shutil.rmtree(final)
            os.rename(tmp, final)
            _fsync_dir(directory)
            self._prune()
            self.stats.writes_s.append(time.perf_counter() - started)
            if self.on_published is not None:
                self.on_published(final, manifest, self.stats.writes_s[-1])
        except OSError as exc:
            self.stats.failed += 1
            shutil.rmtree(tmp, ignore_errors=True)
            log.warning(
                "checkpoint at step %d not written (%s); keeping the previous ones", step, exc.strerror or exc
            )

    def _prune(self) -> None:
        for old in list_checkpoints(self.policy.directory)[self.policy.keep :]:
            shutil.rmtree(old, ignore_errors=True)


def list_checkpoints(directory: Path) -> list[Path]:
    """Published checkpoints in `directory`, newest first."""
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _NAME.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found, reverse=True)]


def verify(path: Path) -> Manifest:
    """Read and check a checkpoint's manifest and checksum; raises CheckpointError naming the fault."""
    try:
        data = json.loads((path / MANIFEST).read_text())
        manifest = Manifest(**data)
    except FileNotFoundError:
        raise CheckpointError(f"{path} has no {MANIFEST}") from None
    except (ValueError, TypeError) as exc:
        raise CheckpointError(f"{path}/{MANIFEST} is unreadable ({exc})") from None
    if manifest.format_version > FORMAT_VERSION:
        raise CheckpointError(
            f"{path} was written by a newer elastrain (format {manifest.format_version}, this one reads "
            f"{FORMAT_VERSION}); upgrade elastrain to resume from it"
        )
    state_path = path / STATE_FILE
    if not state_path.exists():
        raise CheckpointError(f"{path} has no {STATE_FILE}")
    if state_path.stat().st_size != manifest.size:
        raise CheckpointError(
            f"{state_path} is {state_path.stat().st_size} bytes, the manifest says {manifest.size}"
        )
    if _sha256(state_path) != manifest.sha256:
        raise CheckpointError(f"{state_path} does not match its checksum")
    return manifest


def latest_valid(directory: Path) -> tuple[Path, Manifest] | None:
    """The newest checkpoint that verifies; torn or corrupt ones are skipped with a warning."""
    for path in list_checkpoints(directory):
        try:
            return path, verify(path)
        except CheckpointError as exc:
            log.warning("skipping checkpoint %s: %s", path.name, exc)
    return None


def resolve_resume(resume: str, directory: Path | None) -> Path | None:
    """Which checkpoint to resume from: ``auto`` (newest valid in `directory`, if any), ``never``, or a path.

    An explicit path must be a checkpoint or a directory of checkpoints written by elastrain.
    """
    if resume in ("never", "none", ""):
        return None
    if resume == "auto":
        if directory is None:
            return None
        found = latest_valid(directory)
        return found[0] if found else None
    path = Path(resume)
    if not path.exists():
        raise CheckpointError(
            f"--resume {path}: no such directory; give a --checkpoint-dir used before, or auto"
        )
    if (path / MANIFEST).exists():
        verify(path)
        return path
    found = latest_valid(path)
    if found is None:
        raise CheckpointError(
            f"--resume {path}: no valid elastrain checkpoint in it (expected ckpt-<step>/ with {MANIFEST}); "
            f"point it at a --checkpoint-dir of an earlier run"
        )
    return found[0]


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Load a verified checkpoint's state_dict onto the CPU (``weights_only=True``: never runs code)."""
    verify(path)
    state = safe_torch_load(
        path / STATE_FILE,
        f"checkpoint {path}",
        "elastrain never unpickles checkpoints unsafely; resume from a checkpoint written by this "
        "elastrain (or --resume never), or, if you trust the file, re-save its tensors and plain values",
    )
    if not isinstance(state, dict) or "step" not in state:
        raise CheckpointError(f"{path}/{STATE_FILE} is not an elastrain state (no step)")
    return state


def check_model_matches(model_state: dict[str, torch.Tensor], saved: dict[str, Any], source: Path) -> None:
    """Refuse a checkpoint of another model (missing keys or other shapes) with one clear message."""
    saved_model = saved.get("model") or {}
    missing = sorted(set(model_state) - set(saved_model))
    if missing:
        raise CheckpointError(
            f"{source} is for another model: it lacks {missing[0]!r} (and {len(missing) - 1} more)"
        )
    for name, tensor in model_state.items():
        other = saved_model[name]
        if tuple(other.shape) != tuple(tensor.shape):
            raise CheckpointError(
                f"{source} is for another model: {name} has shape {tuple(other.shape)} there, "
                f"{tuple(tensor.shape)} here"
            )
