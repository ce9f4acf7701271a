"""The benchmark MLP trained the way the torchrun documentation recommends.

    torchrun --nnodes 1:3 --rdzv-backend c10d --rdzv-endpoint HOST:PORT --max-restarts 3 \
        bench/train_torchrun.py --checkpoint ckpt.pt --log-dir DIR

As in https://pytorch.org/docs/stable/elastic/train_script.html: load the checkpoint if there is one,
``init_process_group`` from the environment torchrun exports, wrap the model in DDP, train, and have
rank 0 save a checkpoint every --checkpoint-every steps (atomically: write then rename). After any
membership change or failure torchrun restarts every worker, which resumes from that checkpoint.
The global batch is 64 samples whatever the world size (each rank takes a near-equal share), the
same data order as elastrain's ElasticSampler. Logs exactly as train_elastrain.py does.
"""

from __future__ import annotations

import time

T_START = time.time()

import argparse  # noqa: E402
import os  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

T_IMPORT = time.time()

import workload  # noqa: E402


def save_checkpoint(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    """Write the checkpoint atomically so a kill mid-write never leaves a torn file."""
    tmp = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, tmp)
    os.replace(tmp, path)


def main() -> None:
    """Train until told to stop."""
    parser = argparse.ArgumentParser(description=__doc__)
    workload.common_args(parser)
    parser.add_argument("--checkpoint", type=Path, required=True, help="checkpoint file (resumed from)")
    parser.add_argument("--checkpoint-every", type=int, default=100, help="steps between checkpoints")
    args = parser.parse_args()
    torch.set_num_threads(1)
    log = workload.StepLog(args.log_dir, os.environ.get("BENCH_NODE", "local"))
    log.mark("start", T_START)
    log.mark("import", T_IMPORT)
    x, y = workload.make_data()
    log.mark("data")
    torch.manual_seed(workload.SEED)
    model = workload.build_model()
    log.mark("model")
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)  # imports torch._dynamo
    log.mark("optimizer")
    step = 0
    if args.checkpoint.exists():
        snapshot = torch.load(args.checkpoint, map_location="cpu")
        model.load_state_dict(snapshot["model"])
        optimizer.load_state_dict(snapshot["optimizer"])
        step = int(snapshot["step"])
    log.mark("checkpoint", step=step)
    dist.init_process_group("gloo")  # MASTER_ADDR, RANK, WORLD_SIZE, ... from torchrun
    rank, world = dist.get_rank(), dist.get_world_size()
    log.mark("pg")
    ddp = DistributedDataParallel(model)  # broadcasts rank 0's parameters
    generation = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    log.mark("enter", gen=generation, step=step, ws=world)
    stop = workload.StopFile(args.stop_file, args.max_steps)
    steps_per_epoch = workload.SAMPLES // workload.GLOBAL_BATCH
    lo, hi = workload.split_evenly(workload.GLOBAL_BATCH, world, rank)
    perm_epoch, perm = -1, []
    while not stop.should_stop(step):
        epoch, position = divmod(step, steps_per_epoch)
        if epoch != perm_epoch:
            perm_epoch, perm = epoch, workload.epoch_permutation(epoch)
        start = position * workload.GLOBAL_BATCH
        indices = perm[start + lo : start + hi]
        optimizer.zero_grad()
        loss = F.cross_entropy(ddp(x[indices]), y[indices])
        loss.backward()
        optimizer.step()
        step += 1
        log.step(step - 1, world, rank, generation)
        if rank == 0 and step % args.checkpoint_every == 0:
            save_checkpoint(args.checkpoint, model, optimizer, step)
    log.mark("end", step=step)
    log.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
