"""Checkpoint stall: how long the training loop is blocked per save, async (snapshot) vs torch.save.

    python bench/checkpoint_stall.py [--params 2000000] [--repeats 5] [--json PATH]

The same State (an MLP with Adam state) is saved both ways into a temp dir; printed are the medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from elastrain.runtime.checkpoint import Checkpointer, CheckpointPolicy


def make_state(params: int) -> dict:
    width = max(16, int((params / 2) ** 0.5))
    model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width))
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(4, width)).sum().backward()
    opt.step()
    return {
        "step": 1,
        "counters": {},
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "sampler": {"epoch": 0, "cursor": 0},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--params", type=int, default=2_000_000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    state = make_state(args.params)
    n = sum(t.numel() for t in state["model"].values())
    sync, stall, write = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            started = time.perf_counter()
            torch.save(state, Path(tmp) / f"sync-{i}.pt")
            sync.append(time.perf_counter() - started)
        ckpt = Checkpointer(CheckpointPolicy(Path(tmp) / "async", every_steps=1, keep=2))
        for i in range(args.repeats):
            state["step"] = i + 1
            ckpt.save(state, world_size=1)
            ckpt.wait()
        stall, write = ckpt.stats.stalls_s, ckpt.stats.writes_s
    result = {
        "model_params": n,
        "sync_torch_save_s": statistics.median(sync),
        "async_stall_s": statistics.median(stall),
        "async_background_write_s": statistics.median(write),
        "stall_ratio": statistics.median(stall) / statistics.median(sync),
    }
    print(
        f"state of {n:,} parameters + Adam: torch.save blocks {result['sync_torch_save_s'] * 1e3:.1f} ms; "
        f"elastrain blocks {result['async_stall_s'] * 1e3:.1f} ms (snapshot) and writes in the background "
        f"in {result['async_background_write_s'] * 1e3:.1f} ms (with checksum, fsync, rename)"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
