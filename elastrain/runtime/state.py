"""State: what survives a resize (model, optimizer, sampler, user counters), and how it is saved,
restored and sent to the other ranks of a new generation.

`State` holds state only. What happens at a commit (ledger, progress report, checkpoint, the
pending-generation check) belongs to the generation cycle that drives it
(`elastrain.runtime.cycle.GenerationCycle`); `State.commit` and `State.allreduce_gradients` are the
user's handles on that cycle.
"""

from __future__ import annotations

import copy
import io
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.distributed as dist

from elastrain.errors import ConfigError
from elastrain.runtime.checkpoint import CheckpointStats
from elastrain.runtime.collective import peer_failures
from elastrain.runtime.data import BatchPolicy, ElasticSampler
from elastrain.runtime.safe_load import decode_counters, encode_counters, safe_torch_load

if TYPE_CHECKING:
    from elastrain.runtime.connection import Runtime

ResizeHook = Callable[[int, int], None]


class StatePart(Protocol):
    """State the cycle keeps across generations beside the model, optimizer and sampler, which the
    part itself moves between ranks (a ZeRO optimizer's partitions: `elastrain.deepspeed`).

    Every call is a collective of every rank of the current group (the default process group); a
    `RuntimeError` from one is a peer failure (the loop rejoins; from `interrupted`, only a warning).
    """

    def committed(self, rank: int, world: int, step: int, generation: int) -> None:
        """Step `step` is done on every rank and about to be committed: keep what a new generation
        will need of it (a failure here leaves the step uncommitted)."""

    def interrupted(self, rank: int, world: int, step: int, generation: int) -> None:
        """Every rank stopped together after committing `step` for a new generation, and the group
        still works: hand over what ranks that may leave hold (a graceful scale-in)."""

    def regrouped(self, rank: int, world: int, step: int, generation: int) -> None:
        """A new generation's group is built and its state synced at `step`: rebuild for `world`."""


class StepDriver(Protocol):
    """What drives a `State` through steps and generations (`GenerationCycle`)."""

    @property
    def checkpoint_stats(self) -> CheckpointStats | None:
        """Stall and write times of the saves so far."""

    def rank_and_world(self) -> tuple[int, int]:
        """This worker's rank and the world size of the current generation."""

    def allreduce_gradients(self, loss_reduction: str) -> int:
        """The sample-weighted gradient all-reduce of the step in flight."""

    def commit(self, loss: float | torch.Tensor | None) -> None:
        """The commit of the step in flight."""


class State:
    """Training state that elastrain keeps consistent across generations.

    ``State(model=..., optimizer=..., sampler=..., epoch=0)``: keyword counters become attributes
    (``state.epoch``) and are part of the state. ``state.step`` counts committed steps.
    """

    _RESERVED = frozenset({"model", "optimizer", "sampler"})

    def __init__(
        self,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        sampler: ElasticSampler | None = None,
        **counters: Any,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.sampler = sampler
        self.step = 0
        self._counter_names = list(counters)
        for name, value in counters.items():
            setattr(self, name, value)
        self._committed_counters = self._counters()
        self._resize_hooks: list[ResizeHook] = []
        self.parts: list[StatePart] = []
        self._driver: StepDriver | None = None
        if sampler is not None:
            sampler.bind(self._rank_and_world)

    # ----- the driver --------------------------------------------------------------------------
    def attach(self, driver: StepDriver) -> None:
        """Let `driver` (the generation cycle) drive this state's steps."""
        self._driver = driver

    def _driven(self) -> StepDriver:
        if self._driver is None:  # used outside @elastrain.run: only a plain script may
            from elastrain.runtime.cycle import GenerationCycle

            GenerationCycle.standalone(self)
        assert self._driver is not None
        return self._driver

    def _rank_and_world(self) -> tuple[int, int]:
        return self._driver.rank_and_world() if self._driver is not None else (0, 1)

    @property
    def rank(self) -> int:
        """This worker's rank in the current generation."""
        return self._rank_and_world()[0]

    @property
    def world_size(self) -> int:
        """Workers in the current generation."""
        return self._rank_and_world()[1]

    def on_resize(self, hook: ResizeHook) -> None:
        """Call ``hook(old_world, new_world)`` after every change of world size (e.g. scale the LR)."""
        self._resize_hooks.append(hook)

    def keep(self, part: StatePart) -> None:
        """Keep `part` across generations too (its `committed` before each commit, its `interrupted` when
        all ranks stop together for a new generation, its `regrouped` once per generation after the
        state sync)."""
        self.parts.append(part)

    def resized(self, old: int, new: int) -> None:
        """Run the `on_resize` hooks (the cycle calls it when the world size changed)."""
        for hook in self._resize_hooks:
            hook(old, new)

    # ----- the step (the user's handles on the cycle) ----------------------------------------------
    def allreduce_gradients(self, loss_reduction: str = "mean") -> int:
        """Average gradients over every sample of the global step (not over ranks); returns that count.

        Call after ``loss.backward()`` and before ``optimizer.step()``. With ``loss_reduction="mean"``
        the local loss is a mean over this rank's samples; with ``"sum"`` a sum. Either way the result
        equals the gradient of the mean loss over the global batch, whatever the world size. The
        membership flag rides in the same all-reduce, so checking for a resize costs nothing extra.
        Most of the reduction already runs during ``backward()`` (gradient hooks), so between the two
        calls some ``p.grad`` are None: read or clip gradients after this call. Afterwards each
        ``p.grad`` is a view into a persistent buffer.
        """
        if self.model is None:
            raise ConfigError("State.allreduce_gradients needs State(model=...)")
        if loss_reduction not in ("mean", "sum"):
            raise ConfigError(f"loss_reduction must be 'mean' or 'sum', got {loss_reduction!r}")
        return self._driven().allreduce_gradients(loss_reduction)

    def commit(self, loss: float | torch.Tensor | None = None) -> None:
        """Mark the current step done. Every rank stops here together when a resize is pending.

        `loss` (optional) is only read when a progress report to the control plane is due.
        """
        self._driven().commit(loss)

    @property
    def checkpoint_stats(self) -> CheckpointStats | None:
        """Stall and write times of the saves so far (None without checkpointing)."""
        return self._driver.checkpoint_stats if self._driver is not None else None

    # ----- counters: committed and rolled back ---------------------------------------------------
    def _counters(self) -> dict[str, Any]:
        return {name: copy.deepcopy(getattr(self, name)) for name in self._counter_names}

    def advance(self) -> None:
        """The step in flight is committed: count it and remember the counters as they are now."""
        self.step += 1
        self._committed_counters = self._counters()

    def rollback(self) -> None:
        """After an interrupted step: forget uncommitted progress (counters, in-flight batches, grads)."""
        for name, value in self._committed_counters.items():
            setattr(self, name, copy.deepcopy(value))
        if self.sampler is not None:
            self.sampler.reset()
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)

    # ----- (de)serialisation and sync --------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything that makes up the state, as plain objects and tensors.

        Counters are stored as tensors and plain containers (numpy values tagged), so the result
        loads with ``torch.load(weights_only=True)``; a counter holding another object is refused.
        """
        return {
            "step": self.step,
            "counters": encode_counters(self._counters()),
            "model": self.model.state_dict() if self.model is not None else None,
            "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
            "sampler": self.sampler.state_dict() if self.sampler is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from `state_dict`."""
        self.step = int(state["step"])
        for name, value in decode_counters(state["counters"]).items():
            if name not in self._counter_names:
                self._counter_names.append(name)
            setattr(self, name, value)
        if self.model is not None and state["model"] is not None:
            self.model.load_state_dict(state["model"])
        if self.optimizer is not None and state["optimizer"] is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        if self.sampler is not None and state["sampler"] is not None:
            self.sampler.load_state_dict(state["sampler"])
        self._committed_counters = self._counters()

    def broadcast(self, src_rank: int, rank: int, device: torch.device) -> None:
        """Collective: every rank of the group ends with `src_rank`'s state (`PeerFailure` if it fails)."""
        if rank == src_rank:
            buffer = io.BytesIO()
            torch.save(self.state_dict(), buffer)
            payload = torch.frombuffer(bytearray(buffer.getbuffer()), dtype=torch.uint8).to(device)
            size = torch.tensor([payload.numel()], dtype=torch.int64, device=device)
        else:
            size = torch.zeros(1, dtype=torch.int64, device=device)
        with peer_failures("the state broadcast"):
            dist.broadcast(size, src=src_rank)
            if rank != src_rank:
                payload = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
            dist.broadcast(payload, src=src_rank)
        if rank != src_rank:
            data = io.BytesIO(payload.cpu().numpy().tobytes())
            self.load_state_dict(load_broadcast(data, src_rank))

    def sync(self, rt: Runtime) -> None:
        """Bring this state to the most advanced member of `rt`'s generation (the cycle's sync step)."""
        from elastrain.runtime.cycle import GenerationCycle

        GenerationCycle.of(self, rt).sync_state()


def load_broadcast(data: io.BytesIO, src_rank: int) -> dict[str, Any]:
    """The state rank `src_rank` broadcast, loaded with ``weights_only=True`` (a peer cannot run code
    here); anything else raises `UnsafeStateError`."""
    state = safe_torch_load(
        data,
        f"the state broadcast by rank {src_rank}",
        "the sending worker is not running a trusted elastrain; stop the job and check who holds its token",
    )
    if not isinstance(state, dict) or "step" not in state or "counters" not in state:
        raise ConfigError(f"the state broadcast by rank {src_rank} is not an elastrain state")
    return state


__all__ = ["BatchPolicy", "State", "StatePart", "StepDriver", "load_broadcast"]
