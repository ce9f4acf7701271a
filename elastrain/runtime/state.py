"""State: what survives a resize (model, optimizer, sampler, user counters) and the per-step commit."""

from __future__ import annotations

import copy
import io
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from elastrain.errors import ConfigError, HostsUpdatedInterrupt
from elastrain.runtime.checkpoint import (
    Checkpointer,
    CheckpointPolicy,
    CheckpointStats,
    check_model_matches,
    load_checkpoint,
)
from elastrain.runtime.data import BatchPolicy, ElasticSampler
from elastrain.runtime.gradsync import GradientSync, StepShape
from elastrain.runtime.progress import ProgressReporter
from elastrain.runtime.safe_load import decode_counters, encode_counters, safe_torch_load

if TYPE_CHECKING:
    from elastrain.runtime.loop import Runtime

ResizeHook = Callable[[int, int], None]


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
        self._last_world = 0
        self._runtime: Runtime | None = None
        self._agreed_pending: bool | None = None
        self._checkpointer: Checkpointer | None = None
        self._resumed = False
        self._progress = ProgressReporter()
        self._grads = GradientSync(self._overlap_shape)
        self._samples_total = 0
        if sampler is not None:
            sampler.bind(self._rank_and_world)

    # ----- plumbing ----------------------------------------------------------------------------
    def _rank_and_world(self) -> tuple[int, int]:
        rt = self._runtime
        return (rt.rank, rt.world_size) if rt is not None else (0, 1)

    def _collective(self, rt: Runtime) -> bool:
        return rt.world_size > 1 or rt.rendezvous is not None

    def _overlap_shape(self) -> StepShape | None:
        """The sampler step in flight, for the gradient hooks (None: no overlap possible)."""
        rt = self._runtime
        current = self.sampler.current() if self.sampler is not None else None
        if rt is None or current is None or not self._collective(rt):
            return None
        return StepShape(len(current.indices), current.size, current.size % rt.world_size == 0)

    def _counters(self) -> dict[str, Any]:
        return {name: copy.deepcopy(getattr(self, name)) for name in self._counter_names}

    def on_resize(self, hook: ResizeHook) -> None:
        """Call ``hook(old_world, new_world)`` after every change of world size (e.g. scale the LR)."""
        self._resize_hooks.append(hook)

    @property
    def rank(self) -> int:
        """This worker's rank in the current generation."""
        return self._rank_and_world()[0]

    @property
    def world_size(self) -> int:
        """Workers in the current generation."""
        return self._rank_and_world()[1]

    # ----- the step ----------------------------------------------------------------------------
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
        rt = self._require_runtime()
        current = self.sampler.current() if self.sampler is not None else None
        collective = self._collective(rt)
        if current is not None:
            shape = StepShape(len(current.indices), current.size, current.size % rt.world_size == 0)
        else:  # one sample per rank: the plain average over ranks
            world = rt.world_size if collective else 1
            shape = StepShape(1, world, True)
        if current is not None and rt.generation is not None:
            rt.ledger.processed(rt.generation.number, current.epoch, self.step, current.indices)
        params = [p for p in self.model.parameters() if p.requires_grad]
        total, self._agreed_pending = self._grads.allreduce(
            params, shape, loss_reduction, rt.pending(), collective, rt.context.bucket_bytes
        )
        return total

    def commit(self, loss: float | torch.Tensor | None = None) -> None:
        """Mark the current step done. Every rank stops here together when a resize is pending.

        `loss` (optional) is only read when a progress report to the control plane is due.
        """
        rt = self._require_runtime()
        step = self.sampler.commit_step() if self.sampler is not None else None
        if step is not None:
            self._samples_total += step.size
        first_of_generation = False
        if rt.generation is not None:
            epoch = step.epoch if step is not None else getattr(self, "epoch", 0)
            rt.ledger.committed(rt.generation.number, epoch, self.step, rt.world_size)
            if rt.reported_generation != rt.generation.number:
                rt.reported_generation = rt.generation.number
                first_of_generation = True
                if rt.rank == 0 and rt.rendezvous is not None:
                    rt.rendezvous.report_first_step(rt.generation.number, time.time())
        self.step += 1
        self._committed_counters = self._counters()
        if rt.rendezvous is not None:
            rt.rendezvous.committed_step = self.step
        # the first step of a generation is reported at once: a draining container waits for it
        if rt.rank == 0 and (self._progress.due() or (first_of_generation and self._progress.enabled)):
            epoch = self.sampler.epoch if self.sampler is not None else int(getattr(self, "epoch", 0))
            value = float(loss.detach()) if isinstance(loss, torch.Tensor) else loss
            hosts = sorted({m.host for m in rt.generation.members}) if rt.generation is not None else []
            self._progress.report(self.step, epoch, rt.world_size, self._samples_total, value, hosts)
        if self._checkpointer is not None and rt.rank == 0 and self._checkpointer.due(self.step):
            self._checkpointer.save(self.state_dict(), rt.world_size)
        pending = self._agreed_pending
        self._agreed_pending = None
        if pending is None:
            pending = rt.agree_pending(rt.pending()) if rt.rendezvous is not None else False
        if pending:
            raise HostsUpdatedInterrupt(f"generation change at step {self.step}")

    def rollback(self) -> None:
        """After an interrupted step: forget uncommitted progress (counters, in-flight batches)."""
        for name, value in self._committed_counters.items():
            setattr(self, name, copy.deepcopy(value))
        if self.sampler is not None:
            self.sampler.reset()
        self._grads.abandon()
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
        self._agreed_pending = None

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

    def sync(self, rt: Runtime) -> None:
        """Bring every rank of a new generation to the state of the most advanced member."""
        self._runtime = rt
        self._setup_checkpoints(rt)
        generation = rt.generation
        if generation is None:
            if rt.synced_generation == 0 and not self._resumed:  # a plain script: world of one
                self._resume(rt)
            return
        if rt.synced_generation == generation.number:
            return
        if rt.rank == generation.src_rank and generation.members[generation.src_rank].committed_step <= 0:
            self._resume(rt)  # a fresh job: the source loads the checkpoint, the broadcast spreads it
        if generation.sync_state and generation.world_size > 1:
            device = rt.groups.device
            if rt.rank == generation.src_rank:
                buffer = io.BytesIO()
                torch.save(self.state_dict(), buffer)
                payload = torch.frombuffer(bytearray(buffer.getbuffer()), dtype=torch.uint8).to(device)
                size = torch.tensor([payload.numel()], dtype=torch.int64, device=device)
            else:
                size = torch.zeros(1, dtype=torch.int64, device=device)
            dist.broadcast(size, src=generation.src_rank)
            if rt.rank != generation.src_rank:
                payload = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
            dist.broadcast(payload, src=generation.src_rank)
            if rt.rank != generation.src_rank:
                data = io.BytesIO(payload.cpu().numpy().tobytes())
                self.load_state_dict(load_broadcast(data, generation.src_rank))
        rt.synced_generation = generation.number
        rt.ledger.generation(generation.number, rt.rank, rt.world_size, self.step, generation.cause.value)
        if self.sampler is not None:
            self.sampler.reset()
        old, new = self._last_world, rt.world_size
        self._last_world = new
        if old and old != new:
            for hook in self._resize_hooks:
                hook(old, new)

    # ----- durable checkpoints -------------------------------------------------------------------
    def _setup_checkpoints(self, rt: Runtime) -> None:
        ctx = rt.context
        if self._checkpointer is None and ctx.checkpoint_dir is not None:
            self._checkpointer = Checkpointer(
                CheckpointPolicy(
                    ctx.checkpoint_dir,
                    ctx.checkpoint_every_steps,
                    ctx.checkpoint_every_seconds,
                    ctx.checkpoint_keep,
                )
            )
            if rt.rank == 0 and self._progress.enabled:  # the job page lists the checkpoints
                self._checkpointer.on_published = self._progress.checkpoint

    def _resume(self, rt: Runtime) -> None:
        self._resumed = True
        path = rt.context.resume_from
        if path is None:
            return
        saved = load_checkpoint(path)
        if self.model is not None:
            check_model_matches(self.model.state_dict(), saved, path)
        self.load_state_dict(saved)
        if self._checkpointer is not None:
            self._checkpointer._last_step = self.step
        print(f"elastrain: resumed from {path} at step {self.step}", flush=True)

    def finish_checkpoints(self, rt: Runtime) -> None:
        """Training ended on this rank: rank 0 writes a final checkpoint and waits for it."""
        if self._checkpointer is None:
            return
        if rt.rank == 0:
            self._checkpointer.save(self.state_dict(), rt.world_size, background=False)
        self._checkpointer.wait()

    @property
    def checkpoint_stats(self) -> CheckpointStats | None:
        """Stall and write times of the saves so far (None without checkpointing)."""
        return self._checkpointer.stats if self._checkpointer is not None else None

    def _require_runtime(self) -> Runtime:
        if self._runtime is None:
            from elastrain.runtime.loop import get_runtime

            rt = get_runtime()
            if rt.rendezvous is not None:
                raise ConfigError("call state.commit() inside a function wrapped with @elastrain.run")
            self._runtime = rt
        return self._runtime


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


__all__ = ["BatchPolicy", "State"]
