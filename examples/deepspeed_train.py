"""DeepSpeed ZeRO-1/2 training of a small MLP on CPU (gloo), elastic under elastrain, in place or by restart.

Fixed size, with DeepSpeed's own launcher (it passes ``--local_rank``)::

    deepspeed --hostfile HOSTFILE examples/deepspeed_train.py --deepspeed_config examples/ds_zero2.json

Elastic in place (the default of ``elastrain run``: the hostfile may grow 2 -> 4 and shrink back, and a
worker may die; the surviving processes keep running and move the ZeRO partitions between their
memories, `native_main` and `elastrain.deepspeed.ElasticZero`)::

    elastrain run --hostfile HOSTFILE --min-np 2 --max-np 4 \
        python examples/deepspeed_train.py --deepspeed_config examples/ds_zero2.json

Elastic by restart (every change restarts the script, which resumes from its checkpoint at the new
data-parallel size)::

    elastrain run --mode restart --hostfile HOSTFILE --min-np 2 --max-np 4 \\
        python examples/deepspeed_train.py --deepspeed_config examples/ds_zero2.json --checkpoint-dir CKPT

The data is a synthetic, seeded 8-class problem (4096 samples by default). ``train_batch_size`` in
the config is the *global* batch, kept at any world size (each rank takes a near-equal share; the
loss is scaled so the gradient is the mean over the global batch), so the loss curve does not
depend on how many ranks ran it. Each epoch is a seeded permutation walked by a cursor that is saved
in the checkpoint: after a restart the rest of the epoch is split over the new ranks, so every
sample is used exactly once per epoch. SIGTERM (a resize) stops all ranks after the same step; they
checkpoint and exit.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

# the stop flag first: a resize may send SIGTERM while torch and deepspeed are still importing
from elastrain.frameworks.deepspeed_elastic import (
    STOP_EXIT_CODE,
    ElasticCheckpointer,
    GracefulStop,
    reduce_step,
)

# `elastrain run` without `--mode restart` sets the coordinator: elastrain resizes the job in place
# (deepspeed_inplace.py) and owns SIGTERM (a graceful leave); restart mode and DeepSpeed's launcher don't
NATIVE = bool(os.environ.get("ELASTRAIN_COORDINATOR"))
STOP = GracefulStop(() if NATIVE else (signal.SIGTERM, signal.SIGINT))
T_START = time.time()  # process start, for the resize-pause breakdown


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    import deepspeed

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--local_rank", "--local-rank", type=int, default=-1, help="set by the deepspeed launcher")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--samples", type=int, default=4096, help="size of the synthetic training set")
    p.add_argument("--seed", type=int, default=0, help="shuffle seed (the data itself is fixed)")
    p.add_argument("--checkpoint-dir", type=Path, help="shared directory; enables resume and resizing")
    p.add_argument("--checkpoint-every", type=int, default=0, help="also checkpoint every N steps")
    p.add_argument("--sample-log", type=Path, help="directory for per-rank JSON lines of sample ids")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds to sleep per step (demos)")
    p.add_argument("--max-steps", type=int, default=0, help="stop after N steps in this run (tests)")
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32", help="in place only")
    p.add_argument("--params-out", type=Path, help="in place only: rank 0 saves the final weights here")
    p.add_argument(
        "--hold-file",
        type=Path,
        help="after each step, wait while this file exists (a stop signal ends the wait): a test holds "
        "the job between its resizes, so the job cannot end before a resize however slow the machine",
    )
    p = deepspeed.add_config_arguments(p)
    args = p.parse_args(argv)
    if not args.deepspeed_config:
        p.error("give --deepspeed_config CONFIG.json (e.g. examples/ds_zero2.json)")
    return args


def load_config(path: str) -> dict[str, Any]:
    """The DeepSpeed JSON config; a bad file ends the script with one line that says why."""
    try:
        config: dict[str, Any] = json.loads(Path(path).read_text())
    except OSError as exc:
        sys.exit(f"deepspeed_train: cannot read --deepspeed_config {path}: {exc.strerror}")
    except json.JSONDecodeError as exc:
        sys.exit(f"deepspeed_train: --deepspeed_config {path} is not valid JSON ({exc}); fix the file")
    if not isinstance(config, dict) or not isinstance(config.get("train_batch_size"), int):
        sys.exit(f"deepspeed_train: {path} needs an integer train_batch_size (the global batch)")
    return config


def make_dataset(n: int, dim: int = 32, classes: int = 8) -> tuple[Any, Any]:
    """A deterministic classification set: inputs through a fixed random teacher, plus noise."""
    import torch

    g = torch.Generator().manual_seed(1234)
    x = torch.randn(n, dim, generator=g)
    teacher = torch.randn(dim, classes, generator=g)
    logits = 3 * torch.tanh(x @ teacher) + 0.5 * torch.randn(n, classes, generator=g)
    return x, logits.argmax(dim=1)


def make_model(dim: int = 32, classes: int = 8) -> Any:
    import torch

    torch.manual_seed(0)  # identical initial weights on every rank and every run
    return torch.nn.Sequential(
        torch.nn.Linear(dim, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128), torch.nn.ReLU(),
        torch.nn.Linear(128, classes),
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = load_config(args.deepspeed_config)
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)  # a small MLP per rank: more threads only fight over the cores
    import deepspeed

    from elastrain.frameworks import ElasticSampler

    imported_s = time.time() - T_START
    deepspeed.init_distributed(dist_backend="gloo")
    joined_s = time.time() - T_START  # every rank has imported and joined the process group
    rank, world = dist.get_rank(), dist.get_world_size()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    global_batch = int(config.pop("train_batch_size"))
    config["train_micro_batch_size_per_gpu"] = math.ceil(global_batch / world)  # bookkeeping only
    config.setdefault("gradient_accumulation_steps", 1)

    ckpt = ElasticCheckpointer(args.checkpoint_dir) if args.checkpoint_dir else None
    plan = ckpt.plan(world) if ckpt else None
    model = make_model()
    engine, *_ = deepspeed.initialize(
        model=model,
        model_parameters=model.parameters(),
        config=ElasticCheckpointer.config_for(config, plan),
    )
    sampler = ElasticSampler(args.samples, global_batch, seed=args.seed)
    sampler.bind(lambda: (rank, world))
    state: dict[str, Any] = {"step": 0, "loss_sum": 0.0, "seen": 0, "epoch_losses": [], "runs": []}
    if ckpt and plan:
        t0 = time.monotonic()
        state = ckpt.load(engine, plan)
        sampler.load_state_dict(state["sampler"])
        if rank == 0:
            print(
                f"resumed step={state['step']} epoch={sampler.epoch} cursor={sampler.cursor} "
                f"from dp={plan.saved_world} to dp={world} universal={plan.universal} "
                f"convert_s={plan.convert_s:.2f} load_s={time.monotonic() - t0:.2f} "
                f"import_s={imported_s:.2f} joined_s={joined_s:.2f} startup_s={time.time() - T_START:.2f} "
                f"process_start_t={T_START:.3f}",
                flush=True,
            )
    x_all, y_all = make_dataset(args.samples)
    log = None
    if args.sample_log:
        args.sample_log.mkdir(parents=True, exist_ok=True)
        log = open(args.sample_log / f"samples-g{restart}-r{rank}-p{os.getpid()}.jsonl", "a")  # noqa: SIM115

    mine = 0  # samples this process trained on
    steps_here = 0
    step_times: list[float] = []
    dirty = False  # steps since the last save or load

    def snapshot() -> dict[str, Any]:
        position = {"epoch": sampler.epoch, "cursor": sampler.cursor}
        return {**state, "sampler": {**sampler.state_dict(), **position}}

    def save() -> None:
        nonlocal dirty
        if ckpt and dirty:
            ckpt.save(engine, state["step"], snapshot())
        dirty = False

    def record_run() -> None:
        counts: list[Any] = [None] * world
        dist.all_gather_object(counts, mine)
        state["runs"].append({"restart": restart, "world": world, "samples_per_rank": counts})

    stopped = False
    while sampler.epoch < args.epochs and not stopped:
        for indices in sampler:
            t0 = time.perf_counter()
            step = sampler.current()
            assert step is not None
            out = engine(x_all[indices])
            loss_sum = F.cross_entropy(out, y_all[indices], reduction="sum")
            engine.backward(loss_sum * world / step.size)  # DeepSpeed averages over ranks: a global mean
            engine.step()
            sampler.commit_step()
            totals = reduce_step(float(loss_sum.item()), len(indices), STOP)
            state["step"] += 1
            state["loss_sum"] += totals.loss_sum
            state["seen"] += totals.samples
            mine += len(indices)
            steps_here += 1
            dirty = True
            step_times.append(time.perf_counter() - t0)
            if log is not None:
                line = {"epoch": step.epoch, "start": step.start, "world": world, "rank": rank}
                log.write(json.dumps({**line, "t": time.time(), "ids": indices}) + "\n")
                log.flush()
            if steps_here == 1 and rank == 0:
                print(f"first step world={world} restart={restart} t={time.time():.3f}", flush=True)
            if args.step_sleep:
                time.sleep(args.step_sleep)
            while args.hold_file is not None and args.hold_file.exists() and not STOP.requested:
                time.sleep(0.05)  # every rank reads the same shared file; the others wait in the all-reduce
            if totals.stop or (args.max_steps and steps_here >= args.max_steps):
                stopped = True
                break
            if ckpt and args.checkpoint_every and state["step"] % args.checkpoint_every == 0:
                save()
        else:  # the epoch is complete
            mean = state["loss_sum"] / max(1, state["seen"])
            state["epoch_losses"].append(mean)
            if rank == 0:
                seen = state["seen"]
                print(f"epoch {sampler.epoch} loss {mean:.6f} samples {seen} world {world}", flush=True)
            state["loss_sum"], state["seen"] = 0.0, 0
            sampler.set_epoch(sampler.epoch + 1)
            if sampler.epoch < args.epochs:
                save()

    record_run()
    mean_ms = 1000 * sum(step_times) / max(1, len(step_times))
    t_save = time.monotonic()
    save()
    if rank == 0:
        why = "stopped (signal)" if STOP.requested else ("stopped (--max-steps)" if stopped else "done")
        print(
            f"{why}: world={world} restart={restart} steps={steps_here} step_ms={mean_ms:.1f} "
            f"save_s={time.monotonic() - t_save:.2f} "
            f"samples_per_rank={state['runs'][-1]['samples_per_rank']} "
            f"signal_t={STOP.received_at or 0:.3f} exit_t={time.time():.3f}",
            flush=True,
        )
        if not stopped:
            per_start = " ".join(f"w{r['world']}:{r['samples_per_rank']}" for r in state["runs"])
            total = sum(sum(r["samples_per_rank"]) for r in state["runs"])
            losses = " ".join(f"{v:.6f}" for v in state["epoch_losses"])
            print(f"summary: samples per rank per start {per_start}; total {total}; epoch losses {losses}")
    if log is not None:
        log.close()
    if STOP.requested:
        # the peers agreed to stop because one of us was signalled: wait for our own signal, so that
        # restart mode sees a stopped script, not one that finished (exit 0 would end this slot)
        STOP.wait_for_signal(60.0)
        return STOP_EXIT_CODE
    dist.barrier()
    dist.destroy_process_group()
    return 0


def native_main(argv: list[str] | None = None) -> int:
    """Under `elastrain run` (native mode): resized in place (`elastrain.deepspeed.ElasticZero`): on a
    resize or a killed worker the survivors keep running, build the new group and a new engine, and
    receive the ZeRO partitions of the new layout from their peers' memory; a new worker receives all
    it needs the same way. Every sample once per epoch (elastrain's sampler and ledger)."""
    import elastrain
    from elastrain.deepspeed import ElasticZero

    args = parse_args(argv)
    config = load_config(args.deepspeed_config)
    import torch
    import torch.nn.functional as F

    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)  # a small MLP per rank: more threads only fight over the cores
    global_batch = int(config.pop("train_batch_size"))
    config.setdefault("gradient_accumulation_steps", 1)

    def config_for(world: int) -> dict[str, Any]:
        return {**config, "train_micro_batch_size_per_gpu": math.ceil(global_batch / world)}

    dtype = getattr(torch, args.dtype)
    x_all, y_all = make_dataset(args.samples)
    x_all = x_all.to(dtype)
    model = make_model().to(dtype)
    sampler = elastrain.ElasticSampler(args.samples, global_batch, seed=args.seed)
    zero = ElasticZero(model, config_for)  # before joining: DeepSpeed's first engine takes seconds
    elastrain.init()
    state = elastrain.State(model=model, sampler=sampler, epoch=0)
    state.keep(zero)

    @elastrain.run
    def train(state: elastrain.State) -> None:
        # re-entered after every resize, with a new engine: it resumes from the committed position
        reported = state.world_size
        if zero.last_resize is not None and state.rank == 0 and zero.last_resize.from_world:
            r = zero.last_resize
            print(
                f"resized in place at step {state.step}: dp {r.from_world} -> {r.to_world}, rebuild "
                f"{r.seconds:.3f}s, {r.received_bytes} bytes from peers",
                flush=True,
            )
        while state.epoch < args.epochs:
            sampler.set_epoch(state.epoch)
            for indices in sampler:
                step = sampler.current()
                assert step is not None
                engine = zero.engine
                loss_sum = F.cross_entropy(engine(x_all[indices]), y_all[indices], reduction="sum")
                zero.backward(loss_sum * state.world_size / step.size)  # ZeRO averages over ranks
                zero.step()
                state.commit(loss_sum / max(1, len(indices)))
                if args.step_sleep:
                    time.sleep(args.step_sleep)
                if args.hold_file is not None and args.hold_file.exists():
                    time.sleep(0.25)  # a test slows the job between its resizes (each commit sees them)
            if state.rank == 0:
                print(f"epoch {state.epoch} done: world {reported}, step {state.step}", flush=True)
            state.epoch += 1

    train(state)
    if args.params_out is not None and elastrain.rank() == 0:
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, args.params_out)
    return 0


if __name__ == "__main__":
    sys.exit(native_main() if NATIVE else main())
