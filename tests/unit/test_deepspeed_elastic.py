"""elastrain.frameworks.deepspeed_elastic without DeepSpeed: the commit pointer, pruning, the resume
plan and the stop flag (the real conversion and loading run in tests/integration/test_deepspeed.py)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from elastrain.errors import CheckpointError
from elastrain.frameworks.deepspeed_elastic import (
    POINTER,
    ElasticCheckpointer,
    GracefulStop,
    ResumePlan,
)


class FakeEngine:
    """Writes what `engine.save_checkpoint` writes for ZeRO-1/2: one optimizer partition per rank."""

    def __init__(self, dp_world_size: int) -> None:
        self.dp_world_size = dp_world_size
        self.saves: list[dict[str, Any]] = []

    def save_checkpoint(
        self, save_dir: str, tag: str, client_state: dict[str, Any], save_latest: bool
    ) -> None:
        folder = Path(save_dir) / tag
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "mp_rank_00_model_states.pt").write_text("model")
        for rank in range(self.dp_world_size):
            (folder / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt").write_text("partition")
        self.saves.append({"tag": tag, "client_state": client_state, "save_latest": save_latest})


def test_save_commits_a_pointer_keeps_the_newest_and_asks_for_universal_info(tmp_path: Path) -> None:
    ckpt = ElasticCheckpointer(tmp_path, keep=2)
    engine = FakeEngine(2)
    tags = [ckpt.save(engine, step, {"step": step}) for step in (10, 20, 30)]
    assert tags == ["step00000010-dp2", "step00000020-dp2", "step00000030-dp2"]
    pointer = json.loads((tmp_path / POINTER).read_text())
    assert (pointer["tag"], pointer["world_size"], pointer["step"]) == ("step00000030-dp2", 2, 30)
    assert pointer["history"] == tags[1:]
    assert not (tmp_path / tags[0]).exists() and (tmp_path / tags[1]).is_dir()
    saved = engine.saves[-1]
    assert saved["save_latest"] is False  # DeepSpeed's `latest` is written before every rank is done
    assert saved["client_state"]["elastrain"] == {"step": 30}
    assert (
        "universal_checkpoint_info" in saved["client_state"]
    )  # ds_to_universal refuses a checkpoint without


def test_plan_loads_as_saved_at_the_same_size_and_universal_at_another(tmp_path: Path) -> None:
    ckpt = ElasticCheckpointer(tmp_path)
    assert ckpt.plan(2) is None  # nothing committed yet: a fresh start
    tag = ckpt.save(FakeEngine(2), 5, {})
    same = ckpt.plan(2)
    assert same is not None and (same.tag, same.universal) == (tag, False)
    (tmp_path / f"{tag}_universal").mkdir()  # converted earlier: not converted again
    other = ckpt.plan(4)
    assert other is not None
    assert other == ResumePlan(f"{tag}_universal", tag, 2, 4, True, other.convert_s)


def test_plan_without_partitions_loads_directly_at_any_size(tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    (tmp_path / POINTER).write_text(json.dumps({"tag": "t", "world_size": 2}))
    plan = ElasticCheckpointer(tmp_path).plan(3)
    assert plan is not None and (plan.tag, plan.universal) == ("t", False)


def test_config_for_sets_load_universal_as_planned_and_copies() -> None:
    config: dict[str, Any] = {"zero_optimization": {"stage": 2}, "checkpoint": {"load_universal": True}}
    plan = ResumePlan("t", "t", 2, 2, False, 0.0)
    out = ElasticCheckpointer.config_for(config, plan)
    assert out["checkpoint"]["load_universal"] is False and config["checkpoint"]["load_universal"] is True
    assert ElasticCheckpointer.config_for({"a": 1}, None) == {"a": 1}


def test_a_pointer_to_a_missing_or_torn_checkpoint_is_refused(tmp_path: Path) -> None:
    (tmp_path / POINTER).write_text(json.dumps({"tag": "gone", "world_size": 2}))
    with pytest.raises(CheckpointError, match="gone, which is missing"):
        ElasticCheckpointer(tmp_path).plan(2)
    (tmp_path / POINTER).write_text("{not json")
    with pytest.raises(CheckpointError, match="unreadable"):
        ElasticCheckpointer(tmp_path).plan(2)


def test_sigterm_only_raises_the_flag() -> None:
    previous = signal.getsignal(signal.SIGTERM)
    try:
        stop = GracefulStop()
        assert not stop.requested and not stop.wait_for_signal(0.01)
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.wait_for_signal(5.0) and stop.requested and stop.received_at is not None
    finally:
        signal.signal(signal.SIGTERM, previous)
