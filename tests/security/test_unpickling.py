"""Issue 14 item 6: checkpoints and the state broadcast never unpickle code; the source is vetted."""

from __future__ import annotations

import io
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from elastrain.errors import CheckpointError, ConfigError
from elastrain.rendezvous.api import Cause, Generation, Member
from elastrain.rendezvous.source import start_step, vetted_steps
from elastrain.runtime import state as state_module
from elastrain.runtime.checkpoint import Checkpointer, CheckpointPolicy, list_checkpoints, load_checkpoint
from elastrain.runtime.data import ElasticSampler
from elastrain.runtime.safe_load import UnsafeStateError
from elastrain.runtime.state import State, load_broadcast
from tests.security.harness import Evil


class Custom:
    """A user object: only an unsafe load could restore it."""


def evil_state(marker: Path) -> dict[str, Any]:
    return {"step": 7, "counters": {"epoch": Evil(marker)}, "model": None, "optimizer": None, "sampler": None}


def test_the_payload_is_real(tmp_path: Path) -> None:
    """Sanity: the old unsafe load would have run the payload."""
    marker = tmp_path / "marker"
    buffer = io.BytesIO()
    torch.save(evil_state(marker), buffer)
    buffer.seek(0)
    torch.load(buffer, weights_only=False)
    assert marker.exists()


@pytest.mark.attack
def test_malicious_checkpoint_is_refused_without_running_code(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    Checkpointer(CheckpointPolicy(tmp_path / "ckpt", every_steps=1)).save(
        evil_state(marker), world_size=1, background=False
    )
    [path] = list_checkpoints(tmp_path / "ckpt")  # manifest and checksum are valid: only the load refuses
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    assert isinstance(info.value, UnsafeStateError)
    assert "refusing checkpoint" in str(info.value) and "\n" not in str(info.value)
    assert not marker.exists()


def test_old_checkpoint_needing_unsafe_load_is_refused_with_one_line(tmp_path: Path) -> None:
    """A format-1 checkpoint that pickled a user object is refused, not loaded unsafely.

    (Not a numpy array: importing megatron-core allowlists numpy arrays in torch for the process.)
    """
    raw = {"step": 3, "counters": {"obj": Custom()}, "model": None, "optimizer": None}
    Checkpointer(CheckpointPolicy(tmp_path, every_steps=1)).save(raw, world_size=1, background=False)
    with pytest.raises(UnsafeStateError, match=r"refusing checkpoint .*; elastrain never unpickles") as info:
        load_checkpoint(list_checkpoints(tmp_path)[0])
    assert "\n" not in str(info.value)


@pytest.mark.attack
def test_malicious_broadcast_is_refused_without_running_code(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    buffer = io.BytesIO()
    torch.save(evil_state(marker), buffer)
    with pytest.raises(UnsafeStateError, match="state broadcast by rank 0"):
        load_broadcast(io.BytesIO(buffer.getvalue()), 0)
    assert not marker.exists()


class FakeRuntime:
    """Rank 1 of a two-rank generation whose source is rank 0; `dist.broadcast` is faked."""

    def __init__(self) -> None:
        members = (Member("a", "h", 1, 10), Member("b", "h", 2, -1))
        self.generation = Generation(1, members, Cause.SCALE_OUT, "", src_rank=0, sync_state=True)
        self.rank, self.world_size, self.synced_generation = 1, 2, 0
        self.context = SimpleNamespace(checkpoint_dir=None)
        self.groups = SimpleNamespace(device=torch.device("cpu"))
        self.ledger = SimpleNamespace(generation=lambda *args: None)


def receive(monkeypatch: pytest.MonkeyPatch, state: State, payload: bytes) -> None:
    """Run `state.sync` on the receiving rank with `payload` as what the source sends."""
    data = torch.frombuffer(bytearray(payload), dtype=torch.uint8)

    def broadcast(tensor: torch.Tensor, src: int) -> None:
        tensor.copy_(
            torch.tensor([data.numel()]) if tensor.numel() == 1 and tensor.dtype == torch.int64 else data
        )

    monkeypatch.setattr(state_module.dist, "broadcast", broadcast)
    state.sync(FakeRuntime())  # type: ignore[arg-type]


@pytest.mark.attack
def test_malicious_payload_through_sync_runs_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "marker"
    buffer = io.BytesIO()
    torch.save(evil_state(marker), buffer)
    with pytest.raises(UnsafeStateError):
        receive(monkeypatch, State(epoch=0), buffer.getvalue())
    assert not marker.exists()


def make_state(seed: int) -> State:
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, betas=(0.8, 0.9))
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    random.seed(seed)
    np.random.seed(seed)
    return State(
        model=model,
        optimizer=optimizer,
        sampler=ElasticSampler(100, 8, seed=seed),
        epoch=seed,
        rng={"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()},
        lr_scale=np.float32(0.5),
        history=[1.0, (2, "x")],
    )


def assert_same(a: State, b: State) -> None:
    assert a.step == b.step
    assert a.epoch == b.epoch and a.history == b.history  # type: ignore[attr-defined]
    assert isinstance(b.lr_scale, np.float32) and b.lr_scale == a.lr_scale  # type: ignore[attr-defined]
    ra, rb = a.rng, b.rng  # type: ignore[attr-defined]
    assert torch.equal(ra["torch"], rb["torch"]) and rb["python"] == ra["python"]
    assert rb["numpy"][0] == "MT19937" and np.array_equal(rb["numpy"][1], ra["numpy"][1])
    assert rb["numpy"][1].dtype == np.uint32 and rb["numpy"][2:] == ra["numpy"][2:]
    np.random.set_state(rb["numpy"])  # usable as such
    random.setstate(rb["python"])
    for k, v in a.model.state_dict().items():  # type: ignore[union-attr]
        assert torch.equal(v, b.model.state_dict()[k])  # type: ignore[union-attr]
    sa, sb = a.optimizer.state_dict(), b.optimizer.state_dict()  # type: ignore[union-attr]
    assert sa["param_groups"] == sb["param_groups"]
    assert torch.equal(sa["state"][0]["exp_avg"], sb["state"][0]["exp_avg"])
    assert a.sampler.state_dict() == b.sampler.state_dict()  # type: ignore[union-attr]


def test_checkpoint_round_trip_with_rng_states(tmp_path: Path) -> None:
    source = make_state(1)
    source.step = 42
    Checkpointer(CheckpointPolicy(tmp_path, every_steps=1)).save(source.state_dict(), 1, background=False)
    target = make_state(2)
    target.load_state_dict(load_checkpoint(list_checkpoints(tmp_path)[0]))
    assert_same(source, target)


def test_broadcast_round_trip_with_rng_states(monkeypatch: pytest.MonkeyPatch) -> None:
    source = make_state(1)
    source.step = 10
    buffer = io.BytesIO()
    torch.save(source.state_dict(), buffer)
    target = make_state(2)
    receive(monkeypatch, target, buffer.getvalue())
    assert_same(source, target)


def test_counter_that_needs_pickle_is_refused_at_save() -> None:
    with pytest.raises(ConfigError, match=r"counter extra\['k'\] holds a Custom"):
        State(extra={"k": Custom()}).state_dict()


# ----- the broadcast source is never chosen on a claim alone ---------------------------------------
@pytest.mark.attack
def test_a_joiner_claiming_a_huge_step_is_not_the_source() -> None:
    steps = vetted_steps([("a", 100), ("b", 100)], [("evil", 10**9)], floor=50)
    assert steps == [100, 100, 0]
    assert steps.index(max(steps)) == 0


@pytest.mark.attack
def test_a_member_claiming_beyond_the_others_is_not_the_source() -> None:
    assert vetted_steps([("evil", 10**9), ("a", 100)], [], floor=50) == [-1, 100]
    assert vetted_steps([("a", 100), ("evil", 10**9), ("b", 100)], [], floor=50) == [100, -1, 100]
    # a claim below the step the generation started at is impossible as well
    assert vetted_steps([("evil", 3), ("a", 100)], [], floor=50) == [-1, 100]


def test_honest_members_one_step_apart_keep_the_most_advanced() -> None:
    steps = vetted_steps([("a", 100), ("b", 101)], [("c", -1)], floor=90)
    assert steps == [100, 101, -1] and steps.index(max(steps)) == 1


def test_first_generation_and_scripts_that_never_commit() -> None:
    assert vetted_steps([], [("a", 0), ("evil", 10**9)], floor=0) == [0, 0]
    assert vetted_steps([("a", -1), ("b", -1)], [], floor=0) == [-1, -1]


def test_start_step_comes_from_the_coordinators_record() -> None:
    synced = Generation(3, (Member("a", "h", 1, 80), Member("b", "h", 2, -1)), Cause.SCALE_OUT, "")
    assert start_step(synced) == 80
    adopted = Generation(
        3, (Member("a", "h", 1, 80), Member("b", "h", 2, 81)), Cause.START, "", sync_state=False
    )
    assert start_step(adopted) == 80
    assert start_step(None) == 0
