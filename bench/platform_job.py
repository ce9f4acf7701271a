"""One job of `make bench-platform`: an elastic training script whose steps last what the simulator's
throughput model says they would on the current world size (see bench/platform_trace.py, "Work").

    elastrain run --min-np A --max-np B --hostfile /etc/mpi/hostfile \\
        python bench/platform_job.py --model bert --local-batch 24 --samples 4800 --step-scale 2.1

A real elastrain job (`ElasticSampler` with a per-rank batch, `State`, `elastrain.run`, a gradient
all-reduce and a commit per step): it resizes with its cluster, resumes from the committed sample
after every resize and reports its samples/s to the control plane, whose scheduler measures it. A
2-core machine cannot compute for 8 GPUs, so a step's compute is a wait: each step lasts the fitted
step time of ``--model`` on the current world size (per-rank batch ``--local-batch``) times
``--step-scale``, counting the real work of the step. One epoch over ``--samples``; exit 0 when done.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch

import elastrain
from elastrain.scheduler.fitted_params import PARAMS
from elastrain.scheduler.throughput import step_time


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options (all required but the seed)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, choices=sorted(PARAMS), help="fitted throughput model")
    p.add_argument("--local-batch", type=int, required=True, help="samples per rank per step")
    p.add_argument("--samples", type=int, required=True, help="samples to train (one epoch)")
    p.add_argument("--step-scale", type=float, required=True, help="bench seconds per model second")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Train one epoch of ``--samples`` with modelled step times."""
    args = parse_args(argv)
    torch.set_num_threads(1)
    params = PARAMS[args.model]
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    sampler = elastrain.ElasticSampler(args.samples, args.local_batch, policy="linear", shuffle=False)
    elastrain.init()
    state = elastrain.State(model=model, optimizer=optimizer, sampler=sampler, epoch=0)
    x = torch.ones(args.local_batch, 4)

    @elastrain.run
    def train(state: Any) -> None:  # re-entered after every resize, from the committed sample
        while state.epoch < 1:
            for _indices in sampler:
                start = time.monotonic()
                optimizer.zero_grad()
                model(x).square().mean().backward()
                state.allreduce_gradients()
                optimizer.step()
                lasts = step_time(params, state.world_size, params["m_ref"], 1) * args.step_scale
                left = lasts - (time.monotonic() - start)
                if left > 0:
                    time.sleep(left)
                state.commit()
            state.epoch += 1

    train(state)
    if state.rank == 0:
        print(f"platform job done: {state.step} steps, world {state.world_size}", flush=True)


if __name__ == "__main__":
    main()
