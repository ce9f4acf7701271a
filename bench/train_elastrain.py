"""The benchmark MLP trained with elastrain (the pattern of examples/mnist_elastic.py).

    elastrain run --min-np 2 --max-np 3 --hostfile HOSTFILE python bench/train_elastrain.py --log-dir DIR

Appends a start-up mark at script start, after the imports, the data, the model, the optimizer,
`elastrain.init()`, each process group elastrain builds ("pg") and each entry of the training
function (state received), and one line per committed step (see workload.py). Stops at
--max-steps or at the step written to --stop-file.
"""

from __future__ import annotations

import time

T_START = time.time()

import argparse  # noqa: E402
import os  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import elastrain  # noqa: E402

T_IMPORT = time.time()

import workload  # noqa: E402


def instrument_group_build(log: workload.StepLog) -> None:
    """Log a "pg" mark whenever elastrain has built a process group (it calls init_process_group)."""
    original = dist.init_process_group

    def timed(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        log.mark("pg")
        return result

    dist.init_process_group = timed


def main() -> None:
    """Train until told to stop."""
    parser = argparse.ArgumentParser(description=__doc__)
    workload.common_args(parser)
    args = parser.parse_args()
    torch.set_num_threads(1)
    log = workload.StepLog(args.log_dir, os.environ.get("ELASTRAIN_HOST", "local"))
    log.mark("start", T_START)
    log.mark("import", T_IMPORT)
    # Everything expensive happens before the worker asks to join, as the example does.
    x, y = workload.make_data()
    log.mark("data")
    torch.manual_seed(workload.SEED)
    model = workload.build_model()
    log.mark("model")
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)  # imports torch._dynamo
    sampler = elastrain.ElasticSampler(len(y), workload.GLOBAL_BATCH, seed=workload.SEED)
    log.mark("optimizer")
    instrument_group_build(log)
    runtime = elastrain.init()
    log.mark("init")
    state = elastrain.State(model=model, optimizer=optimizer, sampler=sampler, epoch=0)
    stop = workload.StopFile(args.stop_file, args.max_steps)

    @elastrain.run
    def train(state: elastrain.State) -> None:
        generation = runtime.generation.number if runtime.generation is not None else 0
        log.mark("enter", gen=generation, step=state.step, ws=state.world_size)
        for state.epoch in range(state.epoch, 1_000_000):  # noqa: B020 (elastrain's pattern)
            sampler.set_epoch(state.epoch)
            for indices in sampler:
                if stop.should_stop(state.step):
                    return
                optimizer.zero_grad()
                loss = F.cross_entropy(model(x[indices]), y[indices])
                loss.backward()
                state.allreduce_gradients()
                optimizer.step()
                index = state.step
                try:
                    state.commit()  # raises HostsUpdatedInterrupt after committing when a resize is due
                finally:
                    log.step(index, state.world_size, state.rank, generation)

    train(state)
    log.mark("end", step=state.step)
    log.close()


if __name__ == "__main__":
    main()
