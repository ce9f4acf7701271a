"""Loading state without running code: ``torch.load(weights_only=True)`` and plain counters.

Checkpoints and the in-memory state broadcast hold tensors, numbers, strings and containers of them
only, so they load with ``weights_only=True``: a file or a peer cannot make a worker run code. The
few non-torch values a `State` counter commonly holds are converted on save: numpy arrays and
scalars (e.g. ``np.random.get_state()``) become tagged dicts around a tensor; Python's
``random.getstate()`` is a tuple of ints and needs nothing. Any other object in a counter is refused
when the state is saved, with a message naming the counter.
"""

from __future__ import annotations

import io
import pickle
from typing import IO, Any

import torch

from elastrain.errors import CheckpointError, ConfigError

_NDARRAY = "__elastrain_ndarray__"
_NPSCALAR = "__elastrain_npscalar__"
_PLAIN = (bool, int, float, complex, str, bytes, type(None))


class UnsafeStateError(CheckpointError):
    """The serialized state holds objects that only an unsafe (code-running) unpickling could load."""


def encode_counters(counters: dict[str, Any]) -> dict[str, Any]:
    """`counters` as tensors and plain containers (numpy values tagged); refuses anything else."""
    return {name: _encode(value, name) for name, value in counters.items()}


def decode_counters(counters: dict[str, Any]) -> dict[str, Any]:
    """Undo `encode_counters`."""
    return {name: _decode(value) for name, value in counters.items()}


def _encode(value: Any, where: str) -> Any:
    if isinstance(value, (*_PLAIN, torch.Tensor)):
        return value
    if isinstance(value, dict):
        return {k: _encode(v, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(value, list):
        return [_encode(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, tuple) and type(value) is tuple:
        return tuple(_encode(v, f"{where}[{i}]") for i, v in enumerate(value))
    np = _numpy()
    if np is not None and isinstance(value, np.ndarray) and value.dtype.kind in "biufc":
        native = np.array(value, dtype=value.dtype.newbyteorder("="), copy=True, order="C")
        return {_NDARRAY: torch.from_numpy(native)}
    if np is not None and isinstance(value, np.generic):
        return {_NPSCALAR: value.item(), "dtype": value.dtype.str}
    raise ConfigError(
        f"State counter {where} holds a {type(value).__name__}; counters must be numbers, strings, "
        "tensors, numpy arrays or lists/tuples/dicts of them (they are loaded with weights_only=True)"
    )


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        if _NDARRAY in value and len(value) == 1:
            payload = value[_NDARRAY]
            np = _numpy()
            if np is None:
                return payload
            return payload.numpy().copy() if isinstance(payload, torch.Tensor) else payload
        if _NPSCALAR in value and set(value) == {_NPSCALAR, "dtype"}:
            np = _numpy()
            return (
                np.dtype(str(value["dtype"])).type(value[_NPSCALAR]) if np is not None else value[_NPSCALAR]
            )
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_decode(v) for v in value)
    return value


def _numpy() -> Any:
    try:
        import numpy
    except ImportError:  # pragma: no cover - numpy comes with torch in practice
        return None
    return numpy


def safe_torch_load(source: str | IO[bytes] | io.BytesIO | Any, what: str, hint: str) -> Any:
    """``torch.load(source, map_location="cpu", weights_only=True)``; an unsafe payload raises
    `UnsafeStateError` (one line: `what` and `hint`, what to do) and is never unpickled further."""
    try:
        return torch.load(source, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        detail = str(exc).strip().splitlines()
        reason = next((line.strip() for line in detail if "GLOBAL" in line or "Unsupported" in line), "")
        reason = reason or (detail[0].strip() if detail else "unsupported content")
        raise UnsafeStateError(
            f"refusing {what}: it holds Python objects that only an unsafe load could restore "
            f"({reason[:160]}); {hint}"
        ) from None
