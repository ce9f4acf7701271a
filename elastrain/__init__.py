"""elastrain: elastic distributed training that resizes live, keeps data exactly-once, survives failures.

Public API (import cost is small: torch loads only when the runtime is used)::

    import elastrain
    elastrain.init()
    state = elastrain.State(model=model, optimizer=opt, sampler=sampler, epoch=0)

    @elastrain.run
    def train(state): ...

From any script (torchrun-style, Horovod-style, plain): ``elastrain.report(loss=..., step=...)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from elastrain.errors import (
    CheckpointError,
    ConfigError,
    CoordinatorGone,
    ElastrainError,
    ExitCode,
    HostfileError,
    HostsUpdatedInterrupt,
    JobFailed,
    PeerFailure,
    RendezvousError,
    WorkerExit,
    WorkerLeft,
)

if TYPE_CHECKING:
    from elastrain.reporting import report
    from elastrain.runtime.data import BatchPolicy, ElasticSampler, micro_batches
    from elastrain.runtime.loop import get_runtime, init, rank, run, world_size
    from elastrain.runtime.state import State

__version__ = "0.1.0"

_LAZY = {
    "init": "elastrain.runtime.loop",
    "run": "elastrain.runtime.loop",
    "rank": "elastrain.runtime.loop",
    "world_size": "elastrain.runtime.loop",
    "get_runtime": "elastrain.runtime.loop",
    "State": "elastrain.runtime.state",
    "ElasticSampler": "elastrain.runtime.data",
    "BatchPolicy": "elastrain.runtime.data",
    "micro_batches": "elastrain.runtime.data",
    "report": "elastrain.reporting",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'elastrain' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [
    "BatchPolicy",
    "CheckpointError",
    "ConfigError",
    "CoordinatorGone",
    "ElasticSampler",
    "ElastrainError",
    "ExitCode",
    "HostfileError",
    "HostsUpdatedInterrupt",
    "JobFailed",
    "PeerFailure",
    "RendezvousError",
    "State",
    "WorkerExit",
    "WorkerLeft",
    "get_runtime",
    "init",
    "micro_batches",
    "rank",
    "report",
    "run",
    "world_size",
]
