"""Horovod's gathering collectives: ``allgather``, ``broadcast`` (and their variants), ``join``, ``barrier``.

Like :mod:`elastrain.horovod.ops`: one torch.distributed collective each over the current
generation's group; a failure raises ``HorovodInternalError``; ``name`` arguments are ignored.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from elastrain.horovod import basics
from elastrain.horovod.ops import (
    Average,
    _check_process_set,
    _on_group_device,
    _register,
    allreduce,
    global_process_set,
    guard,
    world,
)


# ----- allgather -----------------------------------------------------------------------------------
def _gather(tensor: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
    """Concatenate every worker's `tensor` along dim 0 (first dims may differ); also the row counts."""
    source = tensor.detach()
    if source.dim() == 0:
        source = source.reshape(1)
    n = world()
    if n == 1:
        return source.clone(), [source.shape[0]]
    local = _on_group_device(source.contiguous())
    with guard("allgather"):
        counts = [torch.zeros(1, dtype=torch.int64, device=local.device) for _ in range(n)]
        dist.all_gather(counts, torch.tensor([local.shape[0]], dtype=torch.int64, device=local.device))
        rows = [int(c.item()) for c in counts]
        padded = local.new_zeros((max(rows), *local.shape[1:]))
        padded[: local.shape[0]] = local
        parts = [torch.empty_like(padded) for _ in range(n)]
        dist.all_gather(parts, padded)
    result = torch.cat([p[:r] for p, r in zip(parts, rows)])
    return result.to(tensor.device), rows


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor) -> torch.Tensor:
        result, rows = _gather(tensor)
        me = basics.rank()
        ctx.offset, ctx.rows = sum(rows[:me]), rows[me]
        return result

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        reduced = allreduce(grad, op=Average)
        return reduced.narrow(0, ctx.offset, ctx.rows)


def allgather(
    tensor: torch.Tensor, name: str | None = None, process_set: Any = global_process_set
) -> torch.Tensor:
    """Every worker's `tensor` concatenated along the first dimension, in rank order; differentiable."""
    _check_process_set(process_set)
    result: torch.Tensor = _Allgather.apply(tensor)
    return result


def allgather_async(
    tensor: torch.Tensor, name: str | None = None, process_set: Any = global_process_set
) -> int:
    """``allgather`` behind a handle (it runs at once)."""
    result = allgather(tensor, name, process_set)
    return _register(None, lambda: result)


# ----- broadcast -----------------------------------------------------------------------------------
def _check_root(root_rank: int, n: int) -> None:
    if not 0 <= root_rank < n:
        raise ValueError(f"root_rank {root_rank} is not a rank of this world of {n}")


def broadcast_(
    tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set: Any = global_process_set
) -> torch.Tensor:
    """Overwrite `tensor` with the root rank's, in place; returns it."""
    _check_process_set(process_set)
    n = world()
    _check_root(root_rank, n)
    if n == 1:
        return tensor
    target = tensor.detach()
    work_tensor = _on_group_device(target)
    with guard("broadcast"):
        dist.broadcast(work_tensor, src=root_rank)
    if work_tensor is not target:
        target.copy_(work_tensor)
    return tensor


def broadcast_async_(
    tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set: Any = global_process_set
) -> int:
    """``broadcast_`` behind a handle (it runs at once)."""
    result = broadcast_(tensor, root_rank, name, process_set)
    return _register(None, lambda: result)


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, root_rank: int) -> torch.Tensor:
        ctx.root_rank = root_rank
        return broadcast_(tensor.detach().clone(), root_rank)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        reduced = allreduce(grad, op=Average)
        if basics.rank() != ctx.root_rank:
            reduced = reduced * 0
        return reduced, None


def broadcast(
    tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set: Any = global_process_set
) -> torch.Tensor:
    """A copy of the root rank's `tensor` on every worker; differentiable."""
    _check_process_set(process_set)
    result: torch.Tensor = _Broadcast.apply(tensor, root_rank)
    return result


def broadcast_async(
    tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set: Any = global_process_set
) -> int:
    """``broadcast`` behind a handle (it runs at once)."""
    result = broadcast(tensor, root_rank, name, process_set)
    return _register(None, lambda: result)


# ----- join and barrier ----------------------------------------------------------------------------
def join(device: int = -1) -> int:
    """Wait until every worker has called ``join()``; returns the rank that called it last.

    Unlike Horovod, a worker that has joined does not stand in (with zeros) for collectives the
    others still issue: every worker must run the same collectives before joining.
    """
    n = world()
    if n == 1:
        return basics.rank()
    stamp = torch.tensor([time.time()], dtype=torch.float64)
    stamps, _ = _gather(stamp)
    return int(torch.argmax(stamps).item())


def barrier(process_set: Any = global_process_set) -> None:
    """Wait until every worker reaches this point."""
    _check_process_set(process_set)
    if world() > 1:
        with guard("barrier"):
            dist.barrier()


__all__ = [
    "allgather",
    "allgather_async",
    "barrier",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "join",
]
