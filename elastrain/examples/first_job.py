"""A fresh cluster's first job: a small elastic classifier on synthetic data, done in about ten seconds.

    elastrain run -np 2 --hostfile /etc/mpi/hostfile python -m elastrain.examples.first_job

What the portal's job box holds on a new cluster and what `elastrain cluster create` prints as the next
step (`elastrain.examples.first_job_command`). It needs nothing but elastrain and torch: no dataset, no
download, no file written, so it runs as any tenant in every image and on the process backend. It uses
elastrain's API (`ElasticSampler`, `State`, `elastrain.run`), so the job reports its step, loss and
world size, and it grows or shrinks with the cluster like any elastic job; every sample of every epoch
is trained once. The default ``--step-sleep`` keeps it on screen long enough to watch. Exit 0 when done.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import elastrain


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command-line options (all optional)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--samples", type=int, default=2048, help="synthetic training samples")
    p.add_argument("--batch-size", type=int, default=64, help="global batch (the fixed policy)")
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--step-sleep", type=float, default=0.05, help="seconds to wait after each step")
    return p.parse_args(argv)


def make_data(
    samples: int, seed: int, features: int = 16, classes: int = 4
) -> tuple[torch.Tensor, torch.Tensor]:
    """Points labelled by a fixed random linear teacher: every rank builds the same set from the seed."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, features, generator=generator)
    teacher = torch.randn(features, classes, generator=generator)
    return x, (x @ teacher).argmax(dim=1)


def build_model(features: int = 16, classes: int = 4) -> nn.Module:
    """A two-layer MLP (about 700 parameters)."""
    return nn.Sequential(nn.Linear(features, 32), nn.ReLU(), nn.Linear(32, classes))


def main(argv: list[str] | None = None) -> None:
    """Train, print one line per epoch (rank 0), then the accuracy on the training set."""
    args = parse_args(argv)
    torch.set_num_threads(1)
    x, y = make_data(args.samples, args.seed)
    torch.manual_seed(args.seed)
    model = build_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    sampler = elastrain.ElasticSampler(len(y), args.batch_size, seed=args.seed)

    elastrain.init()
    device = elastrain.get_runtime().groups.training_device  # the worker's GPU where CUDA is, else the CPU
    model.to(device)
    x, y = x.to(device), y.to(device)
    state = elastrain.State(model=model, optimizer=optimizer, sampler=sampler, epoch=0)

    @elastrain.run
    def train(state: Any) -> None:  # the State above; `epoch=0` made `state.epoch` a counter of it
        # re-entered after every resize: it resumes from the committed epoch and sampler position
        while state.epoch < args.epochs:
            sampler.set_epoch(state.epoch)
            for indices in sampler:
                optimizer.zero_grad()
                loss = F.cross_entropy(model(x[indices]), y[indices])
                loss.backward()
                state.allreduce_gradients()
                optimizer.step()
                state.commit(loss)
                if state.rank == 0 and sampler.remaining() == 0:
                    print(
                        f"epoch {state.epoch} done: world {state.world_size}, step {state.step}, "
                        f"loss {loss.item():.4f}",
                        flush=True,
                    )
                if args.step_sleep > 0:
                    time.sleep(args.step_sleep)
            state.epoch += 1

    train(state)
    if state.rank == 0:
        with torch.no_grad():
            accuracy = (model(x).argmax(dim=1) == y).double().mean().item()
        print(f"first job done: {state.step} steps, train accuracy {accuracy:.3f}", flush=True)


if __name__ == "__main__":
    main()
