"""ZeRO partitions as pieces: the merge and re-cut that an in-place resize does, and who sends what."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from elastrain.deepspeed.durable import prune, read_pieces, write_piece
from elastrain.deepspeed.pieces import MASTER, Piece, flat_dtype, merged, piece_from_header, repartition
from elastrain.deepspeed.zero import Offer, choose_holders
from elastrain.errors import ConfigError


def cut(whole: torch.Tensor, state: torch.Tensor, world: int, step: int = 5) -> list[Piece]:
    """The pieces of a `world`-rank layout of one group (padding at the end, as ZeRO lays it out)."""
    part = -(-whole.numel() // world)
    pieces = []
    for rank in range(world):
        master = repartition(whole, rank, world, part)
        moment = repartition(state, rank, world, part)
        flat = torch.cat([master, moment, torch.tensor([float(step)])])
        names, sizes = [[MASTER, "exp_avg", "step"]], [[part, part, 1]]
        pieces.append(
            Piece(rank, world, step, 1, names, sizes, [whole.numel()], flat, {"global_steps": step})
        )
    return pieces


@pytest.mark.parametrize(("old", "new"), [(2, 4), (4, 3), (3, 2), (5, 1), (1, 3)])
def test_a_layout_merged_and_cut_again_is_the_same_group(old: int, new: int) -> None:
    whole, state = torch.arange(23, dtype=torch.float64), -torch.arange(23, dtype=torch.float64)
    pieces = cut(whole, state, old)
    assert torch.equal(merged(pieces, 0, MASTER), whole)
    assert torch.equal(merged(pieces, 0, "exp_avg"), state)
    assert merged(pieces, 0, "step").item() == 5  # a per-group scalar: the same on every rank
    again = cut(whole, state, new)
    part = -(-whole.numel() // new)
    for rank in range(new):
        assert torch.equal(
            repartition(merged(pieces, 0, MASTER), rank, new, part), again[rank].tensors(0)[MASTER]
        )


def test_a_piece_travels_as_json_and_one_tensor() -> None:
    piece = cut(torch.arange(10, dtype=torch.float32), torch.ones(10), 3)[2]
    data = piece.header_bytes()
    assert flat_dtype(data) == torch.float32
    back = piece_from_header(data, piece.flat.clone())
    assert back.header() == piece.header() and torch.equal(back.flat, piece.flat)
    assert back.unpadded(0) == 2  # 10 over 3 partitions of 4: the last holds 2 real values
    with pytest.raises(ConfigError, match="does not match its header"):
        piece_from_header(data, torch.zeros(3))
    with pytest.raises(ConfigError, match="cannot be read"):
        piece_from_header(b"{not json", piece.flat)
    with pytest.raises(ConfigError, match="only floating dtypes"):
        flat_dtype(data.replace(b'"float32"', b'"int64"'))


def test_the_holders_are_own_copies_first_and_the_newest_complete_layout() -> None:
    # 3 ranks; rank 1 died: its piece survives as rank 2's replica (the ring sends r to r+1)
    offers = [Offer(0, 0, 3, 9, 4), Offer(1, 2, 3, 9, 4), Offer(0, 2, 3, 9, 4), Offer(1, 1, 3, 9, 4)]
    assert choose_holders(offers, 9) == (3, [0, 1, 1])
    assert choose_holders(offers, 8) is None  # nothing of that step
    assert choose_holders(offers[:3], 9) is None  # both copies of rank 1's piece are gone
    # right after a rebuild: the new layout (generation 5) wins when complete, else the old one
    newer = [Offer(0, 0, 2, 9, 5), Offer(1, 1, 2, 9, 5)]
    assert choose_holders(newer + offers, 9) == (2, [0, 1])
    assert choose_holders(newer[:1] + offers, 9) == (3, [0, 1, 1])


def test_durable_pieces_are_read_only_as_a_complete_set_of_one_layout(tmp_path: Path) -> None:
    whole = torch.arange(23, dtype=torch.float64)
    three = cut(whole, -whole, 3, step=16)
    for piece in three[:2]:
        write_piece(tmp_path, piece)
    assert read_pieces(tmp_path, 16) is None  # rank 2's file is missing
    for piece in cut(whole, -whole, 2, step=16)[:1]:  # a resumed run at 2 rewrites the step, in part
        write_piece(tmp_path, piece)
    write_piece(tmp_path, three[2])
    back = read_pieces(tmp_path, 16)
    assert back is not None and [p.world for p in back] == [3, 3, 3]
    assert torch.equal(merged(back, 0, MASTER), whole)
    for step in (8, 24, 32):
        write_piece(tmp_path, cut(whole, whole, 1, step=step)[0])
    prune(tmp_path, keep=3)
    assert sorted(p.name for p in (tmp_path / "zero").iterdir()) == [
        "step-000000016",
        "step-000000024",
        "step-000000032",
    ]
