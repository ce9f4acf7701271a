"""DeepSpeed ZeRO-1/2 resized in place: survivors keep running and exchange partitions from memory.

``ElasticZero`` owns a DeepSpeed engine for an ``elastrain run`` job (native mode) and is kept by the
job's `State` (``state.keep(zero)``), so the generation cycle calls it:

* at every commit (`committed`, before the step counts as committed): it copies this rank's partition
  (fp32 master weights and the base optimizer's state) into a `Piece` and, with `replicas`, sends it
  to the next rank of the ring, receives the previous rank's and waits until every rank has its
  copies: a step is committed only when every partition is in two ranks' memory (the previous step's
  copies are kept until then, for a failure in between).
* when every rank stops together for a planned change (`interrupted`: a scale-out or scale-in, the
  old group still works): every rank gathers every partition, since the ranks that leave may be ring
  neighbours, whose copies would leave with them.
* once per new generation (`regrouped`, after the group is built and the counters, sampler and model
  are synced): the members say which pieces they hold; for each rank of the last complete layout at
  the committed step one holder broadcasts its piece; every member builds a fresh engine for the new
  world (the imports and DeepSpeed's op builds are paid once per process: a rebuild takes
  milliseconds) and takes its slice of every merged tensor, and the model's weights from the merged
  master weights. No checkpoint file and no process start on this path; a new worker receives
  everything from its peers. A killed rank's partition comes from its replica; when both copies of
  a partition are gone the job ends with `ZeroStateLost` (start it again with ``--resume auto``
  from a durable checkpoint).

Memory: with `replicas`, up to four more copies of a partition per rank (its own and its neighbour's,
of this step and the previous one), i.e. 4 x (master weights + optimizer state) / world. Per step: one
copy of the partition, one ring exchange of it and a barrier. Commit after ``zero.step()`` only
(gradient accumulation boundaries).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from elastrain.deepspeed.durable import prune, read_pieces, step_dir, write_piece
from elastrain.deepspeed.pieces import (
    MASTER,
    Piece,
    flat_dtype,
    merged,
    piece_from_header,
    repartition,
)
from elastrain.errors import ConfigError, ElastrainError
from elastrain.runtime.collective import peer_failures

log = logging.getLogger("elastrain.deepspeed")
ConfigFor = Callable[[int], dict[str, Any]]


class ZeroStateLost(ElastrainError):
    """Both copies of a ZeRO partition are gone: the job resumes from its last durable checkpoint."""


@dataclass(frozen=True)
class Offer:
    """A piece a member holds: member `member` has rank `rank`'s partition of a `world` layout."""

    member: int
    rank: int
    world: int
    step: int
    generation: int


@dataclass(frozen=True)
class ResizeFigures:
    """What the last rebuild took: seconds, bytes received from peers, the old and new world."""

    seconds: float
    received_bytes: int
    from_world: int
    to_world: int


def choose_holders(offers: list[Offer], step: int) -> tuple[int, list[int]] | None:
    """(old world, the member that sends each old rank's piece) for the newest layout complete at
    `step`; earlier offers win (a member's own piece before replicas); None when none is complete."""
    layouts: dict[tuple[int, int], dict[int, int]] = {}
    for offer in offers:
        if offer.step == step:
            layouts.setdefault((offer.generation, offer.world), {}).setdefault(offer.rank, offer.member)
    for (_generation, world), held in sorted(layouts.items(), reverse=True):
        if len(held) == world:
            return world, [held[rank] for rank in range(world)]
    return None


class ElasticZero:
    """A DeepSpeed ZeRO stage 1/2 engine kept through resizes and failures in place (module docstring).

    ``config`` is DeepSpeed's config, or a function of the world size returning it (e.g. to set
    ``train_micro_batch_size_per_gpu`` for a fixed global batch). ``engine`` is the current
    generation's engine: read it inside the ``@elastrain.run`` function, after each resize.

    Construct it before ``elastrain.init()``: it pays DeepSpeed's one-time costs (its lazy imports,
    torch's compiler among them, and its ops; seconds) on a private world of one, so a worker joining a
    running job does not hold its peers up while it builds its first engine.
    """

    def __init__(
        self, model: torch.nn.Module, config: dict[str, Any] | ConfigFor, replicas: bool = True
    ) -> None:
        self.model = model
        self._config = config
        self.replicas = replicas
        self.engine: Any = None
        self.last_resize: ResizeFigures | None = None
        self._held: list[Piece] = []
        self._world = 0
        if not dist.is_initialized():
            self._warm_up()

    def _warm_up(self) -> None:
        """Build and drop an engine of a tiny model on a private group of one (see the class docstring)."""
        import deepspeed
        from deepspeed.utils import groups

        started = time.monotonic()
        dtype = next(self.model.parameters()).dtype
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        try:
            tiny = torch.nn.Linear(2, 2).to(dtype)
            config = self._config(1) if callable(self._config) else dict(self._config)
            engine, *_ = deepspeed.initialize(model=tiny, model_parameters=tiny.parameters(), config=config)
            engine.destroy()
        finally:
            groups._release_process_group_references(None)
            dist.destroy_process_group()
        log.info("DeepSpeed warmed up in %.2fs", time.monotonic() - started)

    # ----- the user's handles (DeepSpeed's collectives: a failure is a peer failure) --------------------
    def backward(self, loss: torch.Tensor) -> None:
        """``engine.backward(loss)`` (ZeRO reduces the gradients here)."""
        with peer_failures("DeepSpeed's backward (the gradient reduction)"):
            self.engine.backward(loss)

    def step(self) -> None:
        """``engine.step()`` (ZeRO gathers the updated weights here)."""
        with peer_failures("DeepSpeed's optimizer step"):
            self.engine.step()

    # ----- the generation cycle's calls (`elastrain.runtime.state.StatePart`) ----------------------------
    def committed(self, rank: int, world: int, step: int, generation: int) -> None:
        """Snapshot this rank's partition at `step`; with `replicas`, swap copies around the ring, then
        wait until every rank holds its copies (so no rank commits `step` unless every copy exists;
        the previous step's copies stay for a failure before that)."""
        own = self._snapshot(rank, world, step, generation)
        keep = [
            p
            for p in self._held
            if (p.step == step - 1 and p.generation == generation)
            or (p.step == step and p.generation != generation)
        ]
        self._held = [own, *keep]
        if self.replicas and world > 1:
            replica = self._swap(own, rank, world)
            self._held = [own, replica, *keep]
            dist.barrier()
        durable = self._durable()
        if durable is not None and step > 0 and step % durable[1] == 0:  # rank 0 saves the rest now
            write_piece(durable[0], own)
            if rank == 0:
                prune(durable[0])

    def interrupted(self, rank: int, world: int, step: int, generation: int) -> None:
        """Before a planned change every rank gathers every partition of `step` (leavers may be
        neighbours: a ring replica would leave with them)."""
        own = next(
            (p for p in self._held if (p.rank, p.step, p.generation) == (rank, step, generation)), None
        )
        if own is None or world < 2:
            return
        flats = [torch.empty_like(own.flat) for _ in range(world)]
        dist.all_gather(flats, own.flat)
        self._held = [own] + [
            Piece(r, world, step, generation, own.names, own.sizes, own.totals, flats[r], own.extra)
            for r in range(world)
            if r != rank
        ]

    def regrouped(self, rank: int, world: int, step: int, generation: int) -> None:
        """Rebuild the engine for `world` and load this rank's partition of the state at `step`."""
        started = time.monotonic()
        offers = self._gather_offers(world)
        old_world = self._world
        self._build(world)
        received = 0
        pieces = self._pieces_of(offers, step, rank)
        if pieces is not None:
            received = sum(p.flat.numel() * p.flat.element_size() for p in pieces)
            self._load(pieces, rank, world)
            old_world = pieces[0].world
        # the new layout is kept at once: a failure before the first commit finds it (or the old one)
        self.committed(rank, world, step, generation)
        self.last_resize = ResizeFigures(time.monotonic() - started, received, old_world, world)
        log.info("ZeRO rebuilt for %d ranks at step %d in %.3fs", world, step, self.last_resize.seconds)

    def _pieces_of(self, offers: list[Offer], step: int, rank: int) -> list[Piece] | None:
        """The pieces of the newest layout complete at `step`: from the members' memories, else from
        the durable set of that step; None for a fresh job; `ZeroStateLost` when there are none."""
        chosen = choose_holders(offers, step)
        if chosen is not None:
            old, holders = chosen
            return [self._broadcast_piece(r, holders[r], rank) for r in range(old)]
        durable = self._durable()
        if durable is not None and step > 0:
            on_disk = read_pieces(durable[0], step)
            if on_disk is not None:
                log.info("ZeRO state of step %d read from %s", step, step_dir(durable[0], step))
                return on_disk
        if step == 0:
            return None  # nothing trained yet: the fresh engine is the state
        have = sorted({(o.rank, o.world) for o in offers if o.step == step})
        raise ZeroStateLost(
            f"the ZeRO optimizer state of step {step} cannot be rebuilt: no complete set of partitions "
            f"survives in memory (held: {have}) nor on disk (`--checkpoint-dir` with `--checkpoint-every "
            "N` keeps one every N steps). Start the job again with `elastrain run ... --resume auto` "
            "to go on from the last durable checkpoint"
        )

    def _durable(self) -> tuple[Path, int] | None:
        """(the job's checkpoint directory, every how many steps) when it keeps step-based checkpoints."""
        from elastrain.runtime.connection import get_runtime

        context = get_runtime().context
        if context.checkpoint_dir is None or not context.checkpoint_every_steps:
            return None
        return context.checkpoint_dir, context.checkpoint_every_steps

    # ----- the engine ------------------------------------------------------------------------------------
    def _build(self, world: int) -> None:
        import deepspeed
        from deepspeed.utils import groups

        if self.engine is not None:
            self.engine.destroy()  # its gradient hooks would fire on the old world's group
        for param in self.model.parameters():
            param.grad = (
                None  # a step cut short by a failure may have left some: the first step would add them
            )
        groups._release_process_group_references(None)  # the old world's groups died with it
        config = self._config(world) if callable(self._config) else dict(self._config)
        self.engine, *_ = deepspeed.initialize(
            model=self.model, model_parameters=self.model.parameters(), config=config
        )
        optimizer = self.engine.optimizer
        for needed in ("single_partition_of_fp32_groups", "bit16_groups_flat", "partition_size"):
            if not hasattr(optimizer, needed):
                raise ConfigError(
                    f"ElasticZero resizes ZeRO stages 1 and 2 in place; this engine's optimizer is "
                    f"{type(optimizer).__name__}: set zero_optimization.stage to 1 or 2"
                )
        self._world = world

    def _groups(self) -> int:
        return len(self.engine.optimizer.single_partition_of_fp32_groups)

    def _total(self, group: int) -> int:
        """The group's unpadded flat length (its parameters and their alignment padding)."""
        opt = self.engine.optimizer
        padding = opt.round_robin_bit16_padding[group] if hasattr(opt, "round_robin_bit16_padding") else []
        return sum(p.numel() for p in opt.round_robin_bit16_groups[group]) + sum(padding)

    def _extra(self) -> dict[str, Any]:
        engine = self.engine
        groups_step = [g.get("step") for g in engine.optimizer.optimizer.param_groups]
        extra: dict[str, Any] = {
            "global_steps": int(engine.global_steps),
            "global_samples": int(engine.global_samples),
            "skipped_steps": int(getattr(engine, "skipped_steps", 0)),
            "group_steps": [None if s is None else float(s) for s in groups_step],
        }
        if engine.lr_scheduler is not None:
            extra["lr_scheduler"] = engine.lr_scheduler.state_dict()
        return extra

    def _snapshot(self, rank: int, world: int, step: int, generation: int) -> Piece:
        """A copy of this rank's partition of every group (master weights first, then the state)."""
        opt = self.engine.optimizer
        dtype = opt.single_partition_of_fp32_groups[0].dtype
        names: list[list[str]] = []
        sizes: list[list[int]] = []
        tensors: list[torch.Tensor] = []
        for master in opt.single_partition_of_fp32_groups:
            state = opt.optimizer.state.get(master, {})
            keys = sorted(k for k, v in state.items() if torch.is_tensor(v))
            group = [master.detach(), *(state[k].detach() for k in keys)]
            names.append([MASTER, *keys])
            sizes.append([int(t.numel()) for t in group])
            tensors += [t.reshape(-1).to(dtype) for t in group]
        totals = [self._total(g) for g in range(len(names))]
        return Piece(rank, world, step, generation, names, sizes, totals, torch.cat(tensors), self._extra())

    def _swap(self, own: Piece, rank: int, world: int) -> Piece:
        """Send `own` to the next rank of the ring, receive the previous rank's (same layout, same size)."""
        incoming = torch.empty_like(own.flat)
        ops = [
            dist.P2POp(dist.isend, own.flat, (rank + 1) % world),
            dist.P2POp(dist.irecv, incoming, (rank - 1) % world),
        ]
        for request in dist.batch_isend_irecv(ops):
            request.wait()
        previous = (rank - 1) % world
        return Piece(
            previous, world, own.step, own.generation, own.names, own.sizes, own.totals, incoming, own.extra
        )

    # ----- the rebuild -----------------------------------------------------------------------------------
    def _gather_offers(self, world: int) -> list[Offer]:
        """Every member's pieces (rank, world, step, generation): a count each, then the padded lists."""
        count = torch.tensor([len(self._held)], dtype=torch.int64)
        counts = [torch.zeros_like(count) for _ in range(world)]
        if world > 1:
            dist.all_gather(counts, count)
        else:
            counts = [count]
        most = max(int(c) for c in counts)
        mine = torch.full((max(most, 1), 4), -1, dtype=torch.int64)
        for i, piece in enumerate(self._held):
            mine[i] = torch.tensor([piece.rank, piece.world, piece.step, piece.generation])
        rows = [torch.empty_like(mine) for _ in range(world)]
        if world > 1:
            dist.all_gather(rows, mine)
        else:
            rows = [mine]
        offers = []
        for slot in range(mine.shape[0]):  # every member's own piece (slot 0) before any copy
            for member, row in enumerate(rows):
                r, w, s, g = (int(v) for v in row[slot])
                if r >= 0:
                    offers.append(Offer(member, r, w, s, g))
        return offers

    def _broadcast_piece(self, old_rank: int, holder: int, rank: int) -> Piece:
        """Member `holder` sends its copy of `old_rank`'s piece to every member (header, then tensor)."""
        if rank == holder:
            piece = next(p for p in self._held if p.rank == old_rank)
            header = torch.frombuffer(bytearray(piece.header_bytes()), dtype=torch.uint8)
            size = torch.tensor([header.numel(), piece.flat.numel()], dtype=torch.int64)
        else:
            size = torch.zeros(2, dtype=torch.int64)
        if self._world > 1:
            dist.broadcast(size, src=holder)
        if rank != holder:
            header = torch.empty(int(size[0]), dtype=torch.uint8)
        if self._world > 1:
            dist.broadcast(header, src=holder)
        data = header.numpy().tobytes()
        flat = piece.flat if rank == holder else torch.empty(int(size[1]), dtype=flat_dtype(data))
        if self._world > 1:
            dist.broadcast(flat, src=holder)
        return piece_from_header(data, flat)

    def _load(self, pieces: list[Piece], rank: int, world: int) -> None:
        """This rank's partition of every merged tensor, and the model's weights from the merged master."""
        opt = self.engine.optimizer
        if len(pieces[0].names) != self._groups():
            raise ConfigError(
                f"the ZeRO state has {len(pieces[0].names)} parameter groups, this engine {self._groups()}: "
                "every worker must build the same model and optimizer"
            )
        for g, master in enumerate(opt.single_partition_of_fp32_groups):
            part = int(opt.partition_size[g])
            whole = merged(pieces, g, MASTER)
            if whole.numel() != self._total(g):
                raise ConfigError(
                    f"the ZeRO state's group {g} holds {whole.numel()} weights, this model {self._total(g)}: "
                    "every worker must build the same model"
                )
            master.data.copy_(repartition(whole, rank, world, part))
            opt.bit16_groups_flat[g][: whole.numel()].copy_(whole)  # the model's weights (views into it)
            state = opt.optimizer.state.setdefault(master, {})
            for name in pieces[0].names[g][1:]:
                value = merged(pieces, g, name)
                like = state.get(name)
                dtype = like.dtype if like is not None else torch.float32
                if value.numel() == whole.numel():
                    state[name] = repartition(value, rank, world, part).to(dtype)
                else:
                    state[name] = value.reshape(()).to(dtype)
        self._restore_extra(pieces[0].extra)

    def _restore_extra(self, extra: dict[str, Any]) -> None:
        engine = self.engine
        engine.global_steps = int(extra.get("global_steps", 0))
        engine.global_samples = int(extra.get("global_samples", 0))
        if hasattr(engine, "skipped_steps"):
            engine.skipped_steps = int(extra.get("skipped_steps", 0))
        for group, value in zip(engine.optimizer.optimizer.param_groups, extra.get("group_steps", [])):
            if value is not None:
                group["step"] = value
        if engine.lr_scheduler is not None and "lr_scheduler" in extra:
            engine.lr_scheduler.load_state_dict(extra["lr_scheduler"])


__all__ = ["ElasticZero", "Offer", "ResizeFigures", "ZeroStateLost", "choose_holders"]
