"""Where a steady-state step goes: elastrain's step phases next to DDP's, on the benchmark's MLP.

    .venv/bin/python bench/step_profile.py [--steps 150] [--warmup 20] [--repeats 2] [--json FILE]

Runs the workload of vs_torchrun.py at world 2 twice per repeat, under the real launchers
(``elastrain run -np 2`` and ``torchrun --standalone --nproc-per-node 2``), with every phase of
the step timed by ``time.perf_counter`` on rank 0 (median over the steps after the warm-up):
zero_grad, forward, backward, gradient sync (elastrain's ``allreduce_gradients``; inside DDP's
backward for torchrun), optimizer, commit, and the whole step. After the timed steps each elastrain
worker also times the pieces a flat-buffer sync is made of, on the same group: copying the grads
in and out of one buffer, scaling, one blocking all_reduce of the buffer, a one-slot all_reduce
and ``.item()``. Prints the table; nothing is asserted.

    .venv/bin/python bench/step_profile.py --interleaved [--blocks 300] [--block-steps 1]

A/B on a loaded machine: one torchrun job of two processes alternates blocks of steps of DDP and of
elastrain's gradient sync (`GradientSync`, the core of ``allreduce_gradients``) on two identical
models, so both see the same load; prints the median over blocks of the per-block ratio of median
step times. The launcher, ``commit`` and the sampler are not part of this one (see the table above).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

PHASES = ("zero_grad", "forward", "backward", "sync", "optimizer", "commit", "step")


class PhaseTimer:
    """Per-phase wall times of each step; `step` is the interval between two `step_end` calls."""

    def __init__(self) -> None:
        self.samples: dict[str, list[float]] = defaultdict(list)
        self._last: float | None = None

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the body as phase `name`."""
        t = time.perf_counter()
        yield
        self.samples[name].append(time.perf_counter() - t)

    def step_end(self) -> None:
        """One step done."""
        now = time.perf_counter()
        if self._last is not None:
            self.samples["step"].append(now - self._last)
        self._last = now

    def medians(self, skip: int) -> dict[str, float]:
        """Median seconds per phase, the first `skip` steps left out."""
        return {k: statistics.median(v[skip:]) for k, v in self.samples.items() if len(v) > skip}


def _median_time(fn: Callable[[], object], runs: int = 30) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def sync_pieces(params: list[Any]) -> dict[str, float]:
    """Median seconds of each piece of a flat-buffer gradient sync (collective: every rank calls it)."""
    import torch
    import torch.distributed as dist

    numel = sum(p.numel() for p in params)
    flat = torch.zeros(numel + 2)
    views, offset = [], 0
    for p in params:
        views.append(flat[offset : offset + p.numel()])
        offset += p.numel()
    one = torch.zeros(1)

    def copy_in() -> None:
        for p, v in zip(params, views):
            v.copy_(p.grad.reshape(-1))

    def copy_out() -> None:
        for p, v in zip(params, views):
            p.grad.copy_(v.view_as(p))

    dist.barrier()
    return {
        "copy_in": _median_time(copy_in),
        "copy_out": _median_time(copy_out),
        "scale (mul_ or div_)": _median_time(lambda: flat.mul_(1.0)),
        "all_reduce flat buffer": _median_time(lambda: dist.all_reduce(flat)),
        "all_reduce 1 slot": _median_time(lambda: dist.all_reduce(one)),
        ".item()": _median_time(lambda: flat[-2].item()),
    }


def _write(out: Path, record: dict[str, Any]) -> None:
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    tmp.replace(out)


def worker_elastrain(args: argparse.Namespace) -> None:
    """The benchmark's elastrain loop with every phase timed."""
    import torch
    import torch.nn.functional as F
    import workload

    import elastrain

    torch.set_num_threads(1)
    x, y = workload.make_data()
    torch.manual_seed(workload.SEED)
    model = workload.build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    sampler = elastrain.ElasticSampler(len(y), workload.GLOBAL_BATCH, seed=workload.SEED)
    elastrain.init()
    state = elastrain.State(model=model, optimizer=optimizer, sampler=sampler, epoch=0)
    timer = PhaseTimer()
    pieces: dict[str, float] = {}

    @elastrain.run
    def train(state: elastrain.State) -> None:
        for state.epoch in range(state.epoch, 1000):  # noqa: B020 (elastrain's pattern)
            sampler.set_epoch(state.epoch)
            for indices in sampler:
                if state.step >= args.warmup + args.steps:
                    pieces.update(sync_pieces([p for p in model.parameters() if p.grad is not None]))
                    return
                with timer.phase("zero_grad"):
                    optimizer.zero_grad()
                with timer.phase("forward"):
                    loss = F.cross_entropy(model(x[indices]), y[indices])
                with timer.phase("backward"):
                    loss.backward()
                with timer.phase("sync"):
                    state.allreduce_gradients()
                with timer.phase("optimizer"):
                    optimizer.step()
                with timer.phase("commit"):
                    state.commit()
                timer.step_end()

    train(state)
    if state.rank == 0:
        _write(args.out, {"phases": timer.medians(args.warmup), "pieces": pieces})


def worker_ddp(args: argparse.Namespace) -> None:
    """The benchmark's torchrun + DDP loop with every phase timed (the sync is inside backward)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    import workload
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    x, y = workload.make_data()
    torch.manual_seed(workload.SEED)
    model = workload.build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ddp = DistributedDataParallel(model)
    lo, hi = workload.split_evenly(workload.GLOBAL_BATCH, world, rank)
    perm = workload.epoch_permutation(0)
    timer = PhaseTimer()
    for step in range(args.warmup + args.steps):
        start = (step % (workload.SAMPLES // workload.GLOBAL_BATCH)) * workload.GLOBAL_BATCH
        indices = perm[start + lo : start + hi]
        with timer.phase("zero_grad"):
            optimizer.zero_grad()
        with timer.phase("forward"):
            loss = F.cross_entropy(ddp(x[indices]), y[indices])
        with timer.phase("backward"):
            loss.backward()
        with timer.phase("optimizer"):
            optimizer.step()
        timer.step_end()
    dist.barrier()
    if rank == 0:
        _write(args.out, {"phases": timer.medians(args.warmup), "pieces": {}})
    dist.destroy_process_group()


def worker_interleaved(args: argparse.Namespace) -> None:
    """Alternate blocks of DDP steps and GradientSync steps in the same two processes."""
    import copy

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    import workload
    from torch.nn.parallel import DistributedDataParallel

    from elastrain.runtime.gradsync import GradientSync, StepShape

    torch.set_num_threads(1)
    x, y = workload.make_data()
    torch.manual_seed(workload.SEED)
    plain = workload.build_model()
    twin = copy.deepcopy(plain)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ddp = DistributedDataParallel(twin)
    lo, hi = workload.split_evenly(workload.GLOBAL_BATCH, world, rank)
    shape = StepShape(hi - lo, workload.GLOBAL_BATCH, workload.GLOBAL_BATCH % world == 0)
    sync = GradientSync(lambda: shape)
    params = list(plain.parameters())
    optimizers = {
        "elastrain": torch.optim.SGD(plain.parameters(), lr=0.02, momentum=0.9),
        "ddp": torch.optim.SGD(twin.parameters(), lr=0.02, momentum=0.9),
    }
    perm = workload.epoch_permutation(0)
    per_epoch = workload.SAMPLES // workload.GLOBAL_BATCH
    blocks: list[dict[str, float]] = []
    step = 0
    warmup = 10
    for block in range(args.blocks + warmup):
        medians: dict[str, float] = {}
        for variant in ("elastrain", "ddp") if block % 2 == 0 else ("ddp", "elastrain"):
            times = []
            for _ in range(args.block_steps):
                start = (step % per_epoch) * workload.GLOBAL_BATCH
                indices = perm[start + lo : start + hi]
                step += 1
                t = time.perf_counter()
                optimizers[variant].zero_grad()
                if variant == "ddp":
                    F.cross_entropy(ddp(x[indices]), y[indices]).backward()
                else:
                    F.cross_entropy(plain(x[indices]), y[indices]).backward()
                    sync.allreduce(params, shape, "mean", False, True)
                optimizers[variant].step()
                times.append(time.perf_counter() - t)
            medians[variant] = statistics.median(times)
        if block >= warmup:
            blocks.append(medians)
    dist.barrier()
    if rank == 0:
        _write(args.out, {"blocks": blocks})
    dist.destroy_process_group()


def report_interleaved(blocks: list[dict[str, float]]) -> str:
    """Per-block medians and the median of the per-block ratios."""
    ratios = [b["elastrain"] / b["ddp"] for b in blocks]
    lines = [f"{'blocks':>9} {'elastrain ms':>13} {'ddp ms':>8} {'ratio':>6}"]
    tenth = max(1, len(blocks) // 10)
    for i in range(0, len(blocks), tenth):  # how the load drifted: medians of each tenth of the run
        part = blocks[i : i + tenth]
        e_part = statistics.median(b["elastrain"] for b in part) * 1e3
        d_part = statistics.median(b["ddp"] for b in part) * 1e3
        r_part = statistics.median(ratios[i : i + tenth])
        lines.append(f"{i:4d}-{i + len(part) - 1:<4d} {e_part:13.2f} {d_part:8.2f} {r_part:6.3f}")
    e = statistics.median(b["elastrain"] for b in blocks)
    d = statistics.median(b["ddp"] for b in blocks)
    lines.append(f"median step: elastrain sync {e * 1e3:.2f} ms, DDP {d * 1e3:.2f} ms, ratio {e / d:.3f}")
    lines.append(
        f"median of per-block ratios: {statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}]"
    )
    return "\n".join(lines)


def run_variant(variant: str, args: argparse.Namespace, work: Path, tag: str) -> dict[str, Any]:
    """Launch one variant at world 2 under its real launcher; rank 0's medians."""
    from proclib import Job

    from elastrain.testing.waits import poll

    out = work / f"{tag}.json"
    job = Job(f"sp{int(time.time())}", tag, work / tag)
    me = [str(Path(__file__).resolve()), "--worker", variant, "--out", str(out)]
    me += ["--steps", str(args.steps), "--warmup", str(args.warmup)]
    me += ["--blocks", str(args.blocks), "--block-steps", str(args.block_steps)]
    if variant == "elastrain":
        argv = [
            sys.executable,
            "-m",
            "elastrain",
            "run",
            "-np",
            "2",
            "-H",
            "127.0.0.1:2",
            sys.executable,
            *me,
        ]
    else:
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *me]
    try:
        job.start("launcher", argv, cwd=Path(__file__).resolve().parent)
        if not poll(out.exists, args.timeout, 0.2, abort=lambda: not job.alive()) or not out.exists():
            raise SystemExit(f"{variant} produced no result; see {work / tag / 'launcher.out'}")
        job.wait_exit(30)
    finally:
        job.kill()
    return dict(json.loads(out.read_text()))


def format_report(results: dict[str, list[dict[str, Any]]]) -> str:
    """Median over repeats of each phase, both systems, in ms."""

    def med(system: str, section: str, key: str) -> float | None:
        values = [r[section][key] for r in results[system] if key in r[section]]
        return statistics.median(values) * 1e3 if values else None

    def cell(value: float | None) -> str:
        return f"{value:8.2f}" if value is not None else "       -"

    lines = [f"{'phase (ms, median)':26} {'elastrain':>9} {'torchrun':>9}"]
    for key in PHASES:
        lines.append(
            f"{key:26} {cell(med('elastrain', 'phases', key))} {cell(med('torchrun', 'phases', key))}"
        )
    e, t = med("elastrain", "phases", "step"), med("torchrun", "phases", "step")
    if e and t:
        lines.append(f"{'step ratio':26} {e / t:9.3f}")
    pieces = sorted({k for r in results["elastrain"] for k in r["pieces"]})
    if pieces:
        lines.append("\npieces of a flat-buffer sync, measured alone (ms, median):")
        lines += [f"  {k:24} {cell(med('elastrain', 'pieces', k))}" for k in pieces]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Driver (default) or one worker (--worker)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=150, help="timed steps per run (default 150)")
    p.add_argument("--warmup", type=int, default=20, help="steps left out of the medians (default 20)")
    p.add_argument("--repeats", type=int, default=2, help="runs of each system, alternating (default 2)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per run (default 300)")
    p.add_argument("--json", type=Path, help="also write every run here")
    p.add_argument("--interleaved", action="store_true", help="A/B blocks of DDP and elastrain in one job")
    p.add_argument("--blocks", type=int, default=300, help="--interleaved: blocks per variant (default 300)")
    p.add_argument("--block-steps", type=int, default=1, help="--interleaved: steps per block (default 1)")
    p.add_argument("--worker", choices=["elastrain", "ddp", "interleaved"], help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker == "elastrain":
        worker_elastrain(args)
        return 0
    if args.worker == "ddp":
        worker_ddp(args)
        return 0
    if args.worker == "interleaved":
        worker_interleaved(args)
        return 0
    work = Path(tempfile.mkdtemp(prefix="elastrain-step-profile-"))
    if args.interleaved:
        result = run_variant("interleaved", args, work, "interleaved")
        print(report_interleaved(result["blocks"]))
        if args.json is not None:
            args.json.write_text(json.dumps(result, indent=2))
        return 0
    results: dict[str, list[dict[str, Any]]] = {"elastrain": [], "torchrun": []}
    for r in range(args.repeats):
        order = [("elastrain", "elastrain"), ("torchrun", "ddp")]
        for system, variant in order if r % 2 == 0 else order[::-1]:
            results[system].append(run_variant(variant, args, work, f"{system}-r{r}"))
            print(f"[step_profile] {system} r{r}: step {results[system][-1]['phases']['step'] * 1e3:.2f} ms")
    print(format_report(results))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
