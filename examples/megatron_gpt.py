"""A tiny Megatron-LM GPT (megatron-core): tensor parallel 2 x data parallel N, elastic in N.

megatron-core's own ``GPTModel`` (local layer spec), ``DistributedDataParallel``, forward-backward
schedule and optimizer (Adam, gradient clipping); on a machine without CUDA it runs on the CPU with
gloo through `elastrain.frameworks.megatron_cpu` (what that patches, and what megatron cannot do on
the CPU, is in its docstring and the README). N = WORLD_SIZE / 2; an odd world size is refused::

    torchrun --nproc-per-node 2 examples/megatron_gpt.py                     # TP2 x DP1, one host
    torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        --rdzv-id mg examples/megatron_gpt.py                                # on each of 2 hosts
    elastrain run --mode restart --hostfile HOSTFILE --min-np 2 --max-np 4 \\
        python examples/megatron_gpt.py --checkpoint-dir CKPT                # DP follows the hostfile

The global batch is fixed (``--global-batch`` sequences a step, split over the N data-parallel
ranks) and step s trains on the sequences s*B .. s*B+B-1 of a deterministic synthetic corpus
(sequence i depends on i only), so the loss curve does not depend on N. A checkpoint holds one file
per tensor-parallel rank (written by data-parallel rank 0: the replicas are identical) and becomes
the resume point when ``latest`` is atomically replaced; it resumes at any N. SIGTERM (a resize in
restart mode) stops every rank after the same step (one small all-reduce a step carries the stop
flag); they checkpoint and exit 143, so no sequence is repeated or lost.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import sys
import time
import warnings
from pathlib import Path
from typing import Any

# the stop flag first: a resize may send SIGTERM while torch and megatron are still importing
from elastrain.frameworks.deepspeed_elastic import STOP_EXIT_CODE, GracefulStop

STOP = GracefulStop((signal.SIGTERM, signal.SIGINT))
T_START = time.time()
TP = 2


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=30, help="total training steps")
    p.add_argument("--global-batch", type=int, default=16, help="sequences a step, over all DP ranks")
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--vocab", type=int, default=128)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--checkpoint-dir", type=Path, help="shared directory: enables resume and resizing")
    p.add_argument("--save-every", type=int, default=10, help="also checkpoint every N steps (0: never)")
    p.add_argument("--sample-log", type=Path, help="directory for per-rank JSON lines of sequence ids")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds to sleep per step (demos)")
    p.add_argument(
        "--hold-file",
        type=Path,
        help="after each step, wait while this file exists (a stop signal ends the wait): a test holds "
        "the job between its resizes, so the job cannot end before a resize however slow the machine",
    )
    return p.parse_args(argv)


def sequence(i: int, length: int, vocab: int) -> Any:
    """Sequence `i` of the corpus (length+1 tokens): counting up mod `vocab` from a seeded start,
    with a seeded stride of 1 or 2, so the next token is learnable and the loss falls."""
    import torch

    g = torch.Generator().manual_seed(i)
    start, stride = torch.randint(0, vocab, (1,), generator=g), 1 + torch.randint(0, 2, (1,), generator=g)
    return (start + stride * torch.arange(length + 1)) % vocab


class Checkpoints:
    """``DIR/step{N:08d}/tp{R}.pt`` per tensor-parallel rank; ``DIR/latest`` names the committed one."""

    def __init__(self, directory: Path, keep: int = 2) -> None:
        self.dir = directory
        self.keep = keep

    def latest(self) -> Path | None:
        pointer = self.dir / "latest"
        if not pointer.is_file():
            return None
        step_dir = self.dir / pointer.read_text().strip()
        if not step_dir.is_dir():
            sys.exit(f"megatron_gpt: {pointer} names {step_dir.name}, which is missing; remove {pointer}")
        return step_dir

    def save(self, step: int, tp_rank: int, dp_rank: int, payload: dict[str, Any]) -> None:
        """Collective: DP rank 0 of each TP rank writes its file; then rank 0 moves ``latest``."""
        import torch
        import torch.distributed as dist

        step_dir = self.dir / f"step{step:08d}"
        if dp_rank == 0:
            step_dir.mkdir(parents=True, exist_ok=True)
            tmp = step_dir / f".tp{tp_rank}.pt.tmp"
            torch.save(payload, tmp)
            os.replace(tmp, step_dir / f"tp{tp_rank}.pt")
        dist.barrier()  # every shard of this step is written
        if dist.get_rank() == 0:
            tmp = self.dir / ".latest.tmp"
            with open(tmp, "w") as f:
                f.write(step_dir.name)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.dir / "latest")
            done = sorted(d for d in self.dir.glob("step*") if d.is_dir() and d != step_dir)
            for old in done[: max(0, len(done) - (self.keep - 1))]:
                shutil.rmtree(old, ignore_errors=True)
        dist.barrier()  # committed before anyone goes on (or exits)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world % TP:
        sys.exit(
            f"megatron_gpt: world size {world} is odd: tensor parallel {TP} x data parallel N needs "
            "an even number of processes (2, 4, ...)"
        )
    warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex are not installed.*")
    warnings.filterwarnings("ignore", category=UserWarning, module="megatron")
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    elif "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)  # a tiny model: more threads per rank only fight over the cores
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo")
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.transformer_config import TransformerConfig

    from elastrain.frameworks import megatron_cpu

    joined_s = time.time() - T_START
    rank, restart = dist.get_rank(), int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    ps.initialize_model_parallel(tensor_model_parallel_size=TP)
    megatron_cpu.install_megatron_native()  # does nothing where CUDA is available
    model_parallel_cuda_manual_seed(args.seed)
    torch.manual_seed(args.seed)  # the same master weights everywhere, split per TP rank
    tp_rank, dp_rank = ps.get_tensor_model_parallel_rank(), ps.get_data_parallel_rank()
    dp = ps.get_data_parallel_world_size()
    if args.global_batch % dp:
        sys.exit(f"megatron_gpt: --global-batch {args.global_batch} does not split over DP={dp} ranks")
    local_b = args.global_batch // dp

    cfg = TransformerConfig(
        num_layers=2, hidden_size=64, num_attention_heads=4, ffn_hidden_size=256,
        tensor_model_parallel_size=TP, use_cpu_initialization=True,
        params_dtype=torch.float32, pipeline_dtype=torch.float32,
        hidden_dropout=0.0, attention_dropout=0.0,  # no dropout: the same curve at every DP size
    )  # fmt: skip
    ddp_cfg = DistributedDataParallelConfig(overlap_grad_reduce=False, use_distributed_optimizer=False)
    opt_cfg = OptimizerConfig(
        optimizer="adam", lr=args.lr, weight_decay=0.0, clip_grad=1.0, use_distributed_optimizer=False
    )
    megatron_cpu.check_cpu_config(cfg, ddp_cfg, opt_cfg)
    gpt = GPTModel(cfg, get_gpt_layer_local_spec(), vocab_size=args.vocab, max_sequence_length=args.seq_len)
    gpt.to(device)
    model = DistributedDataParallel(config=cfg, ddp_config=ddp_cfg, module=gpt)
    cfg.finalize_model_grads_func = finalize_model_grads
    cfg.no_sync_func = model.no_sync
    opt = get_megatron_optimizer(opt_cfg, [model])
    forward_backward = get_forward_backward_func()

    shape = {"tp": TP, "global_batch": args.global_batch, "seq_len": args.seq_len, "vocab": args.vocab}
    state: dict[str, Any] = {"step": 0, "losses": [], "runs": []}
    ckpt = Checkpoints(args.checkpoint_dir) if args.checkpoint_dir else None
    saved = ckpt.latest() if ckpt else None
    if saved is not None:
        t0 = time.monotonic()
        payload = torch.load(saved / f"tp{tp_rank}.pt", map_location=device, weights_only=False)
        if payload["shape"] != shape:
            sys.exit(f"megatron_gpt: {saved} was saved with {payload['shape']}, not {shape}: use another dir")
        gpt.load_state_dict(payload["model"])
        opt.load_state_dict(payload["optimizer"])
        state = payload["state"]
        if rank == 0:
            print(
                f"resumed step={state['step']} from dp={state['runs'][-1]['dp']} to dp={dp} "
                f"load_s={time.monotonic() - t0:.2f} joined_s={joined_s:.2f} "
                f"startup_s={time.time() - T_START:.2f}",
                flush=True,
            )

    positions = torch.arange(args.seq_len, device=device).unsqueeze(0).expand(local_b, args.seq_len)
    causal = torch.ones(1, 1, args.seq_len, args.seq_len, dtype=torch.bool, device=device).triu(1)

    def forward_step(batches: Any, module: Any) -> tuple[Any, Any]:
        batch = next(batches)
        per_token = module(batch[:, :-1], positions, causal, labels=batch[:, 1:])

        def loss_func(output: Any) -> tuple[Any, dict[str, Any]]:
            loss = output.float().mean()
            return loss, {"lm loss": loss.detach()}

        return per_token, loss_func

    log = None
    if args.sample_log and tp_rank == 0:  # TP rank 1 trains on the same sequences
        args.sample_log.mkdir(parents=True, exist_ok=True)
        log = open(args.sample_log / f"samples-g{restart}-r{rank}-p{os.getpid()}.jsonl", "a")  # noqa: SIM115

    def save() -> None:
        if ckpt is not None:
            payload = {
                "model": gpt.state_dict(),
                "optimizer": opt.state_dict(),
                "state": state,
                "shape": shape,
            }
            ckpt.save(state["step"], tp_rank, dp_rank, payload)

    state["runs"].append({"restart": restart, "dp": dp, "world": dist.get_world_size(), "steps": 0})
    step_ms: list[float] = []
    dirty = False  # steps since the last save
    stopped = False  # all ranks agreed to stop (a rank signalled after the last step does not count)
    while state["step"] < args.steps:
        t0 = time.perf_counter()
        step = state["step"]
        first = step * args.global_batch + dp_rank * local_b
        ids = list(range(first, first + local_b))
        batch = torch.stack([sequence(i, args.seq_len, args.vocab) for i in ids]).to(device)
        model.zero_grad_buffer()
        opt.zero_grad()
        out = forward_backward(
            forward_step_func=forward_step, data_iterator=iter([batch]), model=[model],
            num_microbatches=1, seq_length=args.seq_len, micro_batch_size=local_b, forward_only=False,
        )  # fmt: skip
        _, grad_norm, _ = opt.step()
        # the one extra all-reduce a step: (loss sum, sequences, stop wanted) over every rank
        totals = torch.tensor(
            [float(out[0]["lm loss"]) * local_b, float(local_b), 1.0 if STOP.requested else 0.0],
            dtype=torch.float64,
            device=device,
        )
        dist.all_reduce(totals)
        loss = float(totals[0] / totals[1])  # TP ranks count twice, in both sums
        stop = bool(totals[2] > 0)
        state["step"] += 1
        state["losses"].append(loss)
        state["runs"][-1]["steps"] += 1
        dirty = True
        step_ms.append(1000 * (time.perf_counter() - t0))
        if log is not None:
            record = {"step": step, "ids": ids, "dp": dp, "dp_rank": dp_rank, "restart": restart}
            log.write(json.dumps(record) + "\n")
            log.flush()
        if rank == 0:
            if state["runs"][-1]["steps"] == 1:
                print(f"first step dp={dp} restart={restart} t={time.time():.3f}", flush=True)
            print(
                f"step {step} loss {loss:.6f} grad_norm {grad_norm:.4f} tp={TP} dp={dp} ms={step_ms[-1]:.1f}",
                flush=True,
            )
        if stop:
            stopped = STOP.requested = True
            break
        if args.step_sleep:
            time.sleep(args.step_sleep)
        while args.hold_file is not None and args.hold_file.exists() and not STOP.requested:
            time.sleep(0.05)  # every rank reads the same shared file; the others wait in the all-reduce
        if args.save_every and state["step"] % args.save_every == 0 and state["step"] < args.steps:
            save()
            dirty = False

    t_save = time.monotonic()
    if dirty:
        save()
    mean_ms = sum(step_ms) / max(1, len(step_ms))
    if stopped:
        if rank == 0:
            print(
                f"stopped (signal): step={state['step']} dp={dp} restart={restart} steps={len(step_ms)} "
                f"step_ms={mean_ms:.1f} save_s={time.monotonic() - t_save:.2f} "
                f"signal_t={STOP.received_at or 0:.3f} exit_t={time.time():.3f}",
                flush=True,
            )
        if log is not None:
            log.close()
        # every rank stops because one was signalled: wait for our own signal, so that restart mode
        # sees a script it stopped, not one that finished (exit 0 would end this slot)
        STOP.wait_for_signal(60.0)
        return STOP_EXIT_CODE

    # the replicas agree: TP-replicated weights across the TP group, every weight across DP
    def max_diff(tensor: Any, group: Any) -> float:
        parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, tensor.contiguous(), group=group)
        return max(float((p - parts[0]).abs().max()) for p in parts)

    norm = dict(gpt.named_parameters())["decoder.final_layernorm.weight"].data
    tp_diff = max_diff(norm, ps.get_tensor_model_parallel_group())
    dp_diff = max(max_diff(p.data, ps.get_data_parallel_group()) for p in gpt.parameters())
    hosts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(hosts, socket.gethostname())
    if rank == 0:
        runs = " ".join(f"dp{r['dp']}:{r['steps']}" for r in state["runs"])
        losses = state["losses"] or [float("nan")]
        print(
            f"done: steps={state['step']} tp={TP} dp={dp} step_ms={mean_ms:.1f} "
            f"tp_maxdiff={tp_diff:.1e} dp_maxdiff={dp_diff:.1e} hosts={','.join(hosts)}",
            flush=True,
        )
        print(
            f"summary: steps per start {runs}; sequences {state['step'] * args.global_batch}; "
            f"loss {losses[0]:.6f} -> {losses[-1]:.6f}",
            flush=True,
        )
    if log is not None:
        log.close()
    dist.barrier()
    ps.destroy_model_parallel()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
