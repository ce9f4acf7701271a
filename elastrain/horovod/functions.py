"""Horovod's helper collectives (``horovod.torch.functions``): parameters, optimizer state, objects.

Trust model (``docs/security.md``): ``broadcast_object`` and ``allgather_object`` pickle arbitrary
objects, as Horovod's and ``torch.distributed.broadcast_object_list`` do, so unpickling what the root
(or any rank) sends can run code chosen by that rank. Those ranks are the members of the current
generation, which the token-authenticated coordinator admitted; a user script calls these functions
knowingly. elastrain's own broadcasts (``broadcast_optimizer_state``, ``hvd.elastic`` state sync) go
through `broadcast_state` instead: ``torch.save`` on the root, ``torch.load(weights_only=True)``
elsewhere, so a peer cannot make a rank run code through them.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
import torch.distributed as dist

from elastrain.errors import ConfigError
from elastrain.horovod import basics
from elastrain.horovod.collectives import _gather, broadcast_
from elastrain.horovod.ops import _check_process_set, global_process_set, guard, world
from elastrain.runtime.safe_load import safe_torch_load

_REFUSED = -1  # the size the root broadcasts when it could not produce what it was to send


def _named_tensors(params: Any) -> list[tuple[str | None, torch.Tensor]]:
    if isinstance(params, Mapping):
        return sorted(params.items(), key=lambda kv: str(kv[0]))
    if isinstance(params, Iterable) and not isinstance(params, torch.Tensor):
        return [p if isinstance(p, tuple) else (None, p) for p in params]
    raise ValueError(f"invalid params of type: {type(params)}")


def broadcast_parameters(params: Any, root_rank: int) -> None:
    """Overwrite every tensor of `params` with the root rank's, in place.

    `params`: ``model.state_dict()``, ``model.named_parameters()``, ``model.parameters()`` or a list
    of tensors. Tensors of one dtype and device travel together as one flat buffer.
    """
    named = _named_tensors(params)
    n = world()
    if n == 1:
        return
    if not 0 <= root_rank < n:
        raise ValueError(f"root_rank {root_rank} is not a rank of this world of {n}")
    buckets: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for _, tensor in named:
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"broadcast_parameters: {type(tensor).__name__} is not a tensor")
        if tensor.numel():
            buckets.setdefault((tensor.dtype, tensor.device), []).append(tensor.detach())
    for tensors in buckets.values():
        flat = torch.cat([t.reshape(-1) for t in tensors])
        broadcast_(flat, root_rank)
        offset = 0
        for t in tensors:
            t.copy_(flat[offset : offset + t.numel()].view_as(t))
            offset += t.numel()


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int, model: Any = None) -> None:
    """Give every worker the root rank's optimizer state and hyper-parameters (``state_dict``).

    Horovod first initialises an empty state with a zero-gradient ``step()``; here an empty state
    stays empty (the optimizer creates it at its first real step, the same on every rank).

    The state travels through `broadcast_state` (tensors, numbers, strings and containers only): a
    rank that receives it never unpickles code.
    """
    state = broadcast_state(optimizer.state_dict, root_rank, "optimizer state")
    if basics.rank() != root_rank:
        optimizer.load_state_dict(state)


def _to_bytes(obj: Any) -> torch.Tensor:
    buffer = io.BytesIO()
    pickle.dump(obj, buffer, protocol=pickle.HIGHEST_PROTOCOL)
    return torch.frombuffer(bytearray(buffer.getbuffer()), dtype=torch.uint8)


def _from_bytes(payload: torch.Tensor) -> Any:
    return pickle.loads(payload.cpu().numpy().tobytes())


def broadcast_object(
    obj: Any, root_rank: int = 0, name: str | None = None, process_set: Any = global_process_set
) -> Any:
    """The root rank's `obj` (pickled and broadcast) on every worker.

    Warning: as in Horovod and ``torch.distributed.broadcast_object_list``, the other ranks unpickle
    what the root sends, which can run any code the root chooses. The root is a member of this job's
    current generation (admitted by the coordinator with the job token); do not use this for data a
    rank got from outside the job. Plain tensors need no pickle: use ``broadcast``.
    """
    _check_process_set(process_set)
    n = world()
    if n == 1:
        return obj
    if not 0 <= root_rank < n:
        raise ValueError(f"root_rank {root_rank} is not a rank of this world of {n}")
    device = basics.runtime().groups.device
    me = basics.rank()
    payload = _to_bytes(obj).to(device) if me == root_rank else None
    size = torch.tensor([payload.numel() if payload is not None else 0], dtype=torch.int64, device=device)
    with guard("broadcast_object"):
        dist.broadcast(size, src=root_rank)
        if payload is None:
            payload = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
        dist.broadcast(payload, src=root_rank)
    return obj if me == root_rank else _from_bytes(payload)


def allgather_object(obj: Any, name: str | None = None, process_set: Any = global_process_set) -> list[Any]:
    """Every worker's `obj`, in rank order.

    Warning: every rank unpickles every other rank's object (as in Horovod), see `broadcast_object`.
    """
    _check_process_set(process_set)
    if world() == 1:
        return [obj]
    gathered, sizes = _gather(_to_bytes(obj))
    out, offset = [], 0
    for size in sizes:
        out.append(_from_bytes(gathered[offset : offset + size]))
        offset += size
    return out


def broadcast_state(produce: Callable[[], Any], root_rank: int, what: str) -> Any:
    """The root's ``produce()`` on every rank, without pickling code: elastrain's own broadcasts.

    `produce` runs on the root only; what it returns must hold tensors, numbers, strings and
    lists/tuples/dicts of them. It is sent as ``torch.save`` bytes and loaded with
    ``torch.load(weights_only=True)``: anything else raises `UnsafeStateError` on the receiving
    ranks without running any of it. When `produce` raises on the root, the root sends a refusal
    first, so the other ranks raise too instead of waiting for a payload that never comes.
    """
    n = world()
    if n == 1:
        return produce()
    if not 0 <= root_rank < n:
        raise ValueError(f"root_rank {root_rank} is not a rank of this world of {n}")
    device = basics.runtime().groups.device
    me = basics.rank()
    payload: torch.Tensor | None = None
    failure: BaseException | None = None
    obj: Any = None
    if me == root_rank:
        try:
            obj = produce()
            buffer = io.BytesIO()
            torch.save(obj, buffer)
            payload = torch.frombuffer(bytearray(buffer.getbuffer()), dtype=torch.uint8).to(device)
        except Exception as exc:  # sent as a refusal below, then raised here
            failure = exc
    size = torch.tensor(
        [payload.numel() if payload is not None else _REFUSED if failure else 0],
        dtype=torch.int64,
        device=device,
    )
    with guard(f"broadcasting the {what}"):
        dist.broadcast(size, src=root_rank)
    if failure is not None:  # outside the guard: not a failed collective, not recoverable by a reset
        raise failure
    if int(size.item()) == _REFUSED:
        raise ConfigError(f"rank {root_rank} could not send the {what}; its error says why")
    if payload is None:
        payload = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    with guard(f"broadcasting the {what}"):
        dist.broadcast(payload, src=root_rank)
    if me == root_rank:
        return obj
    return safe_torch_load(
        io.BytesIO(payload.cpu().numpy().tobytes()),
        f"the {what} broadcast by rank {root_rank}",
        "the sending worker is not running a trusted elastrain; stop the job and check who holds its token",
    )


__all__ = ["allgather_object", "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters"]
