"""Durable checkpoints: atomic publish, verification, skipping torn ones, refusing foreign ones."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from elastrain.errors import CheckpointError
from elastrain.runtime.checkpoint import (
    FORMAT_VERSION,
    Checkpointer,
    CheckpointPolicy,
    check_model_matches,
    latest_valid,
    list_checkpoints,
    load_checkpoint,
    resolve_resume,
    verify,
)


def state_dict(step: int, size: int = 1000) -> dict:
    model = {"w": torch.full((size,), float(step)), "b": torch.zeros(3)}
    return {
        "step": step,
        "counters": {"epoch": 0},
        "model": model,
        "optimizer": None,
        "sampler": {"epoch": 1, "cursor": 64 * step, "num_samples": 10_000},
    }


def save(directory: Path, *steps: int, keep: int = 10) -> Checkpointer:
    ckpt = Checkpointer(CheckpointPolicy(directory, every_steps=1, keep=keep))
    for step in steps:
        ckpt.save(state_dict(step), world_size=2, background=False)
    return ckpt


def test_save_publishes_atomically_with_manifest(tmp_path: Path) -> None:
    save(tmp_path, 5)
    [path] = list_checkpoints(tmp_path)
    manifest = verify(path)
    assert (manifest.step, manifest.epoch, manifest.cursor, manifest.world_size) == (5, 1, 320, 2)
    assert manifest.format_version == FORMAT_VERSION
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp")]
    assert torch.equal(load_checkpoint(path)["model"]["w"], torch.full((1000,), 5.0))


def test_keeps_only_the_last_k(tmp_path: Path) -> None:
    save(tmp_path, 1, 2, 3, 4, keep=2)
    assert [verify(p).step for p in list_checkpoints(tmp_path)] == [4, 3]


def test_background_save_snapshots_before_training_moves_on(tmp_path: Path) -> None:
    ckpt = Checkpointer(CheckpointPolicy(tmp_path, every_steps=1))
    sd = state_dict(7, size=200_000)
    assert ckpt.save(sd, world_size=1)
    sd["model"]["w"].fill_(-1.0)  # training mutates the live tensors right away
    ckpt.wait()
    assert torch.equal(
        load_checkpoint(list_checkpoints(tmp_path)[0])["model"]["w"], torch.full((200_000,), 7.0)
    )
    assert len(ckpt.stats.stalls_s) == 1 and len(ckpt.stats.writes_s) == 1


def test_due_by_steps_and_seconds(tmp_path: Path) -> None:
    ckpt = Checkpointer(CheckpointPolicy(tmp_path, every_steps=10, every_seconds=None))
    assert not ckpt.due(9) and ckpt.due(10)
    timed = Checkpointer(CheckpointPolicy(tmp_path, every_steps=None, every_seconds=0.05))
    assert not timed.due(1)
    time.sleep(0.06)
    assert timed.due(1)


def test_truncated_and_corrupt_checkpoints_are_skipped_with_a_warning(tmp_path: Path, caplog) -> None:
    save(tmp_path, 1, 2, 3)
    newest, middle, _ = list_checkpoints(tmp_path)
    state = newest / "state.pt"
    state.write_bytes(state.read_bytes()[:100])  # torn
    data = bytearray((middle / "state.pt").read_bytes())
    data[-10] ^= 0xFF  # flipped bits, same size
    (middle / "state.pt").write_bytes(bytes(data))
    found = latest_valid(tmp_path)
    assert found is not None and found[1].step == 1
    assert newest.name in caplog.text and middle.name in caplog.text


def test_newer_format_is_refused(tmp_path: Path) -> None:
    save(tmp_path, 1)
    [path] = list_checkpoints(tmp_path)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["format_version"] = FORMAT_VERSION + 1
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="newer elastrain"):
        resolve_resume(str(path), None)


def test_resume_auto_and_explicit(tmp_path: Path) -> None:
    assert resolve_resume("auto", tmp_path / "none-yet") is None
    assert resolve_resume("never", tmp_path) is None
    save(tmp_path, 3, 4)
    assert resolve_resume("auto", tmp_path) == list_checkpoints(tmp_path)[0]
    assert resolve_resume(str(tmp_path), None) == list_checkpoints(tmp_path)[0]


def test_missing_and_foreign_resume_paths_are_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no such directory"):
        resolve_resume(str(tmp_path / "missing"), None)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "model.bin").write_bytes(b"not ours")
    with pytest.raises(CheckpointError, match="no valid elastrain checkpoint"):
        resolve_resume(str(foreign), None)
    assert (foreign / "model.bin").read_bytes() == b"not ours"  # nothing touched


def test_checkpoint_of_another_model_is_refused(tmp_path: Path) -> None:
    saved = {"model": {"w": torch.zeros(10), "b": torch.zeros(3)}}
    check_model_matches({"w": torch.zeros(10), "b": torch.zeros(3)}, saved, tmp_path)
    with pytest.raises(CheckpointError, match=r"w has shape \(10,\) there, \(12,\) here"):
        check_model_matches({"w": torch.zeros(12), "b": torch.zeros(3)}, saved, tmp_path)
    with pytest.raises(CheckpointError, match="lacks 'extra'"):
        check_model_matches({"extra": torch.zeros(1), "w": torch.zeros(10)}, saved, tmp_path)


def test_unwritable_directory_keeps_training(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    ckpt = Checkpointer(CheckpointPolicy(blocker / "sub", every_steps=1))
    ckpt.save(state_dict(1), world_size=1, background=False)  # must not raise
    assert ckpt.stats.failed == 1
