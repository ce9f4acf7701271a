"""GradientSync on a real 2-process gloo group: overlapped buckets give the full-batch gradient.

Each scenario runs a few steps in two processes and compares every rank's reduced gradients with
the gradient of the mean loss over the whole global batch, computed in one process (float64).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from elastrain.runtime.data import split_evenly
from elastrain.runtime.gradsync import GradientSync, StepShape

WORLD = 2
STEPS = 5
SCENARIOS = ("plain", "sum", "accumulate", "switch", "unequal")


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    # ~90k float64 parameters: several buckets at a 64 KiB bucket size
    layers = [torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(256, 10)).double()


def _batch(step: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + step)
    x = torch.randn(size, 64, generator=gen, dtype=torch.float64)
    return x, torch.randint(0, 10, (size,), generator=gen)


def _reference(step: int, size: int) -> list[torch.Tensor]:
    model = _model()
    x, y = _batch(step, size)
    F.cross_entropy(model(x), y).backward()
    return [p.grad.clone() for p in model.parameters()]


def _worker(rank: int, init_file: str, out: str) -> None:
    torch.set_num_threads(1)  # two processes on two cores: spinning intra-op threads would starve gloo
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    torch.save({s: _scenario(rank, s) for s in SCENARIOS}, f"{out}.{rank}")
    dist.destroy_process_group()


def _scenario(rank: int, scenario: str) -> dict[str, list]:
    model = _model()
    params = list(model.parameters())
    size = 63 if scenario == "unequal" else 64
    lo, hi = split_evenly(size, WORLD, rank)
    shape = StepShape(hi - lo, size, size % WORLD == 0)
    sync = GradientSync(lambda: shape)
    errors, armed = [], []
    for step in range(STEPS):
        x, y = _batch(step, size)
        x, y = x[lo:hi], y[lo:hi]
        for p in params:
            p.grad = None
        chunks = 2 if scenario == "accumulate" or (scenario == "switch" and step >= 3) else 1
        reduction = "sum" if scenario == "sum" and step >= 2 else "mean"  # step 2 guesses wrong
        for part in torch.tensor_split(torch.arange(hi - lo), chunks):
            loss = F.cross_entropy(model(x[part]), y[part], reduction="sum")
            (loss if reduction == "sum" else loss / (hi - lo)).backward()
        armed.append(bool(sync._step is not None and sync._step.armed))
        total, pending = sync.allreduce(params, shape, reduction, rank == 1 and step == 1, True, 64 * 1024)
        assert total == size and pending == (step == 1)
        expected = _reference(step, size)
        errors.append(max(float((p.grad - e).abs().max()) for p, e in zip(params, expected)))
    return {"errors": errors, "armed": armed}


@pytest.fixture(scope="module")
def results() -> list[dict[str, dict[str, list]]]:
    """Every scenario in one pair of processes (spawning costs seconds)."""
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "result")
        init = str(Path(tmp) / "init")
        procs = [ctx.Process(target=_worker, args=(r, init, out)) for r in range(WORLD)]
        for p in procs:
            p.start()
        try:
            for p in procs:
                p.join(timeout=90)
        finally:
            for p in procs:
                if p.is_alive() and p.pid is not None:
                    os.kill(p.pid, signal.SIGKILL)
                    p.join()
        assert [p.exitcode for p in procs] == [0, 0]
        return [torch.load(f"{out}.{r}") for r in range(WORLD)]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_reduced_gradients_equal_the_full_batch_gradient(results: list, scenario: str) -> None:
    for rank in results:
        assert max(rank[scenario]["errors"]) < 1e-12, rank[scenario]
    armed = results[0][scenario]["armed"]
    if scenario in ("plain", "sum"):
        assert armed == [False, False, True, True, True]  # the second step learns that nobody accumulates
    if scenario == "switch":
        assert armed == [False, False, True, True, False]  # step 3 accumulates while armed: a delta round
    if scenario in ("accumulate", "unequal"):
        assert not any(armed)
