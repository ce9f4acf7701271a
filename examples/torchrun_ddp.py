"""A plain torchrun script (no elastrain import): DDP on MNIST-1D with a resumable snapshot.

Modelled on pytorch/examples' ``distributed/ddp-tutorial-series/multinode.py`` (BSD-3-Clause): it reads
torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT), trains with
``DistributedDataParallel`` and ``DistributedSampler``, and saves a snapshot every epoch that any
restart (torchrun's or elastrain's restart mode, at any world size) resumes from. CPU and gloo by
default; NCCL where CUDA devices are visible.

    torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint HOST:29400 \\
        torchrun_ddp.py --epochs 3 --snapshot /data/snap.pt
    elastrain run --mode restart --hostfile /etc/mpi/hostfile python torchrun_ddp.py --epochs 3
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mnist1d_data


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=100, help="per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--snapshot", default="", help="snapshot path (resumed from when it exists)")
    return p.parse_args()


def model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(40, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))


def main() -> int:
    args = parse()
    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local_rank}") if use_cuda else torch.device("cpu")
    torch.manual_seed(0)
    data = mnist1d_data.load()
    dataset = TensorDataset(torch.from_numpy(data["x"]), torch.from_numpy(data["y"]))
    net = model().to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9)
    first_epoch = 0
    if args.snapshot and Path(args.snapshot).exists():
        snap = torch.load(args.snapshot, map_location="cpu")
        net.load_state_dict(snap["model"])
        optimizer.load_state_dict(snap["optimizer"])
        first_epoch = snap["epochs_run"]
        print(f"rank {rank}: resumed from {args.snapshot} at epoch {first_epoch}", flush=True)
    ddp = DistributedDataParallel(net, device_ids=[local_rank] if use_cuda else None)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    for epoch in range(first_epoch, args.epochs):
        sampler.set_epoch(epoch)
        seen, total, start = 0, 0.0, time.monotonic()
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = F.cross_entropy(ddp(x), y)
            loss.backward()
            optimizer.step()
            seen += len(y)
            total += loss.item() * len(y)
        print(
            f"rank {rank}/{world} host {os.uname().nodename} epoch {epoch} samples {seen} "
            f"loss {total / max(seen, 1):.4f} ({time.monotonic() - start:.1f} s)",
            flush=True,
        )
        if rank == 0 and args.snapshot:
            tmp = f"{args.snapshot}.tmp"
            torch.save(
                {"model": net.state_dict(), "optimizer": optimizer.state_dict(), "epochs_run": epoch + 1}, tmp
            )
            os.replace(tmp, args.snapshot)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
