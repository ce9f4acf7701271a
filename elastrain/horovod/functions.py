"""Horovod's helper collectives (``horovod.torch.functions``): parameters, optimizer state, objects.

Trust model (``docs/security.md``): nothing a rank receives here is unpickled by default.
elastrain's own broadcasts (``broadcast_optimizer_state``, ``hvd.elastic`` state sync) go through
`broadcast_state`: ``torch.save`` on the root, ``torch.load(weights_only=True)`` elsewhere, so a peer
cannot make a rank run code through them. ``broadcast_object`` and ``allgather_object`` take the same
safe path: objects of numbers, strings, bytes, tensors, numpy arrays and lists/tuples/dicts of them
travel; another object is refused on the rank that sends it, with a one-line error. Horovod pickles
any object (cloudpickle), which lets the sender run code on every receiving rank; with
``ELASTRAIN_HVD_ALLOW_PICKLE=1`` in the job's environment (every rank's) these two functions pickle
as Horovod's do.
"""

from __future__ import annotations

import io
import os
import pickle
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
import torch.distributed as dist

from elastrain.errors import ConfigError
from elastrain.horovod import basics
from elastrain.horovod.collectives import _gather, broadcast_
from elastrain.horovod.ops import _check_process_set, global_process_set, guard, world
from elastrain.runtime.safe_load import decode_counters, encode_counters, safe_torch_load

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


ALLOW_PICKLE_ENV = "ELASTRAIN_HVD_ALLOW_PICKLE"
_OPT_IN = (
    f"set {ALLOW_PICKLE_ENV}=1 in the job's environment (every rank) to pickle it as Horovod does: "
    "the receiving ranks then run whatever code the sender's pickle holds"
)


_UNTRUSTED = (
    "the sending worker is not running a trusted elastrain; stop the job and check who holds its token"
)
_PLAIN = (bool, int, float, complex, str, bytes, type(None))


def pickle_allowed() -> bool:
    """``ELASTRAIN_HVD_ALLOW_PICKLE=1`` (or true/yes): `broadcast_object`/`allgather_object` pickle."""
    return os.environ.get(ALLOW_PICKLE_ENV, "").strip().lower() in ("1", "true", "yes")


def _unsafe_part(value: Any, where: str) -> tuple[str, str] | None:
    """(where, type name) of the first part of `value` that only pickling could send; None if none."""
    # exact types: a subclass (an IntEnum member, say) would pickle its class
    if type(value) in _PLAIN or isinstance(value, torch.Tensor):
        return None
    if type(value) is dict:
        for key, item in value.items():
            if type(key) not in _PLAIN:
                return f"{where} (a key)", type(key).__name__
            found = _unsafe_part(item, f"{where}[{key!r}]")
            if found:
                return found
        return None
    if type(value) in (list, tuple):
        for index, item in enumerate(value):
            found = _unsafe_part(item, f"{where}[{index}]")
            if found:
                return found
        return None
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.ndarray) and value.dtype.kind in "biufc":
        return None
    if numpy is not None and isinstance(value, numpy.generic) and value.dtype.kind in "biufc":
        return None
    return where, type(value).__name__


def _encode(obj: Any, what: str) -> Any:
    """`obj` as `broadcast_state` sends it (numpy values tagged); refuses what only pickling could send."""
    found = _unsafe_part(obj, "the object")
    if found is not None:
        part, kind = found
        raise ConfigError(
            f"{what}: {part} is a {kind}, which only pickling could send (sent without pickle: numbers, "
            f"strings, bytes, tensors, numpy arrays and lists/tuples/dicts of them); {_OPT_IN}"
        )
    return encode_counters({"object": obj})


def _decode(payload: Any) -> Any:
    if not isinstance(payload, dict) or set(payload) != {"object"}:
        raise ConfigError(f"hvd object collective: a malformed payload arrived; {_UNTRUSTED}")
    return decode_counters(payload)["object"]


def _pickled(obj: Any) -> torch.Tensor:
    buffer = io.BytesIO()
    pickle.dump(obj, buffer, protocol=pickle.HIGHEST_PROTOCOL)
    return torch.frombuffer(bytearray(buffer.getbuffer()), dtype=torch.uint8)


def _unpickled(payload: torch.Tensor) -> Any:
    return pickle.loads(payload.cpu().numpy().tobytes())  # only with ELASTRAIN_HVD_ALLOW_PICKLE=1


def _saved(obj: Any) -> torch.Tensor:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return torch.frombuffer(bytearray(buffer.getbuffer()), dtype=torch.uint8)


def broadcast_object(
    obj: Any, root_rank: int = 0, name: str | None = None, process_set: Any = global_process_set
) -> Any:
    """The root rank's `obj` on every worker.

    Without pickling (the default): `obj` may hold numbers, strings, bytes, tensors, numpy arrays and
    lists/tuples/dicts of them; it travels as ``torch.save`` bytes and loads with
    ``torch.load(weights_only=True)``, so the root cannot make another rank run code (tensors arrive
    on the CPU). Another object raises `ConfigError` (one line) on the root, and the other ranks raise
    too instead of waiting.
    With ``ELASTRAIN_HVD_ALLOW_PICKLE=1`` on every rank it is pickled as in Horovod: the other ranks
    unpickle what the root sends, which can run any code the root chooses (``docs/security.md``).
    """
    _check_process_set(process_set)
    n = world()
    if not pickle_allowed():
        if n == 1:
            _encode(obj, "hvd.broadcast_object")  # refused in a world of one too: the same script
            return obj
        if not 0 <= root_rank < n:
            raise ValueError(f"root_rank {root_rank} is not a rank of this world of {n}")
        received = broadcast_state(lambda: _encode(obj, "hvd.broadcast_object"), root_rank, "object")
        return obj if basics.rank() == root_rank else _decode(received)
    if n == 1:
        return obj
    if not 0 <= root_rank < n:
        raise ValueError(f"root_rank {root_rank} is not a rank of this world of {n}")
    device = basics.runtime().groups.device
    me = basics.rank()
    payload = _pickled(obj).to(device) if me == root_rank else None
    size = torch.tensor([payload.numel() if payload is not None else 0], dtype=torch.int64, device=device)
    with guard("broadcast_object"):
        dist.broadcast(size, src=root_rank)
        if payload is None:
            payload = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
        dist.broadcast(payload, src=root_rank)
    return obj if me == root_rank else _unpickled(payload)


def allgather_object(obj: Any, name: str | None = None, process_set: Any = global_process_set) -> list[Any]:
    """Every worker's `obj`, in rank order.

    Without pickling (the default) as `broadcast_object`: what each rank sends may hold numbers,
    strings, bytes, tensors, numpy arrays and containers of them, and loads with
    ``weights_only=True``; a rank whose object is refused sends nothing (the others raise too, naming
    it). With ``ELASTRAIN_HVD_ALLOW_PICKLE=1`` every rank unpickles every other rank's object (as in
    Horovod), which lets any of them run code on the others.
    """
    _check_process_set(process_set)
    safe = not pickle_allowed()
    if world() == 1:
        if safe:
            _encode(obj, "hvd.allgather_object")
        return [obj]
    if not safe:
        gathered, sizes = _gather(_pickled(obj))
        out, offset = [], 0
        for size in sizes:
            out.append(_unpickled(gathered[offset : offset + size]))
            offset += size
        return out
    failure: ConfigError | None = None
    try:
        mine = _saved(_encode(obj, "hvd.allgather_object"))
    except ConfigError as exc:  # raised after the gather: the others must not wait for this rank
        failure, mine = exc, torch.empty(0, dtype=torch.uint8)
    gathered, sizes = _gather(mine)
    if failure is not None:
        raise failure
    refused = [rank for rank, size in enumerate(sizes) if size == 0]
    if refused:
        raise ConfigError(
            f"hvd.allgather_object: rank {refused[0]} could not send its object; its error says why"
        )
    out, offset = [], 0
    for rank, size in enumerate(sizes):
        data = io.BytesIO(gathered[offset : offset + size].cpu().numpy().tobytes())
        out.append(_decode(safe_torch_load(data, f"the object allgathered from rank {rank}", _UNTRUSTED)))
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
        _UNTRUSTED,
    )


__all__ = ["allgather_object", "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters"]
