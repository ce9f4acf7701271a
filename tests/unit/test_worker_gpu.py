"""Which GPU a worker trains on, and the refusals NCCL needs (one GPU per worker slot)."""

from __future__ import annotations

import pytest
import torch

from elastrain.errors import ConfigError
from elastrain.runtime.group import worker_gpu


def gpus(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    """Make torch report `count` CUDA devices (the decision reads only these two queries)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


def test_without_cuda_gloo_trains_on_the_cpu_and_nccl_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus(monkeypatch, 0)
    assert worker_gpu("gloo", 0) is None
    with pytest.raises(ConfigError, match="ELASTRAIN_BACKEND=gloo"):
        worker_gpu("nccl", 0)


def test_gloo_workers_share_the_gpus_round_robin(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus(monkeypatch, 1)
    assert [worker_gpu("gloo", slot) for slot in range(3)] == [0, 0, 0]
    gpus(monkeypatch, 2)
    assert [worker_gpu("gloo", slot) for slot in range(3)] == [0, 1, 0]


def test_nccl_gets_a_gpu_per_slot_and_refuses_a_slot_beyond_them(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus(monkeypatch, 2)
    assert [worker_gpu("nccl", slot) for slot in range(2)] == [0, 1]
    with pytest.raises(ConfigError, match="at most 2 slots"):
        worker_gpu("nccl", 2)
