"""One rank's ZeRO-1/2 optimizer partition at a committed step, as one flat tensor plus a JSON header.

A ZeRO stage 1 or 2 optimizer splits each parameter group's flat fp32 master copy, and the base
optimizer's per-element state (Adam's ``exp_avg``, ``exp_avg_sq``), into equal partitions, one per
data-parallel rank; padding only ever sits at the end of the flat group. So the partitions of every
rank, cut to their unpadded lengths and concatenated in rank order, are the whole flat group, and a
new layout's partition is a slice of that. A `Piece` is what one rank holds of it; `repartition` cuts
the slice for a new world. Nothing here imports DeepSpeed: the layout facts come from the optimizer
(`elastrain.deepspeed.zero`).

Pieces travel between ranks as a JSON header (sizes, names, scalars; never pickled) and one tensor.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import torch

from elastrain.errors import ConfigError

MASTER = "fp32"  # the name of a group's master-weight partition among its tensors


@dataclass
class Piece:
    """Rank `rank`'s partition (of a `world`-rank layout) of every parameter group, at step `step`.

    ``names[g]``/``sizes[g]``: group g's tensors in `flat`, in order (`MASTER` first, then the base
    optimizer's state by name); ``totals[g]``: group g's unpadded flat length; ``extra``: JSON values
    that are the same on every rank (the engine's counters, the LR scheduler's state).
    """

    rank: int
    world: int
    step: int
    generation: int
    names: list[list[str]]
    sizes: list[list[int]]
    totals: list[int]
    flat: torch.Tensor
    extra: dict[str, Any] = field(default_factory=dict)

    def header(self) -> dict[str, Any]:
        """Everything but the tensor, as JSON values."""
        return {
            "rank": self.rank,
            "world": self.world,
            "step": self.step,
            "generation": self.generation,
            "names": self.names,
            "sizes": self.sizes,
            "totals": self.totals,
            "dtype": str(self.flat.dtype).removeprefix("torch."),
            "extra": self.extra,
        }

    def header_bytes(self) -> bytes:
        """The header as UTF-8 JSON."""
        return json.dumps(self.header()).encode()

    def tensors(self, group: int) -> dict[str, torch.Tensor]:
        """Group `group`'s tensors by name (views into `flat`)."""
        offset = sum(sum(sizes) for sizes in self.sizes[:group])
        out = {}
        for name, size in zip(self.names[group], self.sizes[group]):
            out[name] = self.flat[offset : offset + size]
            offset += size
        return out

    def unpadded(self, group: int) -> int:
        """How many leading elements of this rank's partition of `group` are real (not padding)."""
        part = self.sizes[group][0]
        return max(0, min(part, self.totals[group] - self.rank * part))


def piece_from_header(data: bytes, flat: torch.Tensor) -> Piece:
    """The `Piece` a peer sent: its JSON header and its tensor; a malformed one raises `ConfigError`."""
    try:
        h = json.loads(data.decode())
        piece = Piece(
            int(h["rank"]),
            int(h["world"]),
            int(h["step"]),
            int(h["generation"]),
            [[str(n) for n in names] for names in h["names"]],
            [[int(s) for s in sizes] for sizes in h["sizes"]],
            [int(t) for t in h["totals"]],
            flat,
            dict(h["extra"]),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(f"a peer sent a ZeRO partition header that cannot be read ({exc})") from None
    if sum(sum(s) for s in piece.sizes) != flat.numel():
        raise ConfigError("a peer sent a ZeRO partition whose size does not match its header")
    return piece


def flat_dtype(header: bytes) -> torch.dtype:
    """The dtype a piece's tensor is sent in, from its header (a floating dtype only)."""
    try:
        dtype = getattr(torch, str(json.loads(header.decode())["dtype"]))
    except (ValueError, KeyError, AttributeError) as exc:
        raise ConfigError(f"a peer sent a ZeRO partition header that cannot be read ({exc})") from None
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ConfigError(f"a peer sent a ZeRO partition of dtype {dtype!r}; only floating dtypes travel")
    return dtype


def merged(pieces: list[Piece], group: int, name: str) -> torch.Tensor:
    """Tensor `name` of `group` over the whole flat group (the unpadded parts, in rank order); a
    per-group scalar (the step count) is the first piece's."""
    first = pieces[0].tensors(group)[name]
    if first.numel() != pieces[0].sizes[group][0]:  # not partitioned: the same value on every rank
        return first.clone()
    return torch.cat([p.tensors(group)[name][: p.unpadded(group)] for p in pieces])


def repartition(whole: torch.Tensor, rank: int, world: int, part: int) -> torch.Tensor:
    """Rank `rank`'s `part`-element partition (of `world`) of the flat group `whole`, zero-padded."""
    out = torch.zeros(part, dtype=whole.dtype)
    start = rank * part
    chunk = whole[start : start + part]
    out[: chunk.numel()] = chunk
    if world * part < whole.numel():
        raise ConfigError(f"{world} partitions of {part} cannot hold a flat group of {whole.numel()}")
    return out


__all__ = ["MASTER", "Piece", "flat_dtype", "merged", "piece_from_header", "repartition"]
