"""Elastic training of a small 1-D CNN on MNIST-1D (10,000 training samples), with elastrain.

    elastrain run --min-np 2 --max-np 4 --hostfile HOSTFILE python examples/mnist_elastic.py

Edit the hostfile while it runs: the job grows or shrinks without restarting its workers, and every
sample of every epoch is used exactly once. Also runs as a plain script (a world of one).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mnist1d_data

import elastrain


def build_model() -> nn.Module:
    """A 1-D CNN of about 10k parameters (reaches ~85-90% test accuracy in a few epochs)."""
    return nn.Sequential(
        nn.Unflatten(1, (1, 40)),
        nn.Conv1d(1, 32, 5, padding=2),
        nn.ReLU(),
        nn.Conv1d(32, 32, 3, padding=1, stride=2),
        nn.ReLU(),
        nn.Conv1d(32, 32, 3, padding=1, stride=2),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(320, 10),
    )


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=64, help="global batch (fixed policy)")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    p.add_argument("--optimizer", choices=["adam", "sgd"], default="adam")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds to sleep per step (slow the demo)")
    p.add_argument("--slow-while", type=Path, help="sleep --step-sleep per step only while this file exists")
    p.add_argument("--result", type=Path, help="rank 0 writes accuracy and final parameters here (JSON)")
    p.add_argument("--params-out", type=Path, help="rank 0 saves the final parameters here (torch.save)")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    dtype = getattr(torch, args.dtype)
    # Everything expensive happens before the worker joins, so a new worker is ready when admitted.
    data = mnist1d_data.load()
    x_train = torch.tensor(data["x"], dtype=dtype)
    y_train = torch.tensor(data["y"])
    torch.manual_seed(args.seed)
    model = build_model().to(dtype)
    if args.optimizer == "adam":
        optimizer: torch.optim.Optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    sampler = elastrain.ElasticSampler(len(y_train), args.batch_size, seed=args.seed)

    elastrain.init()
    device = elastrain.get_runtime().groups.training_device  # the worker's GPU where CUDA is, else the CPU
    model.to(device)  # in place: the optimizer keeps the same parameters
    print(f"worker {os.getpid()} trains on {device}", flush=True)
    x_train, y_train = x_train.to(device), y_train.to(device)
    state = elastrain.State(model=model, optimizer=optimizer, sampler=sampler, epoch=0)

    @elastrain.run
    def train(state: elastrain.State) -> None:
        # Re-entered after every resize: it resumes from the committed epoch and sampler cursor.
        while state.epoch < args.epochs:
            sampler.set_epoch(state.epoch)
            for indices in sampler:
                optimizer.zero_grad()
                loss = F.cross_entropy(model(x_train[indices]), y_train[indices])
                loss.backward()
                state.allreduce_gradients()  # sample-weighted average; also carries the resize flag
                optimizer.step()
                state.commit(loss)  # all ranks stop here together when a new generation is pending
                if state.rank == 0 and sampler.remaining() == 0:
                    print(
                        f"epoch {state.epoch} done: world {state.world_size}, step {state.step}, "
                        f"loss {loss.item():.4f}",
                        flush=True,
                    )
                if args.step_sleep and (args.slow_while is None or args.slow_while.exists()):
                    time.sleep(args.step_sleep)
            state.epoch += 1

    train(state)

    with torch.no_grad():
        x_test = torch.tensor(data["x_test"], dtype=dtype, device=device)
        y_test = torch.tensor(data["y_test"], device=device)
        accuracy = (model(x_test).argmax(1) == y_test).double().mean().item()
    if state.rank == 0:
        print(f"test_accuracy={accuracy:.4f}", flush=True)
        if args.result:
            args.result.write_text(json.dumps({"test_accuracy": accuracy, "steps": state.step}))
        if args.params_out:
            torch.save({k: v.detach().cpu().clone() for k, v in model.state_dict().items()}, args.params_out)


if __name__ == "__main__":
    main()
