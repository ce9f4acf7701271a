"""elastrain's Horovod broadcasts (``hvd.elastic`` state sync, ``broadcast_optimizer_state``) and, by
default, ``broadcast_object``/``allgather_object`` never unpickle code: a malicious sender is refused
without running its payload. Horovod's pickling of those two is an explicit opt-in
(``ELASTRAIN_HVD_ALLOW_PICKLE=1``, docs/security.md).

Each test plays rank 1 (or the root, rank 0) of a two-rank world; ``dist.broadcast`` is faked to deliver
what the other rank sends.
"""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

import elastrain.horovod as hvd
from elastrain.errors import ConfigError
from elastrain.horovod import basics, functions
from elastrain.rendezvous.api import Cause, Generation, Member
from elastrain.runtime.safe_load import UnsafeStateError
from tests.security.harness import Evil

pytestmark = pytest.mark.timeout(60)


class Custom:
    """A plain user object: Horovod would pickle it."""


def saved(obj: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


class TwoRanks:
    """This process as `rank` of a world of two whose state source is rank 0; broadcasts are faked."""

    def __init__(
        self, monkeypatch: pytest.MonkeyPatch, rank: int, incoming: bytes = b"", refused: bool = False
    ) -> None:
        self.incoming = torch.frombuffer(bytearray(incoming), dtype=torch.uint8) if incoming else None
        self.refused = refused  # the root sends its refusal (size -1) instead of a payload
        self.sizes: list[int] = []  # the sizes this rank saw broadcast
        self.ledger: list[tuple[Any, ...]] = []
        members = (Member("a", "h", 1, 10), Member("b", "h", 2, -1))
        runtime = SimpleNamespace(
            generation=Generation(1, members, Cause.SCALE_OUT, "", src_rank=0, sync_state=True),
            rank=rank,
            world_size=2,
            rendezvous=None,
            groups=SimpleNamespace(device=torch.device("cpu")),
            ledger=SimpleNamespace(generation=lambda *args: self.ledger.append(args)),
        )
        monkeypatch.setattr(basics, "runtime", lambda: runtime)
        monkeypatch.setattr(basics, "rank", lambda: rank)
        monkeypatch.setattr(functions, "world", lambda: 2)
        monkeypatch.setattr(functions.dist, "broadcast", self._broadcast)

    def _broadcast(self, tensor: torch.Tensor, src: int) -> None:
        assert src == 0
        if tensor.dtype == torch.int64 and tensor.numel() == 1:
            if self.refused:
                tensor.fill_(-1)
            elif self.incoming is not None:
                tensor.fill_(self.incoming.numel())
            self.sizes.append(int(tensor.item()))
        elif self.incoming is not None:
            tensor.copy_(self.incoming)


@pytest.mark.attack
def test_a_malicious_elastic_state_is_refused_without_running_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "marker"
    payload = saved({"commits": 9, "attrs": {"epoch": Evil(marker)}})
    TwoRanks(monkeypatch, rank=1, incoming=payload)
    state = hvd.elastic.ObjectState(epoch=0)
    with pytest.raises(UnsafeStateError, match="refusing the elastic state broadcast by rank 0"):
        state.sync()
    assert not marker.exists()
    assert (state.epoch, state._commits) == (0, 0)  # nothing of the payload was applied


@pytest.mark.attack
def test_a_malicious_torch_state_is_refused_without_running_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "marker"
    model = torch.nn.Linear(2, 1)
    evil_objects = {"model": {"weight": Evil(marker)}, "optimizer": None}
    TwoRanks(monkeypatch, rank=1, incoming=saved({"commits": 1, "attrs": {}, "objects": evil_objects}))
    state = hvd.elastic.TorchState(model, torch.optim.SGD(model.parameters(), lr=0.1), epoch=0)
    with pytest.raises(UnsafeStateError):
        state.sync()
    assert not marker.exists()


@pytest.mark.attack
def test_a_malicious_optimizer_state_is_refused_without_running_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "marker"
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    TwoRanks(monkeypatch, rank=1, incoming=saved({"state": {}, "param_groups": [{"lr": Evil(marker)}]}))
    with pytest.raises(UnsafeStateError, match="optimizer state broadcast by rank 0"):
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    assert not marker.exists()
    assert optimizer.param_groups[0]["lr"] == 0.1


def test_a_real_elastic_state_still_syncs(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a root sends (numbers, numpy values, tensors, lists) arrives whole on the other rank."""
    source = hvd.elastic.ObjectState(epoch=3, seen=[1, 2], rng=np.arange(4, dtype=np.int32), t=torch.ones(2))
    source._commits = 5
    payload = saved(source._capture())
    ranks = TwoRanks(monkeypatch, rank=1, incoming=payload)
    state = hvd.elastic.ObjectState(epoch=0, seen=[], rng=np.zeros(4, dtype=np.int32), t=torch.zeros(2))
    state.sync()
    assert (state.epoch, state.seen, state._commits) == (3, [1, 2], 5)
    assert isinstance(state.rng, np.ndarray) and state.rng.tolist() == [0, 1, 2, 3]
    assert torch.equal(state.t, torch.ones(2)) and ranks.ledger == [(1, 1, 2, 5, "scale_out")]


def test_a_root_with_an_object_attribute_refuses_and_the_others_do_not_hang(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root = TwoRanks(monkeypatch, rank=0)
    state = hvd.elastic.ObjectState(epoch=1, model_config=Custom())
    with pytest.raises(ConfigError, match=r"hvd.elastic state sync .*model_config.*holds a Custom"):
        state.sync()
    assert root.sizes == [-1]  # the refusal was broadcast before the root raised
    TwoRanks(monkeypatch, rank=1, refused=True)
    with pytest.raises(ConfigError, match="rank 0 could not send the elastic state"):
        hvd.elastic.ObjectState(epoch=0).sync()


@pytest.fixture
def no_pickle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(functions.ALLOW_PICKLE_ENV, raising=False)


@pytest.mark.attack
@pytest.mark.usefixtures("no_pickle")
def test_broadcast_object_refuses_a_pickle_payload_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A root sending Horovod's pickle (code that runs when unpickled) gets nothing run on rank 1, and
    neither does one sending the payload inside ``torch.save`` bytes."""
    marker = tmp_path / "marker"
    TwoRanks(monkeypatch, rank=1, incoming=functions._pickled(Evil(marker)).numpy().tobytes())
    with pytest.raises(UnsafeStateError, match="refusing the object broadcast by rank 0"):
        hvd.broadcast_object(None, root_rank=0)
    TwoRanks(monkeypatch, rank=1, incoming=saved({"object": Evil(marker)}))
    with pytest.raises(UnsafeStateError):
        hvd.broadcast_object(None, root_rank=0)
    assert not marker.exists()


@pytest.mark.attack
@pytest.mark.usefixtures("no_pickle")
def test_allgather_object_refuses_a_pickle_payload_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "marker"
    evil = functions._pickled(Evil(marker))
    monkeypatch.setattr(functions, "world", lambda: 2)
    monkeypatch.setattr(basics, "rank", lambda: 0)
    monkeypatch.setattr(
        functions, "_gather", lambda mine: (torch.cat([mine, evil]), [mine.numel(), evil.numel()])
    )
    with pytest.raises(UnsafeStateError, match="allgathered from rank 1"):
        hvd.allgather_object({"step": 1})
    assert not marker.exists()


@pytest.mark.usefixtures("no_pickle")
def test_plain_objects_travel_without_pickle(monkeypatch: pytest.MonkeyPatch) -> None:
    """What Horovod's examples and the repo's tests send (ints, strings, dicts, tuples, tensors, numpy
    values) arrives whole, loaded with weights_only."""
    value = {
        "epoch": 3,
        "name": "run",
        "pair": ("rank", 1),
        "t": torch.ones(2),
        "np": np.arange(3),
        "x": None,
    }
    TwoRanks(monkeypatch, rank=1, incoming=saved(functions._encode(value, "test")))
    got = hvd.broadcast_object(None, root_rank=0)
    assert (got["epoch"], got["name"], got["pair"], got["x"]) == (3, "run", ("rank", 1), None)
    assert torch.equal(got["t"], torch.ones(2)) and got["np"].tolist() == [0, 1, 2]
    root = TwoRanks(monkeypatch, rank=0)
    assert hvd.broadcast_object({"from": 0}, root_rank=0) == {"from": 0} and root.sizes[0] > 0
    parts = [functions._saved(functions._encode(v, "test")) for v in (("rank", 0), ("rank", 1))]
    monkeypatch.setattr(basics, "rank", lambda: 0)
    monkeypatch.setattr(functions, "_gather", lambda mine: (torch.cat(parts), [p.numel() for p in parts]))
    assert hvd.allgather_object(("rank", 0)) == [("rank", 0), ("rank", 1)]


@pytest.mark.usefixtures("no_pickle")
def test_an_object_that_needs_pickle_is_refused_on_the_root_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The root refuses (one line saying how to opt in) and sends its refusal: rank 1 raises too."""
    root = TwoRanks(monkeypatch, rank=0)
    with pytest.raises(ConfigError) as refused:
        hvd.broadcast_object({"config": Custom()}, root_rank=0)
    message = str(refused.value)
    assert "\n" not in message and "Custom" in message and "ELASTRAIN_HVD_ALLOW_PICKLE=1" in message
    assert root.sizes == [-1]
    TwoRanks(monkeypatch, rank=1, refused=True)
    with pytest.raises(ConfigError, match="rank 0 could not send the object"):
        hvd.broadcast_object(None, root_rank=0)
    monkeypatch.setattr(functions, "world", lambda: 1)  # a world of one refuses it the same way
    with pytest.raises(ConfigError, match="ELASTRAIN_HVD_ALLOW_PICKLE"):
        hvd.allgather_object(Custom())


def test_pickling_is_an_explicit_opt_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """With ELASTRAIN_HVD_ALLOW_PICKLE=1 the user-facing API carries arbitrary objects, as Horovod's does
    (docs/security.md: every sender is then trusted; the docstring says so)."""
    monkeypatch.setenv(functions.ALLOW_PICKLE_ENV, "1")
    TwoRanks(monkeypatch, rank=1, incoming=functions._pickled(Custom()).numpy().tobytes())
    assert isinstance(hvd.broadcast_object(None, root_rank=0), Custom)
    assert "ELASTRAIN_HVD_ALLOW_PICKLE" in (hvd.broadcast_object.__doc__ or "")
