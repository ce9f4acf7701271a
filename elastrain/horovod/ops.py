"""Horovod's collective operations (``horovod.torch.mpi_ops``) over the current generation's process group.

Each operation is one torch.distributed collective on the group elastrain built for the current
generation (gloo on CPU, NCCL on GPU). A failure (a peer died, the group is being rebuilt) raises
``HorovodInternalError``. ``name`` arguments are accepted and ignored: collectives are matched by
call order, so every rank must issue them in the same order (as with torch.distributed).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from elastrain.errors import PeerFailure
from elastrain.horovod import basics
from elastrain.horovod.compression import Compression, Compressor
from elastrain.horovod.errors import HorovodInternalError

# the values of Horovod's ReduceOp
Average, Sum, Adasum, Min, Max, Product = 0, 1, 2, 3, 4, 5
_OP_NAMES = {Average: "Average", Sum: "Sum", Adasum: "Adasum", Min: "Min", Max: "Max", Product: "Product"}
ADASUM_UNSUPPORTED = (
    "hvd.Adasum is not supported by elastrain's implementation of the Horovod API (there is no Adasum "
    "reduction); use op=hvd.Average (the default) or hvd.Sum"
)


class ProcessSet:
    """The global process set: every worker of the current generation (the only set supported)."""

    process_set_id = 0

    def included(self) -> bool:
        """Every worker belongs to it."""
        return True

    def size(self) -> int:
        """The current world size."""
        return basics.size()

    def rank(self) -> int:
        """This worker's rank."""
        return basics.rank()

    def __repr__(self) -> str:
        return "ProcessSet(global)"


global_process_set = ProcessSet()


def _check_process_set(process_set: Any) -> None:
    if process_set is not None and process_set is not global_process_set:
        raise NotImplementedError("only the global process set is supported (no hvd.add_process_set)")


def resolve_op(op: int | None, average: bool | None = None) -> int:
    """Horovod's op/average rules: ``average`` is the deprecated spelling; the default is Average."""
    if op is not None and average is not None:
        raise ValueError("the op parameter supersedes average; give only op")
    if average is not None:
        return Average if average else Sum
    op = Average if op is None else int(op)
    if op == Adasum:
        raise NotImplementedError(ADASUM_UNSUPPORTED)
    if op not in _OP_NAMES:
        raise ValueError(
            f"unknown reduction op {op}; use hvd.Average, hvd.Sum, hvd.Min, hvd.Max or hvd.Product"
        )
    return op


def _torch_op(op: int) -> Any:
    return {Min: dist.ReduceOp.MIN, Max: dist.ReduceOp.MAX, Product: dist.ReduceOp.PRODUCT}.get(
        op, dist.ReduceOp.SUM
    )


def world() -> int:
    """The world size, checking that a process group exists when one is needed."""
    n = basics.size()
    if n > 1 and not dist.is_initialized():
        raise HorovodInternalError("there is no process group (a resize is in progress); rejoin first")
    return n


@contextmanager
def guard(what: str) -> Iterator[None]:
    """Turn a failed collective into ``HorovodInternalError`` (recoverable inside hvd.elastic.run)."""
    try:
        yield
    except HorovodInternalError:
        raise
    except (RuntimeError, PeerFailure) as exc:  # PeerFailure: one of elastrain's own collectives
        raise HorovodInternalError(
            f"{what} failed: {str(exc).splitlines()[0] if str(exc) else exc!r}"
        ) from exc


def _on_group_device(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor`, or a copy on the device the group's backend needs (NCCL: the GPU; gloo: the CPU)."""
    device = basics.runtime().groups.device
    return tensor if tensor.device.type == device.type else tensor.to(device)


def _finish_reduce(tensor: torch.Tensor, op: int, n: int, postscale: float) -> None:
    if op == Average and n > 1:
        if tensor.dtype.is_floating_point or tensor.dtype.is_complex:
            tensor.div_(n)
        else:
            tensor.div_(n, rounding_mode="trunc")
    if postscale != 1.0:
        tensor.mul_(postscale)


# ----- handles (the async API) -----------------------------------------------------------------------
@dataclass
class _Pending:
    work: Any  # dist.Work, or None when nothing is in flight
    finish: Callable[[], Any]


_HANDLES: dict[int, _Pending] = {}
_IDS = itertools.count(1)


def _register(work: Any, finish: Callable[[], Any]) -> int:
    handle = next(_IDS)
    _HANDLES[handle] = _Pending(work, finish)
    return handle


def synchronize(handle: int) -> Any:
    """Wait for an async operation and return its result."""
    pending = _HANDLES.pop(handle, None)
    return None if pending is None else pending.finish()


def poll(handle: int) -> bool:
    """True when the async operation has completed (``synchronize`` will not block)."""
    pending = _HANDLES.get(handle)
    return pending is None or pending.work is None or bool(pending.work.is_completed())


# ----- allreduce -----------------------------------------------------------------------------------
def _launch_allreduce(tensor: torch.Tensor, op: int, prescale: float, postscale: float) -> int:
    n = world()
    target = tensor.detach()  # same storage: in place even on a parameter that requires grad
    if prescale != 1.0:
        target.mul_(prescale)
    work_tensor = _on_group_device(target) if n > 1 else target
    work = None
    if n > 1:
        with guard("allreduce"):
            work = dist.all_reduce(work_tensor, op=_torch_op(op), async_op=True)

    def finish() -> torch.Tensor:
        if work is not None:
            with guard("allreduce"):
                work.wait()
        if work_tensor is not target:
            target.copy_(work_tensor)
        _finish_reduce(target, op, n, postscale)
        return tensor

    return _register(work, finish)


def allreduce_async_(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = global_process_set,
) -> int:
    """Start an in-place reduction of `tensor` over all workers; returns a handle."""
    _check_process_set(process_set)
    return _launch_allreduce(tensor, resolve_op(op, average), prescale_factor, postscale_factor)


def allreduce_async(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = global_process_set,
) -> int:
    """Start a reduction of a copy of `tensor` (`tensor` is not modified); returns a handle."""
    _check_process_set(process_set)
    output = tensor.detach().clone()
    return _launch_allreduce(output, resolve_op(op, average), prescale_factor, postscale_factor)


def allreduce_(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = global_process_set,
) -> torch.Tensor:
    """Reduce `tensor` in place over all workers (Average by default) and return it."""
    handle = allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor, process_set)
    result: torch.Tensor = synchronize(handle)
    return result


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, op: int, prescale: float, postscale: float) -> torch.Tensor:
        ctx.op, ctx.prescale, ctx.postscale = op, prescale, postscale
        result: torch.Tensor = synchronize(
            allreduce_async(tensor, op=op, prescale_factor=prescale, postscale_factor=postscale)
        )
        return result

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        reduced = allreduce(grad, op=ctx.op, prescale_factor=ctx.prescale, postscale_factor=ctx.postscale)
        return reduced, None, None, None


def allreduce(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    compression: type[Compressor] = Compression.none,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = global_process_set,
) -> torch.Tensor:
    """The reduction of `tensor` over all workers (Average by default); differentiable."""
    _check_process_set(process_set)
    resolved = resolve_op(op, average)
    compressed, ctx = compression.compress(tensor)
    reduced = _Allreduce.apply(compressed, resolved, prescale_factor, postscale_factor)
    return compression.decompress(reduced, ctx)


def grouped_allreduce(tensors: Sequence[torch.Tensor], **kwargs: Any) -> list[torch.Tensor]:
    """``allreduce`` of each tensor (one collective each)."""
    return [allreduce(t, **kwargs) for t in tensors]


def grouped_allreduce_(tensors: Sequence[torch.Tensor], **kwargs: Any) -> list[torch.Tensor]:
    """``allreduce_`` of each tensor in place."""
    return [allreduce_(t, **kwargs) for t in tensors]


__all__ = [
    "ADASUM_UNSUPPORTED",
    "Adasum",
    "Average",
    "Max",
    "Min",
    "ProcessSet",
    "Product",
    "Sum",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "global_process_set",
    "grouped_allreduce",
    "grouped_allreduce_",
    "poll",
    "resolve_op",
    "synchronize",
]
